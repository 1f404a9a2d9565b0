"""Make the grok fixtures: tiny random xAI Grok-1 and Grok-2 checkpoints (remote code, no class in transformers 5.25;
keyfan/grok-1-hf's and xai-org/grok-2's tensor names), converted to GGUF by llama.cpp's own converter
(conversion/grok.py GrokModel, registered for GrokForCausalLM and Grok1ForCausalLM only: both configs here name
Grok1ForCausalLM), with two references: a torch forward of the checkpoint
written here from the architecture (float64), and llama.cpp's own logits (llama-cpp-python) on an F32 copy of each
file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_grok_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_grok_fixture.py goldens

`build` writes, under tests/data/arch/, for NAME in (grok, grok2):
  NAME.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint; every matrix drawn float16-exact, so the file
             holds exactly the weights the reference ran (norms and the router stay F32).
  NAME.npz   ids (T,), logits (T, V) float32: the torch forward below at every position; prompt (P,), greedy (N,):
             its greedy continuation; choices (L, T, K): the experts each layer chose.
  NAME.json  the config.json written, the seed, the number of distinct experts each layer used.
`goldens` adds lc_logits (T, V) (llama.cpp's logits of ids: F32 weights, F32 KV cache, no flash attention) and
lc_greedy (N,) (llama.cpp's greedy continuation of prompt).

The two checkpoints (hidden 32, 2 heads of 16 over 1 kv head, 2 layers, 4 experts top-2, vocab 320):
- grok (Grok-1, keyfan/grok-1-hf's names: transformer.in_out_embed, transformer.decoder_layer.N.{rms_norm,
  multi_head_attention.{query,key,value,linear}, rms_norm_1, rms_norm_2, router, moe.E.{linear,linear_v,linear_1},
  rms_norm_3}, transformer.rms_norm; the lm head tied to the embedding as in the release): experts of
  intermediate_size 16 (no moe_intermediate_size: llama.cpp's n_ff_exp falls back to n_ff), no final soft-cap,
  no dense MLP, a SentencePiece tokenizer.model (conversion/grok.py set_vocab: _set_vocab_sentencepiece).
- grok2 (Grok-2, xai-org/grok-2's names: model.embed_tokens, model.layers.N.{pre_attn_norm, self_attn.{q,k,v,o}_proj,
  post_attn_norm, pre_moe_norm, block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2}, mlp.{gate,up,down}_proj,
  post_moe_norm}, model.norm, lm_head): experts of moe_intermediate_size 16 beside a dense GELU MLP of
  intermediate_size 32 (residual_moe: the two summed and times 1/sqrt(2)), final_logit_softcapping, rope_type
  "original" (YaRN: the converter writes it as yarn with scaling_factor, original_max_position_embeddings,
  extrapolation_factor, attn_factor, beta_fast, beta_slow), attn_temperature_len (written; llama.cpp's graph does not
  read it), an untied lm_head, a byte-level BPE tokenizer.json plus chat_template.jinja (set_vocab: _set_vocab_gpt2).
Multipliers differ from the release's (and from 1/sqrt(head_dim)) so that each one shows: embedding_multiplier_scale,
output_multiplier_scale, attn_output_multiplier; the soft-caps are small (the release's 30 / 50 would barely touch
logits of this size).

The reference forward (reference() below), as llama.cpp's grok graph computes it (src/models/grok.cpp;
src/llama-graph.cpp build_inp_embd, build_attn_mha's LLM_ARCH_GROK branch, build_moe_ffn), on the HF tensors:
x = E[ids] * embedding_multiplier_scale; per layer: h = RMSNorm(x; pre-attn); q, k, v; rotate_half rope on the whole
head (Grok-2: YaRN's per-frequency interpolation and its 1 + 0.1 ln(factor) on cos/sin, transformers'
_compute_yarn_parameters with truncate); scores s = (q . k) * attn_output_multiplier, s = cap * tanh(s / cap), causal
softmax (no 1/sqrt(head_dim)); x += RMSNorm(W_o o; post-attn); h = RMSNorm(x; pre-moe); p = softmax(router h), the
top-2, their weights renormalized (llama.cpp's norm_w = true), each expert W_2(gelu_tanh(W_1 h) * W_3 h); Grok-2:
f = (mlp(h) + moe(h)) / sqrt(2); x += RMSNorm(f; post-moe); logits = (W_out RMSNorm(x)) * output_multiplier_scale,
then cap * tanh(logits / cap) (Grok-2). Where the released remote code differs (the router logit soft-cap, which
llama.cpp reads but never applies; the top-k renormalization; Grok-2's attention temperature beyond
attn_temperature_len positions) this follows llama.cpp, whose files minfer runs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
from fixture_ref import checkpoint_to_gguf, finish, rms_norm, routed_experts

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAMES = ("grok", "grok2")
SEED = {"grok": 100, "grok2": 106}
VOCAB, D, H, KV, LAYERS, E, K = 320, 32, 2, 1, 2, 4, 2
DH = D // H
THETA, EPS = 1e4, 1e-5
SEQ, PROMPT, NEW = 24, 6, 8


def hf_config(name: str) -> dict:
    common = {"vocab_size": VOCAB, "hidden_size": D, "num_hidden_layers": LAYERS, "num_attention_heads": H,
              "num_key_value_heads": KV, "num_local_experts": E, "num_experts_per_tok": K, "rms_norm_eps": EPS,
              "rope_theta": THETA, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "bfloat16"}
    if name == "grok":      # keyfan/grok-1-hf config.json, shrunk
        return {"architectures": ["Grok1ForCausalLM"], "model_type": "grok-1", **common,
                "intermediate_size": 16, "max_position_embeddings": 64, "attn_output_multiplier": 0.4,
                "embedding_multiplier_scale": 0.5, "output_multiplier_scale": 0.5773502691896257,
                "max_attn_value": 30.0, "attn_logit_softcapping": 4.0, "tie_word_embeddings": True}
    return {"architectures": ["Grok1ForCausalLM"], "model_type": "grok-2", **common,    # xai-org/grok-2, shrunk
            "intermediate_size": 32, "moe_intermediate_size": 16, "head_dim": DH, "max_position_embeddings": 256,
            "attn_output_multiplier": 0.3, "embedding_multiplier_scale": 5.0, "output_multiplier_scale": 0.5,
            "attn_logit_softcapping": 3.0, "router_logit_softcapping": 30.0, "final_logit_softcapping": 5.0,
            "residual_moe": True, "rope_type": "original", "scaling_factor": 4.0,
            "original_max_position_embeddings": 64, "extrapolation_factor": 1.0, "attn_factor": 1.0,
            "beta_fast": 8, "beta_slow": 1, "attn_temperature_len": 1024, "tie_word_embeddings": False}


def names(name: str) -> dict:
    """The checkpoint's tensor names (format strings of layer i, expert e)."""
    if name == "grok":
        p = "transformer.decoder_layer.{i}."
        return {"embed": "transformer.in_out_embed.weight", "norm": "transformer.rms_norm.weight", "head": None,
                "pre_attn": p + "rms_norm.weight", "q": p + "multi_head_attention.query.weight",
                "k": p + "multi_head_attention.key.weight", "v": p + "multi_head_attention.value.weight",
                "o": p + "multi_head_attention.linear.weight", "post_attn": p + "rms_norm_1.weight",
                "pre_moe": p + "rms_norm_2.weight", "router": p + "router.weight",
                "w1": p + "moe.{e}.linear.weight", "w3": p + "moe.{e}.linear_v.weight",
                "w2": p + "moe.{e}.linear_1.weight", "post_moe": p + "rms_norm_3.weight"}
    p = "model.layers.{i}."
    return {"embed": "model.embed_tokens.weight", "norm": "model.norm.weight", "head": "lm_head.weight",
            "pre_attn": p + "pre_attn_norm.weight", "q": p + "self_attn.q_proj.weight",
            "k": p + "self_attn.k_proj.weight", "v": p + "self_attn.v_proj.weight", "o": p + "self_attn.o_proj.weight",
            "post_attn": p + "post_attn_norm.weight", "pre_moe": p + "pre_moe_norm.weight",
            "router": p + "block_sparse_moe.gate.weight", "w1": p + "block_sparse_moe.experts.{e}.w1.weight",
            "w3": p + "block_sparse_moe.experts.{e}.w3.weight", "w2": p + "block_sparse_moe.experts.{e}.w2.weight",
            "post_moe": p + "post_moe_norm.weight", "mlp_gate": p + "mlp.gate_proj.weight",
            "mlp_up": p + "mlp.up_proj.weight", "mlp_down": p + "mlp.down_proj.weight"}


