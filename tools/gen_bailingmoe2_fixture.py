"""Make the bailingmoe2 fixture: a tiny random Ling 2.0 (inclusionAI Ling-mini-2.0 / Ling-flash-2.0 / Ring-mini-2.0:
BailingMoeV2ForCausalLM, remote code with no class in transformers 5.25) checkpoint in the released Hugging Face layout,
converted to GGUF by llama.cpp's own converter (conversion/bailingmoe.py BailingMoeV2Model), with two references: a
torch forward of the HF checkpoint written here from the architecture, and llama.cpp's own logits (llama-cpp-python)
on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_bailingmoe2_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_bailingmoe2_fixture.py goldens

`build` writes, under tests/data/arch/:
  bailingmoe2.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every matrix drawn float16-exact, so
                    the file holds exactly the weights the reference ran (norms, router and expert bias stay F32).
  bailingmoe2.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
                    greedy (N,): its greedy continuation; choices (L_moe, T, K): the experts each MoE layer chose.
  bailingmoe2.json  the config.json written, the seed, how often each routing rule changed a choice.
`goldens` adds to bailingmoe2.npz lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention), lc_greedy (N,): llama.cpp's greedy continuation of prompt.

The checkpoint (Ling-mini-2.0's config.json, shrunk): hidden 32, 2 heads of 16 over 1 kv head (H * head_dim =
hidden, as llama.cpp's loader requires: wqkv {n_embd, n_embd + 2 n_embd_gqa}), 3 layers with first_k_dense_replace 1
(layer 0 a dense SwiGLU MLP of intermediate_size 64, layers 1-2 MoE), 8 experts of moe_intermediate_size 32 (a
multiple of 16: the CUDA expert decoder's F16 rule), num_experts_per_tok 4, n_group 4, topk_group 3 (6 eligible
experts, 4 chosen: both the group mask and the choice inside the groups act), one shared expert (width 32),
score_function sigmoid, moe_router_enable_expert_bias, routed_scaling_factor 2.5, norm_topk_prob true, use_qk_norm,
partial_rotary_factor 0.5 (8 of 16 dims rotated), rope_theta 6e5, untied lm_head, vocab 320 (the tiny byte-level BPE
of tools/gen_arch_fixtures.py). Tensor names as released: model.word_embeddings, model.layers.N.input_layernorm,
attention.query_key_value (rows q, then k, then v), attention.query_layernorm / key_layernorm (head_dim),
attention.dense, post_attention_layernorm, mlp.{gate,up,down}_proj (dense), mlp.gate.weight (router) and
mlp.gate.expert_bias, mlp.experts.E.{gate,up,down}_proj, mlp.shared_experts.{gate,up,down}_proj, model.norm,
lm_head.

The reference forward (reference() below) is the architecture as modeling_bailing_moe_v2.py computes it, on the HF
tensors: RMSNorm; q, k, v split from query_key_value; per-head RMSNorm of q and k (query_layernorm / key_layernorm)
before rope; rotate_half rope on the first rotary_dim = head_dim * partial_rotary_factor dims of each head, the rest
passed; GQA (kv head 0 serves both query heads: repeat_kv); causal softmax(q k / sqrt(head_dim)); dense;
MoE (BailingMoeV2Gate): s = sigmoid(router h); the choice on s + expert_bias: groups of E / n_group scored by the sum
of their two best, the topk_group best groups eligible, the top-k of those; weights s[top] (unbiased), divided by
their sum (norm_topk_prob), times routed_scaling_factor; sum_k w_k expert_k(h) + shared_expert(h).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import (causal_attention, checkpoint_to_gguf, cli, finish, rms_norm,
                         routed_experts, swiglu)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "bailingmoe2"
SEED = 2025
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 32, 2, 1, 16, 64, 3
E, FE, K, N_GROUP, TOPK_GROUP, N_SHARED, DENSE = 8, 32, 4, 4, 3, 1, 1
ROT = DH // 2                    # partial_rotary_factor 0.5
THETA, EPS, SCALE = 6e5, 1e-6, 2.5
SEQ, PROMPT, NEW = 40, 8, 16


def hf_config() -> dict:
    return {"architectures": ["BailingMoeV2ForCausalLM"], "model_type": "bailing_moe", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu", "use_qkv_bias": False, "use_bias": False,
            "rms_norm_eps": EPS, "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": THETA,
            "rope_scaling": None, "partial_rotary_factor": 0.5, "rotary_dim": ROT, "use_qk_norm": True,
            "num_experts": E, "num_shared_experts": N_SHARED, "num_experts_per_tok": K, "n_group": N_GROUP,
            "topk_group": TOPK_GROUP, "moe_intermediate_size": FE, "first_k_dense_replace": DENSE,
            "score_function": "sigmoid", "moe_router_enable_expert_bias": True, "routed_scaling_factor": SCALE,
            "norm_topk_prob": True, "num_nextn_predict_layers": 0, "initializer_range": 0.02, "use_cache": True,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in) as gen_arch_fixtures.randomize, norm
    weights around 1, the expert bias ~ N(0, 0.3^2) (zeros at init in the release's training code: drawn here so the
    selection bias changes choices)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) * (1.5 / shape[-1] ** 0.5)).half().float()

    def norm(n):
        return (1.0 + 0.2 * torch.randn(n, generator=g)).half().float()

    t = {"model.word_embeddings.weight": torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "attention.query_key_value.weight"] = mat((H + 2 * KV) * DH, D)
        t[p + "attention.query_layernorm.weight"] = norm(DH)
        t[p + "attention.key_layernorm.weight"] = norm(DH)
        t[p + "attention.dense.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        if i < DENSE:
            for n, shape in (("gate_proj", (FFN, D)), ("up_proj", (FFN, D)), ("down_proj", (D, FFN))):
                t[p + f"mlp.{n}.weight"] = mat(*shape)
            continue
        t[p + "mlp.gate.weight"] = (torch.randn(E, D, generator=g) * (2.0 / D ** 0.5)).half().float()
        t[p + "mlp.gate.expert_bias"] = (0.3 * torch.randn(E, generator=g)).half().float()
        for e in range(E):
            for n, shape in (("gate_proj", (FE, D)), ("up_proj", (FE, D)), ("down_proj", (D, FE))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = mat(*shape)
        for n, shape in (("gate_proj", (FE * N_SHARED, D)), ("up_proj", (FE * N_SHARED, D)),
                         ("down_proj", (D, FE * N_SHARED))):
            t[p + f"mlp.shared_experts.{n}.weight"] = mat(*shape)
    t["model.norm.weight"] = norm(D)
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def route(h, router, bias, group_limit: bool = True, use_bias: bool = True):
    """BailingMoeV2Gate on h (T, D) float64 -> (weights (T, K), ids (T, K)). The switches only count, in build(), how
    often a rule changes a choice (the fixture's non-degeneracy)."""
    import torch

    s = torch.sigmoid(h @ router.T)                                     # (T, E)
    choice = s + bias if use_bias else s.clone()
    if group_limit:
        grp = choice.view(-1, N_GROUP, E // N_GROUP)
        gscore = grp.topk(2, dim=-1).values.sum(-1)                     # (T, G)
        keep = torch.zeros_like(gscore, dtype=torch.bool).scatter_(1, gscore.topk(TOPK_GROUP, -1).indices, True)
        choice = grp.masked_fill(~keep[..., None], float("-inf")).view(-1, E)
    ids = choice.topk(K, dim=-1).indices
    w = s.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * SCALE
    return w, ids


def reference(t: dict, ids: list[int], record: list | None = None) -> np.ndarray:
    """Ling 2.0's forward on the HF tensors, float64 -> (T, V) float32 logits. record: a list that gets each MoE
    layer's normed input h and its (router, bias)."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, ROT, 2, dtype=torch.float64) / ROT)
    ang = torch.cat([pos[:, None] * inv[None]] * 2, -1)                 # (T, ROT): cat(freqs, freqs)
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]

    def rope(x):                                                         # rotate_half on the first ROT dims only
        xr, xp = x[..., :ROT], x[..., ROT:]
        x1, x2 = xr[..., :ROT // 2], xr[..., ROT // 2:]
        return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)

    def mlp(h, p):
        return swiglu(h, w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"])

    x = w["model.word_embeddings.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        qkv = h @ w[p + "attention.query_key_value.weight"].T
        q, k, v = qkv.split([H * DH, KV * DH, KV * DH], -1)
        q = rms(q.view(T, H, DH), w[p + "attention.query_layernorm.weight"])
        k = rms(k.view(T, KV, DH), w[p + "attention.key_layernorm.weight"])
        q, k = rope(q), rope(k)
        x = x + causal_attention(q, k, v.view(T, KV, DH)) @ w[p + "attention.dense.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        if i < DENSE:
            x = x + mlp(h, p + "mlp.")
            continue
        router, bias = w[p + "mlp.gate.weight"], w[p + "mlp.gate.expert_bias"]
        if record is not None:
            record.append((h, router, bias))
        wt, sel = route(h, router, bias)
        out = mlp(h, p + "mlp.shared_experts.")
        routed_experts(out, h, wt, sel, E, lambda e, he: mlp(he, p + f"mlp.experts.{e}."))
        x = x + out
    x = rms(x, w["model.norm.weight"])
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    # raw_config: transformers has no bailing_moe config class; the converter reads config.json as written
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer,
                       keep_f32=lambda k, v: v.ndim != 2 or ".gate.weight" in k)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    rec: list = []
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids, rec)}
    arrays["choices"] = np.stack([route(h, r, b)[1].numpy() for h, r, b in rec]).astype(np.int8)
    changed = {}
    for name, kw in (("no_group_limit", dict(group_limit=False)), ("no_bias", dict(use_bias=False))):
        changed[name] = [int((route(h, r, b, **kw)[1].sort(-1).values != route(h, r, b)[1].sort(-1).values)
                             .any(-1).sum()) for h, r, b in rec]
    used = [len(np.unique(c)) for c in arrays["choices"]]
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokens_whose_choice_changes": changed, "experts_used_per_layer": used},
           lambda x: reference(t, x), PROMPT, NEW, f", choices changed {changed}, experts used {used}")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
