"""The BitNet b1.58 fixtures' own steps in tools/gen_arch_fixtures.py (names "bitnet" and "bitnet-silu").

llama.cpp 0.3.36's converter (conversion/bitnet.py BitnetModel) takes BitnetForCausalLM (1bitLLM/bitnet_b1_58-*) and
BitNetForCausalLM (microsoft/bitnet-b1.58-2B-4T), but:
- its tensor map knows the sub-norms only by 1bitLLM's names (gguf-py tensor_mapping.py: ATTN_SUB_NORM
  "model.layers.{bid}.self_attn.inner_attn_ln", FFN_SUB_NORM "model.layers.{bid}.mlp.ffn_layernorm"); transformers'
  BitNetForCausalLM saves them as self_attn.attn_sub_norm / mlp.ffn_sub_norm. The saved checkpoint is renamed to
  the names the converter maps (`as_released`; the tensors are the same).
- it writes no activation key, and llama.cpp's graph (src/models/bitnet.cpp) runs LLM_FFN_SILU. Newer llama.cpp
  reads `bitnet.hidden_activation` (default silu; ggml-org/llama.cpp src/models/bitnet.cpp load_arch_hparams, the
  fix of microsoft/BitNet#602 for the 2B-4T's relu2); the "bitnet" fixture (relu2, the 2B-4T's config) has the
  converter write it (CONVERT_CODE: gguf_writer.add_hidden_act, as microsoft/BitNet PR #603 does), "bitnet-silu"
  (1bitLLM's silu) has none, as every file of that converter.
- it replaces each projection W by its ternary form round(W / s).clamp(-1, 1) * s, s = mean |W| over the tensor
  (BitnetModel.weight_quant, the 1bitLLM utils_quant.py rule; transformers' AutoBitLinear WeightQuant is the same),
  written f16. transformers' BitNetForCausalLM (no quantization_config) multiplies its float weights as they are, so
  the reference runs on the weights the file holds: `weights_as_converted` copies them from the GGUF into the
  model before the logits are taken (checking each is ternary times one scale).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

NAMES = ("bitnet", "bitnet-silu")
SUB_NORMS = {"self_attn.attn_sub_norm.": "self_attn.inner_attn_ln.", "mlp.ffn_sub_norm.": "mlp.ffn_layernorm."}
PROJ = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj"}

# run in the converter's process before convert_hf_to_gguf (gen_arch_fixtures.convert's `extra`)
CONVERT_CODE = {"bitnet": (
    "import conversion.bitnet as _bitnet\n"
    "_bn_params = _bitnet.BitnetModel.set_gguf_parameters\n"
    "def _bn_params_act(self):\n"
    "    _bn_params(self)\n"
    "    self.gguf_writer.add_hidden_act(self.hparams['hidden_act'])\n"
    "_bitnet.BitnetModel.set_gguf_parameters = _bn_params_act\n")}


def as_released(model_dir: Path, name: str) -> None:
    """The saved checkpoint with 1bitLLM's sub-norm names (in place); bitnet-silu also under 1bitLLM's class name."""
    from safetensors.torch import load_file, save_file

    for f in model_dir.glob("*.safetensors"):
        ts = load_file(f)
        out = {}
        for k, v in ts.items():
            for a, b in SUB_NORMS.items():
                k = k.replace(a, b)
            out[k] = v
        save_file(out, f, metadata={"format": "pt"})
    if name == "bitnet-silu":
        c = json.loads((model_dir / "config.json").read_text())
        (model_dir / "config.json").write_text(json.dumps({**c, "architectures": ["BitnetForCausalLM"]}))


def weights_as_converted(model, gguf_path: Path, llamacpp: Path) -> None:
    """Each q/k/v/o/gate/up/down weight of the HF model replaced by the GGUF's (the converter's ternary form)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(llamacpp / "gguf-py"))
    import gguf

    rd = gguf.GGUFReader(str(gguf_path))
    layers = model.model.layers
    n = 0
    with torch.no_grad():
        for t in rd.tensors:
            parts = t.name.split(".")
            if parts[0] != "blk" or parts[2] not in PROJ:
                continue
            w = np.asarray(t.data, dtype=np.float32)
            mags = np.unique(np.abs(w[w != 0]))
            assert len(mags) == 1, (t.name, mags[:4])           # ternary times one scale
            mod = layers[int(parts[1])]
            for attr in PROJ[parts[2]].split("."):
                mod = getattr(mod, attr)
            assert tuple(mod.weight.shape) == w.shape, (t.name, w.shape)
            mod.weight.copy_(torch.from_numpy(w))
            n += 1
    assert n == 7 * len(layers), n
