"""Make the grovemoe fixture: a tiny random GroveMoE (inclusionAI GroveMoE-Inst / GroveMoE-Base: GroveMoeForCausalLM,
remote code with no class in transformers 5.25) checkpoint in the released Hugging Face layout, converted to GGUF by
llama.cpp's own converter (conversion/grovemoe.py GroveMoeModel), with two references: a torch forward of the
checkpoint written here (nothing here imports minfer), and llama.cpp's own logits (llama-cpp-python) on an F32 copy.

    /work/tfvenv/bin/python tools/gen_grovemoe_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_grovemoe_fixture.py goldens

`build` writes, under tests/data/arch/:
  grovemoe.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every matrix drawn float16-exact (the
                 router stays F32), so the file holds exactly the weights the reference ran.
  grovemoe.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
                 greedy (N,): its greedy continuation; choices (L, T, K): the experts each layer chose; chunks
                 (L, T, K): the adjugate (chunk) expert of each slot.
  grovemoe.json  the config.json written, the seed, how the fixture's routing exercises each rule, and how far the
                 HF modeling code's adjugate-expert rule lands from llama.cpp's (see below).
`goldens` adds lc_logits (T, V) (llama.cpp's logits of ids: F32 weights and KV cache, no flash attention) and
lc_greedy (N,).

The checkpoint (GroveMoE-Inst's config.json, shrunk): hidden 32, 2 query heads of 16 over 1 kv head, 2 layers, 8
experts of moe_intermediate_size 16, num_experts_per_tok 3, norm_topk_prob, tied embeddings, vocab 320 (the tiny
byte-level BPE of tools/gen_arch_fixtures.py). The adjugate experts are what the converter hard-codes (FIXMEs in
conversion/grovemoe.py, after modeling_grove_moe.py): experts_per_group 2 (so 4 chunk experts), their width head_dim
(16 here; 128 in the release, whose head_dim is 128), expert_group_scale 0.05; mlp.expert_bias is dropped by the
converter (unused). The chunk experts are drawn as the routed ones; their branch, though scaled by 0.05, moves the
logits by several percent (the json's variant_rel_err), so each of its rules shows. Tensor names as released
(Qwen3-MoE's plus mlp.chunk_experts.C.{gate,up,down}_proj).

The reference forward (reference() below) is llama.cpp's graph (src/models/grovemoe.cpp with build_moe_ffn of
src/llama-graph.cpp), the goldens' program:
    x = E[ids]
    per layer: h = RMSNorm(input_layernorm)(x); q, k, v = W_q h, W_k h, W_v h
               q, k = RMSNorm of each head (q_norm, k_norm), then rotate_half rope (NEOX) over the whole head
               x = x + W_o causal softmax(q k / sqrt(head_dim)) v                       (GQA: kv head 0 for both)
               h = RMSNorm(post_attention_layernorm)(x); l = W_gate h (E,)
               p = softmax(l); top = the K largest sigmoid(l) (the same order as l: build_moe_ffn's GROVEMOE
               selection); w = p[top] / max(sum, 2^-14)
               m = sum_k w_k down_k(silu(gate_k h) * up_k h)                               (ffn_moe_out)
               c_k = top_k // 2 (the chunk of each slot: ggml_cast(ggml_scale(sel, 1/2)) truncates)
               a_k = p[c_k] / max(sum_k p[c_k], 2^-14)   -- p of EXPERT number c_k: build_moe_ffn get_rows(probs,
                                                            selected_experts) after the chunk ids replace the ids
               adj = sum_k a_k chunk_down_{c_k}(silu(chunk_gate_{c_k} m) * chunk_up_{c_k} m)   -- input m, the
                                                            routed output (grovemoe.cpp: cur = moe_out before the
                                                            second build_moe_ffn)
               x = x + m + 0.05 adj
    logits = E RMSNorm(x; norm)                                                            (tied head)
modeling_grove_moe.py (and mlx-lm's port) computes the adjugate branch differently: its input is h (the normed
layer input), its weights the routed w_k; the json's `hf_rule_rel_err` measures that variant's distance from the
above, which llama.cpp (and so minfer) runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rel_err, rms_norm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "grovemoe"
SEED = 11
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 32, 2, 1, 16, 64, 2
E, FE, K = 8, 16, 3
GROUP, SCALE = 2, 0.05            # conversion/grovemoe.py: add_experts_per_group(2), add_expert_group_scale(0.05)
EC, FCH = E // GROUP, DH          # chunk experts: num_experts // 2, width head_dim (add_expert_chunk_feed_forward_length)
THETA, EPS = 5e5, 1e-6
SEQ, PROMPT, NEW = 32, 8, 16
CLAMP = 6.103515625e-5            # build_moe_ffn: the weight sum clamped to the smallest f16 normal


def hf_config() -> dict:
    return {"architectures": ["GroveMoeForCausalLM"], "model_type": "grove_moe",
            "auto_map": {"AutoConfig": "configuration_grove_moe.GroveMoeConfig",
                         "AutoModelForCausalLM": "modeling_grove_moe.GroveMoeForCausalLM"},
            "vocab_size": VOCAB, "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS,
            "num_attention_heads": H, "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu",
            "attention_bias": False, "rms_norm_eps": EPS, "tie_word_embeddings": True,
            "max_position_embeddings": 4096, "rope_theta": THETA, "rope_scaling": None, "num_experts": E,
            "num_experts_per_tok": K, "moe_intermediate_size": FE, "norm_topk_prob": True, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "output_router_logits": False, "initializer_range": 0.02, "use_cache": True,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1, the router
    ~ N(0, 4 / D) (kept F32 by the converter), the (tied) embedding ~ N(0, 0.25^2): small next to the layers' outputs,
    so the greedy continuation does not just repeat its last token."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) * (1.5 / shape[-1]) ** 0.5).half().float()

    def norm(n):
        return (1.0 + 0.2 * torch.randn(n, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (0.25 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
        t[p + "self_attn.k_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.v_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "self_attn.q_norm.weight"] = norm(DH)
        t[p + "self_attn.k_norm.weight"] = norm(DH)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "mlp.gate.weight"] = (torch.randn(E, D, generator=g) * (2.0 / D ** 0.5)).half().float()
        t[p + "mlp.expert_bias"] = torch.zeros(E)                       # a buffer of the release; the converter drops it
        for e in range(E):
            for n, shape in (("gate_proj", (FE, D)), ("up_proj", (FE, D)), ("down_proj", (D, FE))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = mat(*shape)
        for c in range(EC):
            for n, shape in (("gate_proj", (FCH, D)), ("up_proj", (FCH, D)), ("down_proj", (D, FCH))):
                t[p + f"mlp.chunk_experts.{c}.{n}.weight"] = mat(*shape)
    t["model.norm.weight"] = norm(D)
    return t


def route(l, variant: str = "llamacpp"):
    """The router logits l (T, E) float64 -> (w (T, K), top (T, K), a (T, K), chunks (T, K)): build_moe_ffn's routing
    (module docstring). variant "hf": a = w (modeling_grove_moe.py's chunk weights); "no_chunk_norm": a unnormalized;
    "index_mod": chunks top % EC (the wrong grouping) -- the counters of build() only."""
    import torch

    p = torch.softmax(l, -1)
    top = torch.sigmoid(l).topk(K, -1).indices
    w = p.gather(1, top)
    w = w / w.sum(-1, keepdim=True).clamp(min=CLAMP)
    chunks = top % EC if variant == "index_mod" else top // GROUP
    a = p.gather(1, chunks)
    if variant != "no_chunk_norm":
        a = a / a.sum(-1, keepdim=True).clamp(min=CLAMP)
    if variant == "hf":
        a = w
    return w, top, a, chunks


def reference(t: dict, ids: list[int], variant: str = "llamacpp", record: list | None = None) -> np.ndarray:
    """The forward (module docstring), float64 -> (T, V) float32 logits. variant "hf": modeling_grove_moe.py's adjugate
    branch (input h, the routed weights). record: gets each layer's router logits."""
    import torch
    import torch.nn.functional as F

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    rope = neox_rope(T, DH, THETA)                                       # rotate_half over the whole head

    def mlp(h, p):
        return F.silu(h @ w[p + "gate_proj.weight"].T) * (h @ w[p + "up_proj.weight"].T) @ w[p + "down_proj.weight"].T

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = rms_norm(x, w[p + "input_layernorm.weight"], EPS)
        q = rms_norm((h @ w[a + "q_proj.weight"].T).view(T, H, DH), w[a + "q_norm.weight"], EPS)
        k = rms_norm((h @ w[a + "k_proj.weight"].T).view(T, KV, DH), w[a + "k_norm.weight"], EPS)
        v = (h @ w[a + "v_proj.weight"].T).view(T, KV, DH)
        x = x + causal_attention(rope(q), rope(k), v) @ w[a + "o_proj.weight"].T
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], EPS)
        logits = h @ w[p + "mlp.gate.weight"].T
        if record is not None:
            record.append(logits)
        wt, top, a, chunks = route(logits, variant)
        m = torch.zeros_like(h)
        for j in range(K):
            for e in range(E):
                rows = top[:, j] == e
                if rows.any():
                    m[rows] += wt[rows, j, None] * mlp(h[rows], p + f"mlp.experts.{e}.")
        src = h if variant == "hf" else m                                 # llama.cpp: the chunk experts read m
        adj = torch.zeros_like(h)
        for j in range(K):
            for c in range(EC):
                rows = chunks[:, j] == c
                if rows.any():
                    adj[rows] += a[rows, j, None] * mlp(src[rows], p + f"mlp.chunk_experts.{c}.")
        x = x + m + SCALE * adj
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["model.embed_tokens.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer,
                       keep_f32=lambda k, v: v.ndim != 2 or k.endswith("mlp.gate.weight"))
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    rec: list = []
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids, record=rec)}
    routes = [route(lg) for lg in rec]
    arrays["choices"] = np.stack([r[1].numpy() for r in routes]).astype(np.int8)
    arrays["chunks"] = np.stack([r[3].numpy() for r in routes]).astype(np.int8)
    # the routing is not degenerate: tokens whose K slots share a chunk (two experts of one group chosen), and the
    # chunk weights p[c] differ from the routed weights w
    shared = [int(sum(len(set(row)) < K for row in r[3].tolist())) for r in routes]
    variants = {v: rel_err(reference(t, ids, v), arrays["logits"]) for v in ("hf", "no_chunk_norm", "index_mod")}
    global SCALE
    SCALE, kept = 0.0, SCALE
    variants["no_chunk_experts"] = rel_err(reference(t, ids), arrays["logits"])
    SCALE = kept
    used = [len(np.unique(c)) for c in arrays["choices"]]
    meta = {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
            "gguf_keys": {"experts_per_group": GROUP, "expert_group_scale": SCALE,
                          "expert_chunk_feed_forward_length": FCH},
            "tokens_with_a_shared_chunk": shared, "experts_used_per_layer": used,
            "hf_rule_rel_err": variants.pop("hf"), "variant_rel_err": variants}
    finish(OUT, NAME, arrays, meta, lambda x: reference(t, x), PROMPT, NEW,
           note=f", shared chunks {shared}, experts used {used}, HF rule {meta['hf_rule_rel_err']:.3g}, "
                f"variants {variants}")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
