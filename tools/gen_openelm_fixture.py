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

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

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

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * wt

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)     # (T, Dh): emb = cat(freqs, freqs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]       # (T, 1, Dh)

    def rope(x):                                            # rotate_half: the two halves
        x1, x2 = x[..., :DH // 2], x[..., DH // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    x = w["transformer.token_embeddings.weight"][torch.tensor(ids)]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(LAYERS):
        p, H, KV, F = f"transformer.layers.{i}.", Q_HEADS[i], KV_HEADS[i], FFN[i]
        h = rms(x, w[p + "attn_norm.weight"])
        qkv = (h @ w[p + "attn.qkv_proj.weight"].T).reshape(T, H + 2 * KV, DH)
        q, k, v = qkv.split([H, KV, KV], dim=1)
        q, k = rms(q, w[p + "attn.q_norm.weight"]), rms(k, w[p + "attn.k_norm.weight"])   # before rope
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        s = torch.einsum("thd,shd->hts", q, k) / DH ** 0.5 + mask
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * DH)
        x = x + o @ w[p + "attn.out_proj.weight"].T
        h = rms(x, w[p + "ffn_norm.weight"])
        y = h @ w[p + "ffn.proj_1.weight"].T
        x = x + (torch.nn.functional.silu(y[:, :F]) * y[:, F:]) @ w[p + "ffn.proj_2.weight"].T
    x = rms(x, w["transformer.norm.weight"])
    return (x @ w["transformer.token_embeddings.weight"].T).float().numpy()      # tied lm head


def greedy(t: dict, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference(t, ids)[-1].argmax()))
    return ids[len(prompt):]


def build(llamacpp: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert
    from gen_internlm2_fixture import make_spm_tokenizer

    t = weights(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        (d / "config.json").write_text(json.dumps(hf_config(), indent=1))
        save_file({k: v.half().contiguous() for k, v in t.items()}, d / "model.safetensors", metadata={"format": "pt"})
        make_spm_tokenizer(d, VOCAB)
        convert(d, OUT / f"{NAME}.gguf", llamacpp, raw_config=True)   # AutoConfig knows no 'openelm'
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    prompt = ids[:PROMPT]
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = np.array(greedy(t, prompt, NEW), dtype=np.int64)
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({"seed": SEED, "torch": torch.__version__, "ffn_widths": FFN,
                                                  "config": hf_config()}, indent=1) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, FFN widths {FFN}, greedy "
          f"{arrays['greedy'].tolist()}, smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and the torch reference (needs torch, sentencepiece)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's logits and greedy ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
