"""Make the jais fixture: a tiny random Jais (v1: inceptionai Jais-13B / Jais-30B, HF JAISLMHeadModel, a remote-code
model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/jais.py JaisModel), with two references: a torch forward of the HF checkpoint written here from the
architecture (below), and llama.cpp's own logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports
minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_jais_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_jais_fixture.py goldens

`build` writes, under tests/data/arch/:
  jais.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (weights drawn float16-exact; the converter
             multiplies token_embd by embeddings_scale and output by width_scale, so those two are rounded to f16
             after the product: the reference below uses the rounded products, read back from the written file).
  jais.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,), greedy (N,):
             its greedy continuation.
  jais.json  the config.json written, the seed, and `hf_sqrt_scale_rel_err`: how far the forward with HF's
             scale_qk_dot_by_d false (1/sqrt(Dh)) would be from these logits.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention).

The architecture (HF modeling_jais.py JAISModel / JAISBlock / JAISAttention / JAISMLP / SwiGLUActivation /
AlibiPositionEmbeddingLayer / JAISLMHeadModel; conversion/jais.py; src/models/jais.cpp), as the reference computes it
on the HF tensors (GPT-2's Conv1D layout: weights (in, out), x @ W + b):
- x_0 = wte[ids] * embeddings_scale (JAISModel: no wpe with position_embedding_type "alibi"; the muP embedding scale
  on the embeddings' output).
- LayerNorm with weight and bias (ln_1, ln_2, ln_f; eps layer_norm_epsilon), pre-norm, sequential residuals.
- attn.c_attn (D, 3D) + bias, split q | k | v (JAISAttention.split(split_size)); scores q k^T / Dh (scale_attn_weights
  with scale_qk_dot_by_d: attn_scale_power 1.0, the muP 1/d; llama.cpp's graph always uses 1.0/n_embd_head);
  the causal mask (finfo.min), then the ALiBi bias - m_h |i - j| (AlibiPositionEmbeddingLayer: slopes * -1 times
  |memory - context|) added unscaled, softmax; c_proj (D, D) + bias.
- m_h: relative_pe.slopes (H, 1), HF _get_alibi_slopes (Press): for n = 2^floor(log2 H), 2^(-8/n) to the powers 1..n,
  then the even-indexed slopes of 2n heads ((2^(-4/n))^(1, 3, 5, ...)) for the rest. The converter keeps no slopes:
  it writes jais.attention.max_alibi_bias = -round(log2(slopes[0]) * n) (8 here) and llama.cpp rebuilds them.
- The MLP (activation_function "swiglu"): c_fc (D, F) + b, c_fc2 (D, F) + b, SwiGLUActivation(x1, x2) = x1 * silu(x2)
  with x1 = c_fc (up), x2 = c_fc2 (gate) (gguf-py tensor_mapping: c_fc -> ffn_up, c_fc2 -> ffn_gate); c_proj + b.
- logits = (ln_f(x) @ lm_head^T) * width_scale (JAISLMHeadModel output_logits_scale). The checkpoint's lm_head is
  its own tensor (tie_word_embeddings false here), since llama.cpp's jais loader requires output.weight.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from fixture_ref import checkpoint_to_gguf, cli, finish, rel_err

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "jais"
SEED = 2041
VOCAB, D, H, LAYERS, FFN = 320, 40, 5, 2, 80      # 5 heads: not a power of two (Jais-13B has 40, Jais-30B 56)
DH = D // H
EPS = 1e-5
EMB_SCALE, WIDTH_SCALE = 14.6, 0.111               # Jais-13B's config.json embeddings_scale / width_scale
SEQ, PROMPT, NEW = 24, 8, 16
# gen_arch_fixtures.convert's `extra` code: --no-lazy appended to the converter's own arguments
NO_LAZY = ("import argparse\n"
           "_parse = argparse.ArgumentParser.parse_args\n"
           "argparse.ArgumentParser.parse_args = lambda self, args=None, namespace=None: _parse(\n"
           "    self, (sys.argv[1:] if args is None else list(args)) + ['--no-lazy'], namespace)\n")


def hf_config() -> dict:
    return {"architectures": ["JAISLMHeadModel"], "model_type": "jais", "vocab_size": VOCAB, "n_embd": D,
            "n_head": H, "n_layer": LAYERS, "n_inner": FFN, "n_positions": 256, "layer_norm_epsilon": EPS,
            "activation_function": "swiglu", "position_embedding_type": "alibi", "embeddings_scale": EMB_SCALE,
            "width_scale": WIDTH_SCALE, "scale_attn_weights": True, "scale_qk_dot_by_d": True,
            "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}


def hf_slopes(n_head: int) -> list[float]:
    """HF modeling_jais AlibiPositionEmbeddingLayer._get_alibi_slopes (Press's recursion), as written there."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(n_head).is_integer():
        return power_of_2(n_head)
    closest = 2 ** math.floor(math.log2(n_head))
    return power_of_2(closest) + hf_slopes(2 * closest)[0::2][:n_head - closest]


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32 (Conv1D matrices (in, out)): matrices ~ N(0, 1.5 / fan_in), biases
    ~ N(0, 0.1), norm weights around 1; wte ~ N(0, 0.05) (times embeddings_scale 14.6 at the input); lm_head ~ N(0, 4)
    (times width_scale 0.111)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(i, o):
        return (torch.randn(i, o, generator=g) * (1.5 / i ** 0.5)).half().float()

    def vec(n, mean=0.0, std=0.1):
        return (mean + std * torch.randn(n, generator=g)).half().float()

    t = {"transformer.wte.weight": (0.05 * torch.randn(VOCAB, D, generator=g)).half().float(),
         "transformer.relative_pe.slopes": torch.tensor(hf_slopes(H)).unsqueeze(-1)}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = vec(D, 1.0, 0.3), vec(D)
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = mat(D, 3 * D), vec(3 * D)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = mat(D, D), vec(D)
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = vec(D, 1.0, 0.3), vec(D)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = mat(D, FFN), vec(FFN)
        t[p + "mlp.c_fc2.weight"], t[p + "mlp.c_fc2.bias"] = mat(D, FFN), vec(FFN)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = mat(FFN, D), vec(D)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = vec(D, 1.0, 0.3), vec(D)
    t["lm_head.weight"] = (4.0 * torch.randn(VOCAB, D, generator=g)).half().float()
    return t


def reference(t: dict, ids: list[int], emb: np.ndarray, head: np.ndarray, qk_power: float = 1.0) -> np.ndarray:
    """Jais's forward on the HF tensors, float64 -> (T, V) float32 logits. emb / head: wte * embeddings_scale and
    lm_head * width_scale as the GGUF stores them (the f16-rounded products; the scales' places in HF's forward).
    qk_power: the scores' 1 / Dh^qk_power (1.0: scale_qk_dot_by_d; 0.5: GPT-2's)."""
    import torch
    import torch.nn.functional as F

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def ln(x, name):
        return F.layer_norm(x, (D,), w[name + ".weight"], w[name + ".bias"], EPS)

    pos = torch.arange(T)
    causal = pos[None, :] <= pos[:, None]                                         # key j visible to query i
    slopes = w["transformer.relative_pe.slopes"]                                  # (H, 1)
    alibi = (slopes * -1.0).unsqueeze(1) * (pos[None, :] - pos[:, None]).abs()[None].double()   # (H, T, T)
    x = torch.from_numpy(emb).double()[torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        q, k, v = (h @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]).split(D, dim=-1)
        q, k, v = (z.reshape(T, H, DH).transpose(0, 1) for z in (q, k, v))       # (H, T, Dh)
        s = (q @ k.transpose(-1, -2)) / DH ** qk_power
        s = torch.where(causal, s, torch.finfo(s.dtype).min) + alibi
        o = (s.softmax(-1) @ v).transpose(0, 1).reshape(T, D)
        x = x + o @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = ln(x, p + "ln_2")
        up = h @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        gate = h @ w[p + "mlp.c_fc2.weight"] + w[p + "mlp.c_fc2.bias"]
        x = x + (up * F.silu(gate)) @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = ln(x, "transformer.ln_f")
    return (x @ torch.from_numpy(head).double().T).float().numpy()


def scaled_from_file(path: Path, t: dict, llamacpp: Path) -> tuple[np.ndarray, np.ndarray, float]:
    """token_embd and output as the converter wrote them (checked to be the HF tensors times the scales within
    f16 rounding), and the file's max_alibi_bias (read with llama.cpp's own gguf-py)."""
    sys.path.insert(0, str(llamacpp / "gguf-py"))
    from gguf import GGUFReader

    rd = GGUFReader(str(path))
    got = {x.name: np.asarray(x.data, dtype=np.float32).reshape(VOCAB, D) for x in rd.tensors
           if x.name in ("token_embd.weight", "output.weight")}
    emb, head = got["token_embd.weight"], got["output.weight"]
    for a, b in ((emb, t["transformer.wte.weight"].numpy() * EMB_SCALE),
                 (head, t["lm_head.weight"].numpy() * WIDTH_SCALE)):
        assert np.abs(a - b).max() <= 1e-3 * np.abs(b).max(), "the converter's muP scaling changed"
    return emb, head, float(rd.fields[f"{NAME}.attention.max_alibi_bias"].contents())


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    # make_tokenizer: byte-level BPE; convert() patches the pre-tokenizer hash to 'gpt-2'.
    # AutoConfig knows no 'jais' (raw_config); --no-lazy: JaisModel.modify_tensors reads relative_pe.slopes[0]
    # with .item(), which the converter's default lazy (meta) tensors refuse ("Tensor.item() cannot be called
    # on meta tensors"), so a Jais checkpoint converts only eagerly
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer,
                       keep_f32=lambda k, v: k.endswith("slopes"), extra=NO_LAZY)
    emb, head, max_bias = scaled_from_file(OUT / f"{NAME}.gguf", t, llamacpp)
    assert max_bias == 8.0, max_bias
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids, emb, head)}
    sq_err = rel_err(reference(t, ids, emb, head, qk_power=0.5), arrays["logits"])
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "max_alibi_bias": max_bias, "hf_sqrt_scale_rel_err": round(sq_err, 4)},
           lambda x: reference(t, x, emb, head), PROMPT, NEW, f"; 1/sqrt(Dh) would be {sq_err:.3g} (max rel) off")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
