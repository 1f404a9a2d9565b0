"""Make the openelm fixture: a tiny random OpenELM (OpenELMForCausalLM, Apple's OpenELM-270M / 450M / 1_1B / 3B, a
remote-code model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/openelm.py OpenELMModel), with two references: a float64 torch forward of the HF checkpoint written here
from the architecture (below), and llama.cpp's own logits (llama-cpp-python) on an F32 copy of the file. Nothing here
imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_openelm_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_openelm_fixture.py goldens

`build` writes, under tests/data/arch/:
  openelm.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (weights drawn float16-exact).
  openelm.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,),
                greedy (N,): its greedy continuation.
  openelm.json  the config.json written, the per-layer widths, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention).

The architecture, as the reference computes it on the HF tensors (OpenELM's modeling_openelm.py, as the converter
and src/models/openelm.cpp read it):
- Per layer l its own query heads H_l = num_query_heads[l] and kv heads Hkv_l = num_kv_heads[l] (config.json
  carries both lists, as the releases' files do; the converter writes them as the head_count / head_count_kv
  arrays), and its own FFN width F_l = make_divisible(ffn_multipliers[l] * model_dim, ffn_dim_divisor)
  (conversion/openelm.py OpenELMModel._make_divisible, HF configuration_openelm.make_divisible: round to the nearest
  multiple, at least the divisor, plus one divisor when that lost more than 10%); written as the
  feed_forward_length array. The fixture's layers: heads 4 / 6 / 8 over kv 2 / 3 / 4 (GQA 2:1 everywhere, as the
  releases' 4:1; the largest head count, 8, is not a multiple of every kv count, as 20 and 3 in OpenELM-270M),
  FFN multipliers 0.5 / 2.25 / 4.0 -> 16 / 80 / 128 (72 rounds up to 80).
- RMSNorm pre-norms attn_norm / ffn_norm, eps 1e-6 (OpenELMRMSNorm's default; the converter writes 1e-6).
- attention: one fused qkv_proj (no bias) of (H_l + 2 Hkv_l) heads of head_dim rows, split by heads into q (the
  first H_l), k (the next Hkv_l), v (the last Hkv_l) (openelm.cpp: the three ggml_view_3d offsets); per-head
  RMSNorm of q and k with q_norm / k_norm (head_dim,) BEFORE rope (normalize_qk_projections); NEOX rope (rotate_half,
  llama_model_rope_type: OPENELM -> NEOX) over the whole head, base rope_freq_constant; k and v heads repeated
  (repeat_interleave: kv head j serves query heads j*g .. j*g+g-1); softmax(q k / sqrt(head_dim)); out_proj (no bias).
- FFN: proj_1 (2 F_l, D) whose first F_l rows are the gate and the rest the up projection (ffn_with_glu: y_1, y_2 =
  chunk(2); silu(y_1) * y_2; the converter splits it the same way into ffn_gate / ffn_up), proj_2 (D, F_l).
- final RMSNorm `transformer.norm`; the lm head is the token embedding (share_input_output_layers; llama.cpp's
  loader makes output from token_embd, TENSOR_DUPLICATED, and creates no output tensor of its own).
- The tokenizer: conversion/openelm.py set_vocab takes a SentencePiece tokenizer.model (else llama.cpp's built-in
  llama-spm vocab of 32000): a tiny one, gen_internlm2_fixture.make_spm_tokenizer.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "openelm"
SEED = 3037
VOCAB, D, DH = 320, 32, 8
Q_HEADS, KV_HEADS = [4, 6, 8], [2, 3, 4]
FFN_MULT, FFN_DIV = [0.5, 2.25, 4.0], 16
LAYERS = len(Q_HEADS)
THETA, EPS = 1e4, 1e-6
SEQ, PROMPT, NEW = 32, 8, 12


def make_divisible(v: float, divisor: int) -> int:
    """HF configuration_openelm.make_divisible (min_value None), which the converter copies."""
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


FFN = [make_divisible(m * D, FFN_DIV) for m in FFN_MULT]


def hf_config() -> dict:
    return {"architectures": ["OpenELMForCausalLM"], "model_type": "openelm", "vocab_size": VOCAB, "model_dim": D,
            "head_dim": DH, "num_transformer_layers": LAYERS, "num_query_heads": Q_HEADS, "num_kv_heads": KV_HEADS,
            "num_gqa_groups": 2, "ffn_multipliers": FFN_MULT, "ffn_dim_divisor": FFN_DIV, "ffn_with_glu": True,
            "activation_fn_name": "swish", "normalize_qk_projections": True, "share_input_output_layers": True,
            "rope_freq_constant": int(THETA), "rope_max_length": 256, "max_context_length": 256,
            "qkv_multipliers": [0.5, 1.0], "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1; the embedding
    (also the lm head) ~ N(0, 0.09), small beside the layers, so the tied head does not just echo the last token."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    t = {"transformer.token_embeddings.weight": (0.3 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p, H, KV, F = f"transformer.layers.{i}.", Q_HEADS[i], KV_HEADS[i], FFN[i]
        t[p + "attn_norm.weight"] = norm()
        t[p + "attn.qkv_proj.weight"] = mat((H + 2 * KV) * DH, D)
        t[p + "attn.q_norm.weight"] = norm(DH)
        t[p + "attn.k_norm.weight"] = norm(DH)
        t[p + "attn.out_proj.weight"] = mat(D, H * DH)
        t[p + "ffn_norm.weight"] = norm()
        t[p + "ffn.proj_1.weight"] = mat(2 * F, D)
        t[p + "ffn.proj_2.weight"] = mat(D, F)
    t["transformer.norm.weight"] = norm()
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """OpenELM's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    rope = neox_rope(T, DH, THETA)                          # rotate_half: the two halves
    x = w["transformer.token_embeddings.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p, H, KV, F = f"transformer.layers.{i}.", Q_HEADS[i], KV_HEADS[i], FFN[i]
        h = rms_norm(x, w[p + "attn_norm.weight"], EPS)
        qkv = (h @ w[p + "attn.qkv_proj.weight"].T).reshape(T, H + 2 * KV, DH)
        q, k, v = qkv.split([H, KV, KV], dim=1)
        q = rms_norm(q, w[p + "attn.q_norm.weight"], EPS)       # the per-head q / k norms, before rope
        k = rms_norm(k, w[p + "attn.k_norm.weight"], EPS)
        x = x + causal_attention(rope(q), rope(k), v) @ w[p + "attn.out_proj.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], EPS)
        y = h @ w[p + "ffn.proj_1.weight"].T
        x = x + (torch.nn.functional.silu(y[:, :F]) * y[:, F:]) @ w[p + "ffn.proj_2.weight"].T
    x = rms_norm(x, w["transformer.norm.weight"], EPS)
    return (x @ w["transformer.token_embeddings.weight"].T).float().numpy()      # tied lm head


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, lambda d: make_spm_tokenizer(d, VOCAB))
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "ffn_widths": FFN, "config": hf_config()},
           lambda x: reference(t, x), PROMPT, NEW, note=f", FFN widths {FFN}")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece")
