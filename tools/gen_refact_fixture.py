"""Make the refact fixture: a tiny random Refact (GPTRefactForCausalLM, smallcloudai/Refact-1_6B-fim's architecture, a
remote-code model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/refact.py RefactModel), with two references: a torch forward of the HF checkpoint written here from the
architecture (below), and llama.cpp's own logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports
minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_refact_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_refact_fixture.py goldens

`build` writes, under tests/data/arch/:
  refact.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (weights drawn float16-exact).
  refact.npz   ids (T,), logits (T, V): the torch forward below (float64, llama.cpp's RMSNorm rule) at every
               position; prompt (P,), greedy (N,): its greedy continuation.
  refact.json  the config.json written, the seed, and `hf_layernorm_rel_err`: how far HF's own forward (its
               LayerNormNoBias, mean removed) is from these logits (see "The norms" below).
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention).

The architecture (HF modeling_gpt_refact.py GPTRefactModel / GPTRefactBlock / Attention / MLP / _get_slopes /
get_alibi_biases; conversion/refact.py; src/models/refact.cpp), as the reference computes it on the HF tensors:
- No position embeddings and no rope: each head's scores q k^T / sqrt(Dh) get HF's ALiBi term m_h (j + 1) added
  (get_alibi_biases: the causal mask's cumsum, so per query row a constant apart from -m_h (p - j)), unscaled;
  the future masked (masked_fill -10000, softmax in the model's dtype: float64 here). m_h from HF _get_slopes: for
  n = 2^floor(log2 H), m0 = 2^(-8/n), heads 0..n-1 take m0^(h+1); extra heads take (2^(-4/n))^(1, 3, 5, ...).
- Multi-query attention: q (D, D), one kv head from attn.kv (2 Dh, D), rows k then v (the converter splits it
  so: data[:head_dim] -> attn_k, the rest -> attn_v); c_proj without bias.
- The MLP: gate_up_proj (2F, D), rows gate then up (the converter: data[:ff_dim] -> ffn_gate), silu(gate) * up,
  c_proj (D, F); F = 256 * ceil(int(2 * 4D / 3) / 256) (HF MLP multiple_of 256; the converter's ff_dim formula).
- The norms: HF uses LayerNormNoBias (F.layer_norm with weight, no bias: the mean removed) for ln_1, ln_2 and
  ln_f; llama.cpp's refact graph builds all three with LLM_NORM_RMS (refact.cpp build_norm(..., LLM_NORM_RMS)),
  eps from config.layer_norm_epsilon (the converter writes it as layer_norm_rms_epsilon). The reference's
  `logits` take llama.cpp's rule (RMSNorm times the weight), as minfer does (the GGUF's engine; phimoe's precedent);
  HF's LayerNorm forward is computed too and its distance recorded in refact.json only.
- The lm head tied to the embedding (tie_word_embeddings, no lm_head tensor: llama.cpp's loader falls back to
  token_embd).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
from fixture_ref import checkpoint_to_gguf, cli, finish, rel_err

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "refact"
SEED = 2035
VOCAB, D, H, LAYERS = 320, 32, 4, 2
DH = D // H
FFN = 256 * ((int(2 * (4 * D) / 3) + 255) // 256)       # HF MLP / conversion/refact.py ff_dim: 256 here
EPS = 1e-5
SEQ, PROMPT, NEW = 24, 8, 16


def hf_config() -> dict:
    return {"architectures": ["GPTRefactForCausalLM"], "model_type": "gpt_refact", "vocab_size": VOCAB,
            "n_embd": D, "n_head": H, "n_layer": LAYERS, "n_positions": 256, "n_inner": None,
            "layer_norm_epsilon": EPS, "multi_query": True, "attention_softmax_in_fp32": True,
            "scale_attention_softmax_in_fp32": True, "tie_word_embeddings": True, "bos_token_id": 1,
            "eos_token_id": 2, "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1; the embedding
    (also the lm head) ~ N(0, 0.09): small beside the layers, so the tied head does not just echo the last token."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    t = {"transformer.wte.weight": (0.3 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"] = norm()
        t[p + "attn.q.weight"] = mat(D, D)
        t[p + "attn.kv.weight"] = mat(2 * DH, D)
        t[p + "attn.c_proj.weight"] = mat(D, D)
        t[p + "ln_2.weight"] = norm()
        t[p + "mlp.gate_up_proj.weight"] = mat(2 * FFN, D)
        t[p + "mlp.c_proj.weight"] = mat(D, FFN)
    t["ln_f.weight"] = norm()
    return t


def hf_slopes(n_head: int):
    """HF modeling_gpt_refact _get_slopes, float64."""
    import torch

    n = 2 ** math.floor(math.log2(n_head))
    m = torch.pow(torch.tensor(2.0 ** (-8.0 / n), dtype=torch.float64), torch.arange(1, 1 + n))
    if n < n_head:
        m_hat = torch.pow(torch.tensor(2.0 ** (-4.0 / n), dtype=torch.float64),
                          torch.arange(1, 1 + 2 * (n_head - n), 2))
        m = torch.cat([m, m_hat])
    return m


def reference(t: dict, ids: list[int], norm: str = "rms") -> np.ndarray:
    """Refact's forward on the HF tensors, float64 -> (T, V) float32 logits. norm "rms": llama.cpp's RMSNorm
    (refact.cpp LLM_NORM_RMS); "layer": HF's LayerNormNoBias (mean removed)."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def n(x, wt):
        if norm == "layer":
            x = x - x.mean(-1, keepdim=True)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * wt

    causal = torch.ones(T, T, dtype=torch.bool).tril()                      # key j visible to query i: j <= i
    alibi = hf_slopes(H)[:, None, None] * causal.long().cumsum(-1)[None].double()   # (H, T, T): m_h (j + 1)
    x = w["transformer.wte.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        h = n(x, w[p + "ln_1.weight"])
        q = (h @ w[p + "attn.q.weight"].T).reshape(T, H, DH)
        k, v = (h @ w[p + "attn.kv.weight"].T).split(DH, dim=-1)            # (T, Dh) each: the one kv head
        s = alibi + torch.einsum("thd,sd->hts", q * DH ** -0.5, k)
        s = s.masked_fill(~causal, -10000.0)
        o = torch.einsum("hts,sd->thd", s.softmax(-1), v).reshape(T, D)
        x = x + o @ w[p + "attn.c_proj.weight"].T
        h = n(x, w[p + "ln_2.weight"])
        gate, up = (h @ w[p + "mlp.gate_up_proj.weight"].T).split(FFN, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.c_proj.weight"].T
    x = n(x, w["ln_f.weight"])
    return (x @ w["transformer.wte.weight"].T).float().numpy()      # tied lm head


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    ln_err = rel_err(reference(t, ids, norm="layer"), arrays["logits"])
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(), "ffn": FFN,
                               "hf_layernorm_rel_err": round(ln_err, 4)}, lambda x: reference(t, x), PROMPT, NEW,
           note=f"; HF's LayerNorm forward is {ln_err:.3g} (max rel) from llama.cpp's RMSNorm rule")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