def weights(name: str) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in) (q, k larger, so the attention soft-cap
    bites), norm weights around 1, the router wide enough that the top-2 differ by token."""
    import torch

    c, n = hf_config(name), names(name)
    g = torch.Generator().manual_seed(SEED[name])
    fe = c.get("moe_intermediate_size") or c["intermediate_size"]

    def mat(rows, cols, s=1.5):
        return (torch.randn(rows, cols, generator=g) * (s / cols ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {n["embed"]: torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        def put(key, v, e=None):
            t[n[key].format(i=i, e=e)] = v
        put("pre_attn", norm())
        put("q", mat(H * DH, D, 4.0))
        put("k", mat(KV * DH, D, 4.0))
        put("v", mat(KV * DH, D))
        put("o", mat(D, H * DH))
        put("post_attn", norm())
        put("pre_moe", norm())
        put("router", (torch.randn(E, D, generator=g) * (3.0 / D ** 0.5)).half().float())
        for e in range(E):
            put("w1", mat(fe, D), e)
            put("w3", mat(fe, D), e)
            put("w2", mat(D, fe), e)
        if "mlp_gate" in n:
            F = c["intermediate_size"]
            put("mlp_gate", mat(F, D))
            put("mlp_up", mat(F, D))
            put("mlp_down", mat(D, F))
        put("post_moe", norm())
    t[n["norm"]] = norm()
    if n["head"]:
        t[n["head"]] = mat(VOCAB, D, 4.0)
    return t


def rope_tables(name: str, T: int):
    """(cos, sin) (T, 1, DH) float64 of rotate_half rope; Grok-2's YaRN as transformers' _compute_yarn_parameters
    (truncate: floor / ceil of the correction range) computes the inverse frequencies and the cos/sin factor."""
    import torch

    c = hf_config(name)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    mscale = 1.0
    if c.get("rope_type") in ("yarn", "original"):
        f, orig = c["scaling_factor"], c["original_max_position_embeddings"]

        def corr(rot):
            return DH * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(THETA))
        lo, hi = max(math.floor(corr(c["beta_fast"])), 0), min(math.ceil(corr(c["beta_slow"])), DH - 1)
        ramp = ((torch.arange(DH // 2, dtype=torch.float64) - lo) / (hi - lo)).clamp(0, 1)
        extra = (1 - ramp) * c["extrapolation_factor"]
        inv = inv / f * (1 - extra) + inv * extra
        mscale = 0.1 * math.log(f) + 1.0
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    ang = torch.cat([ang, ang], -1)
    return (ang.cos() * mscale)[:, None], (ang.sin() * mscale)[:, None]


def reference(name: str, t: dict, ids: list[int], record: list | None = None) -> np.ndarray:
    """The forward (module doc) in float64 -> (T, V) float32 logits; record gets each layer's expert ids."""
    import torch
    import torch.nn.functional as F

    c, n = hf_config(name), names(name)
    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    cos, sin = rope_tables(name, T)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    def rope(x):
        x1, x2 = x[..., :DH // 2], x[..., DH // 2:]
        return x * cos + torch.cat([-x2, x1], -1) * sin

    def gelu(x):
        return F.gelu(x, approximate="tanh")

    cap_a, cap_f = c["attn_logit_softcapping"], c.get("final_logit_softcapping")
    x = w[n["embed"]][torch.tensor(ids)] * c["embedding_multiplier_scale"]
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    for i in range(LAYERS):
        def W(key, e=None):
            return w[n[key].format(i=i, e=e)]
        h = rms(x, W("pre_attn"))
        q = rope((h @ W("q").T).view(T, H, DH))
        k = rope((h @ W("k").T).view(T, KV, DH)).repeat_interleave(H // KV, dim=1)
        v = (h @ W("v").T).view(T, KV, DH).repeat_interleave(H // KV, dim=1)
        s = torch.einsum("thd,shd->hts", q, k) * c["attn_output_multiplier"]
        s = cap_a * torch.tanh(s / cap_a) + mask
        o = torch.einsum("hts,shd->thd", s.softmax(-1), v).reshape(T, H * DH)
        x = x + rms(o @ W("o").T, W("post_attn"))
        h = rms(x, W("pre_moe"))
        p = (h @ W("router").T).softmax(-1)
        wt, sel = p.topk(K, dim=-1)
        wt = wt / wt.sum(-1, keepdim=True)
        if record is not None:
            record.append(sel.numpy())
        f = routed_experts(torch.zeros_like(h), h, wt, sel, E,
                           lambda e, he: (gelu(he @ W("w1", e).T) * (he @ W("w3", e).T)) @ W("w2", e).T)
        if "mlp_gate" in n:
            dense = (gelu(h @ W("mlp_gate").T) * (h @ W("mlp_up").T)) @ W("mlp_down").T
            f = (f + dense) / math.sqrt(2.0)
        x = x + rms(f, W("post_moe"))
    x = rms(x, w[n["norm"]])
    logits = (x @ w[n["head"] or n["embed"]].T) * c["output_multiplier_scale"]
    if cap_f:
        logits = cap_f * torch.tanh(logits / cap_f)
    return logits.float().numpy()


def build(name: str, llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_spm_tokenizer, make_tokenizer

    def tokenizer(d: Path) -> None:
        if name == "grok":
            make_spm_tokenizer(d)
        else:
            make_tokenizer(d)
            (d / "chat_template.jinja").write_text("{% for m in messages %}{{ m['content'] }}{% endfor %}")

    t = weights(name)
    # raw_config: transformers has no grok config class; the converter reads config.json as written
    checkpoint_to_gguf(OUT, name, llamacpp, t, {"config.json": hf_config(name)}, tokenizer,
                       keep_f32=lambda k, v: v.ndim != 2 or "router" in k or ".gate.weight" in k)
    rng = np.random.default_rng(SEED[name])
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    rec: list = []
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(name, t, ids, rec)}
    arrays["choices"] = np.stack(rec).astype(np.int8)
    used = [len(np.unique(c)) for c in arrays["choices"]]
    finish(OUT, name, arrays, {"seed": SEED[name], "torch": torch.__version__, "config": hf_config(name),
                               "experts_used_per_layer": used}, lambda x: reference(name, t, x), PROMPT, NEW,
           f", experts used {used}")


def goldens(name: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and the torch reference (needs torch, tokenizers, sentencepiece)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    b.add_argument("--only", choices=NAMES)
    g = sub.add_parser("goldens", help="llama.cpp's logits and greedy ids (needs llama-cpp-python)")
    g.add_argument("--only", choices=NAMES)
    a = ap.parse_args()
    for name in [a.only] if a.only else NAMES:
        if a.step == "build":
            build(name, a.llamacpp.resolve())
        else:
            goldens(name)


if __name__ == "__main__":
    main()
