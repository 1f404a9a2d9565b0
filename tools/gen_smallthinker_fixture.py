"""Make the smallthinker fixture: a tiny random SmallThinker (SmallThinkerForCausalLM, PowerInfer's remote-code MoE
with no class in transformers 5.25) checkpoint in the released Hugging Face layout, converted to GGUF by llama.cpp's
own converter (conversion/smallthinker.py SmallThinkerModel), with two references: a torch forward of the HF
checkpoint written here from the SmallThinker architecture (nothing here imports minfer), and llama.cpp's own logits
(llama-cpp-python) on an F32 copy of the file.

    /work/tfvenv/bin/python tools/gen_smallthinker_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_smallthinker_fixture.py goldens

`build` writes, under tests/data/arch/:
  smallthinker.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight float16-exact.
  smallthinker.npz   ids (24,), logits (24, V) float32: the torch forward below (float64) at every position (the
                     layout every fixture has); ids_long (T,) int16, T = 4096 + 128 (past the 4096-token window),
                     of which ids is the start; rows_long (24,): its last 24 positions; logits_long (24, V): the
                     forward of ids_long at rows_long; prompt (P,), greedy (N,): the greedy continuation of ids[:P].
  smallthinker.json  config.json, the seed.
`goldens` adds lc_logits (24, V) and lc_logits_long (24, V) (llama.cpp's logits of ids_long at its first 24 positions
and at rows_long: F32 weights and KV cache, no flash attention) and lc_greedy (N,).

The checkpoint (PowerInfer/SmallThinker-21BA3B's layout, shrunk): hidden 32, 2 query heads of 16 over 1 kv head (GQA),
3 layers, 8 experts of width 32, 2 active, moe_primary_router_apply_softmax false (sigmoid gating: the released
configs' default), sliding_window_layout [0, 1, 1] and rope_layout [0, 1, 1], sliding_window_size 4096, tied
embeddings. The layouts are the ones llama.cpp's graph assumes: the converter writes only the window size (when any
layout entry is set) and src/models/smallthinker.cpp then fixes n_swa = 4096, the pattern "every 4th layer global,
first layer global" (load_swa_pattern(ml, 4, true)) and NoPE on il % 4 == 0 (n_no_rope_layer_step's default 4).

The reference forward (reference() below), as modeling_smallthinker.py computes it:
    x = E[ids]
    per layer: r = x (the router's input: the layer's input, before its norm and attention)
               x = x + W_o attn(rope?(W_q n(x)), rope?(W_k n(x)), W_v n(x))   n = RMSNorm(input_layernorm)
                   rope (rotate_half, base rope_theta) where rope_layout, a key window of 4096 where
                   sliding_window_layout (a query at p sees p - 4096 < j <= p)
               l = W_router r; top-2 of l; w = sigmoid(l_top) / sum(sigmoid(l_top))
               x = x + sum_k w_k down_k(relu(gate_k h) * up_k h)                h = RMSNorm(post_attention_layernorm)(x)
    logits = E RMSNorm(x; norm)
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
NAME = "smallthinker"
SEED = 4096
VOCAB, D, H, KV, DH, LAYERS, E, K, FE = 320, 32, 2, 1, 16, 3, 8, 2, 32
THETA, EPS, WINDOW = 10000.0, 1e-6, 4096
SWA = [0, 1, 1]
ROPE = [0, 1, 1]
T_LONG, KEEP, PROMPT, NEW = WINDOW + 128, 24, 8, 12


def hf_config() -> dict:
    return {"architectures": ["SmallThinkerForCausalLM"], "model_type": "smallthinker", "vocab_size": VOCAB,
            "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": H, "num_key_value_heads": KV,
            "head_dim": DH, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
            "rope_layout": ROPE, "sliding_window_layout": SWA, "sliding_window_size": WINDOW,
            "max_position_embeddings": 8192, "moe_num_primary_experts": E, "moe_num_active_primary_experts": K,
            "moe_ffn_hidden_size": FE, "moe_primary_router_apply_softmax": False, "norm_topk_prob": True,
            "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "initializer_range": 0.02, "torch_dtype": "float16", "use_cache": True}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32 (matrices ~ N(0, 1.5 / fan_in), norms around 1; the router larger so the
    top-2 choice and the sigmoid weights vary from token to token)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i, s=1.5):
        return (torch.randn(o, i, generator=g) * (s / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.embed_tokens.weight": torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D, 3.0)
        t[p + "self_attn.k_proj.weight"] = mat(KV * DH, D, 3.0)
        t[p + "self_attn.v_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "block_sparse_moe.primary_router.weight"] = mat(E, D, 0.5)
        for e in range(E):
            q = f"{p}block_sparse_moe.experts.{e}."
            t[q + "gate.weight"] = mat(FE, D)
            t[q + "up.weight"] = mat(FE, D)
            t[q + "down.weight"] = mat(D, FE)
    t["model.norm.weight"] = norm()
    return t


def reference(t: dict, ids: list[int], rows=None) -> np.ndarray:
    """SmallThinker's forward on the HF tensors, float64 -> (len(rows), V) float32 logits (rows None: all)."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * wt

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)          # (T, Dh): HF's emb = cat(freqs, freqs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(x):                                                  # rotate_half over each head's two halves
        x1, x2 = x[..., :DH // 2], x[..., DH // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    j = torch.arange(T)
    causal = j[None, :] <= j[:, None]
    local = causal & (j[None, :] > j[:, None] - WINDOW)
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        r = x                                                     # the router reads the layer's input
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(T, H, DH)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(T, KV, DH)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(T, KV, DH)
        if ROPE[i]:
            q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        m = local if SWA[i] else causal
        o = torch.empty(T, H, DH, dtype=torch.float64)
        for hd in range(H):                                       # a head at a time (T x T scores)
            s = (q[:, hd] @ k[:, hd].T) / DH ** 0.5
            o[:, hd] = s.masked_fill(~m, float("-inf")).softmax(-1) @ v[:, hd]
        x = x + o.reshape(T, H * DH) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        logits = r @ w[p + "block_sparse_moe.primary_router.weight"].T                  # (T, E)
        top, sel = torch.topk(logits, K, dim=-1)
        wt = torch.sigmoid(top)
        wt = wt / wt.sum(-1, keepdim=True)
        f = torch.zeros_like(x)
        for e in range(E):
            q_ = f"{p}block_sparse_moe.experts.{e}."
            tok, slot = torch.where(sel == e)
            if len(tok):
                a = torch.relu(h[tok] @ w[q_ + "gate.weight"].T) * (h[tok] @ w[q_ + "up.weight"].T)
                f.index_add_(0, tok, (a @ w[q_ + "down.weight"].T) * wt[tok, slot, None])
        x = x + f
    x = rms(x, w["model.norm.weight"])
    if rows is not None:
        x = x[torch.as_tensor(rows)]
    return (x @ w["model.embed_tokens.weight"].T).float().numpy()


def greedy(t: dict, prompt: list[int], n: int) -> list[int]:
    ids = list(prompt)
    for _ in range(n):
        ids.append(int(reference(t, ids, [len(ids) - 1])[-1].argmax()))
    return ids[len(prompt):]


def build(llamacpp: Path) -> None:
    import torch
    from safetensors.torch import save_file

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, make_tokenizer

    t = weights(SEED)
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        d.mkdir()
        (d / "config.json").write_text(json.dumps(hf_config(), indent=1))
        save_file({k: v.half().contiguous() for k, v in t.items()}, d / "model.safetensors", metadata={"format": "pt"})
        make_tokenizer(d)
        # raw_config: AutoConfig knows no smallthinker without remote code; the converter reads config.json itself
        convert(d, OUT / f"{NAME}.gguf", llamacpp, raw_config=True)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=T_LONG).tolist()
    rows = list(range(KEEP)) + list(range(T_LONG - KEEP, T_LONG))
    lg = reference(t, ids, rows)
    arrays = {"ids": np.array(ids[:KEEP], dtype=np.int64), "logits": lg[:KEEP],
              "ids_long": np.array(ids, dtype=np.int16), "rows_long": np.array(rows[KEEP:], dtype=np.int16),
              "logits_long": lg[KEEP:]}
    prompt = ids[:PROMPT]
    arrays["prompt"] = np.array(prompt, dtype=np.int64)
    arrays["greedy"] = np.array(greedy(t, prompt, NEW), dtype=np.int64)
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({"seed": SEED, "torch": torch.__version__, "config": hf_config()},
                                                 indent=1) + "\n")
    top2 = np.sort(arrays["logits"], axis=-1)[:, -2:]
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, greedy {arrays['greedy'].tolist()}, "
          f"smallest top-1/top-2 gap {float((top2[:, 1] - top2[:, 0]).min()):.3g}")


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy

    path = OUT / f"{NAME}.npz"
    arrays = dict(np.load(path))
    ids, rows = arrays["ids_long"].astype(np.int64).tolist(), arrays["rows_long"].astype(np.int64)
    prompt = arrays["prompt"].tolist()
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        f32_copy(OUT / f"{NAME}.gguf", f32)
        llm = llama_cpp.Llama(str(f32), n_ctx=T_LONG + 64, n_batch=512, n_ubatch=512, logits_all=True, n_threads=4,
                              flash_attn=False, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32,
                              verbose=False)
        llm.eval(ids)
        scores = np.array(llm.scores[:len(ids)], dtype=np.float32)
        arrays["lc_logits"], arrays["lc_logits_long"] = scores[:KEEP], scores[rows]
        llm.reset()
        llm.eval(prompt)
        out = []
        for _ in range(len(arrays["greedy"])):
            out.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([out[-1]])
        arrays["lc_greedy"] = np.array(out, dtype=np.int64)
        del llm
    np.savez_compressed(path, **arrays)
    meta = json.loads((OUT / f"{NAME}.json").read_text())
    meta["llama_cpp"] = llama_cpp.__version__
    (OUT / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    for key in ("logits", "logits_long"):
        err = float((np.abs(arrays["lc_" + key] - arrays[key]).max(-1) / np.abs(arrays[key]).max(-1)).max())
        print(f"llama.cpp vs the torch reference, {key}: max rel err {err:.2e}")
    print(f"greedy {arrays['lc_greedy'].tolist()} (reference's {arrays['greedy'].tolist()})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and the torch reference (needs torch, tokenizers, transformers)")
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
