"""Make the deepseek fixture: a tiny random DeepSeek v1 MoE (deepseek-ai/deepseek-moe-16b-base / -chat:
DeepseekForCausalLM, remote code with no class in transformers 5.25) checkpoint in the released Hugging Face layout,
converted to GGUF by llama.cpp's own converter (conversion/deepseek.py DeepseekModel), with two references: a torch
forward of the HF checkpoint written here from the architecture, and llama.cpp's own logits (llama-cpp-python) on an
F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_deepseek_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_deepseek_fixture.py goldens

`build` writes, under tests/data/arch/:
  deepseek.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every matrix drawn float16-exact, so
                 the file holds exactly the weights the reference ran (norms, biases and the router stay F32).
  deepseek.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
                 greedy (N,): its greedy continuation; choices (L_moe, T, K): the experts each MoE layer chose;
                 logits_scale (S, V): the forward of ids[:S] with the routed weights times SCALE (llama.cpp's
                 expert_weights_scale rule; HF's v1 has no such factor, the converter writes 1.0).
  deepseek.json  the config.json written, the seed, the experts each MoE layer used.
`goldens` adds to deepseek.npz lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention), lc_greedy (N,): llama.cpp's greedy continuation of prompt, and lc_logits_scale (S, V): llama.cpp's
logits of ids[:S] on a copy with deepseek.expert_weights_scale = SCALE.

The checkpoint (deepseek-moe-16b-base's config.json, shrunk): hidden 32, 2 heads of 16 over 1 kv head (the release
is MHA, 16 of 16; GQA here exercises the converter's k permutation by kv heads), q/k/v biases (attention_bias true;
the release has false: llama.cpp loads them when present, the converter permutes q/k biases with the rows),
3 layers: first_k_dense_replace 1 (layer 0 a SwiGLU MLP of intermediate_size 32), moe_layer_freq 1 (the only value
llama.cpp's graph can express: the converter does not write it), layers 1-2 MoE with 8 routed experts of
moe_intermediate_size 8, num_experts_per_tok 3, n_shared_experts 2 (one MLP of width 2 * 8, as modeling_deepseek.py
builds it), scoring_func softmax, norm_topk_prob false (as released; llama.cpp's deepseek graph never
renormalizes), rope_theta 1e4, untied lm_head, vocab 320 (the tiny byte-level BPE of tools/gen_arch_fixtures.py).
Tensor names as released: model.embed_tokens, model.layers.N.input_layernorm, self_attn.{q,k,v,o}_proj,
post_attention_layernorm, mlp.{gate,up,down}_proj (dense), mlp.gate.weight (router), mlp.experts.E.{gate,up,down}_proj,
mlp.shared_experts.{gate,up,down}_proj, model.norm, lm_head.

The reference forward (reference() below) is the architecture as modeling_deepseek.py computes it, on the HF
tensors: RMSNorm; q/k/v with biases; rotate_half rope on the whole head (cos/sin of cat(freqs, freqs)); GQA
(repeat_kv); causal softmax(q k / sqrt(head_dim)); o_proj; the MLP of a layer idx < first_k_dense_replace, else
MoEGate: p = softmax(router h), the top-k of p, weights p[top] (divided by their sum + 1e-20 only with
norm_topk_prob); sum_k w_k expert_k(h) + shared_experts(h).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "deepseek"
SEED = 2031
VOCAB, D, H, KV, FFN, LAYERS, FIRST_DENSE = 320, 32, 2, 1, 32, 3, 1
DH = D // H                   # modeling_deepseek.py: head_dim = hidden_size // num_attention_heads
E, FE, K, N_SHARED = 8, 8, 3, 2
THETA, EPS = 1e4, 1e-6
SEQ, PROMPT, NEW = 24, 8, 12
SCALE, SCALE_SEQ = 2.5, 8     # the expert_weights_scale variant: its factor, the positions stored


def hf_config() -> dict:
    return {"architectures": ["DeepseekForCausalLM"], "model_type": "deepseek", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "moe_intermediate_size": FE, "num_hidden_layers": LAYERS,
            "num_attention_heads": H, "num_key_value_heads": KV, "n_shared_experts": N_SHARED,
            "n_routed_experts": E, "num_experts_per_tok": K, "moe_layer_freq": 1,
            "first_k_dense_replace": FIRST_DENSE, "norm_topk_prob": False, "scoring_func": "softmax",
            "aux_loss_alpha": 0.001, "seq_aux": True, "hidden_act": "silu", "max_position_embeddings": 4096,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "use_cache": True, "pad_token_id": None,
            "bos_token_id": 1, "eos_token_id": 2, "pretraining_tp": 1, "tie_word_embeddings": False,
            "rope_theta": THETA, "rope_scaling": None, "attention_bias": True, "attention_dropout": 0.0,
            "torch_dtype": "float16"}


def moe_layer(i: int) -> bool:
    """modeling_deepseek.py DeepseekDecoderLayer: n_routed_experts set, idx >= first_k_dense_replace and
    idx % moe_layer_freq == 0."""
    c = hf_config()
    return c["n_routed_experts"] is not None and i >= c["first_k_dense_replace"] and i % c["moe_layer_freq"] == 0


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1, biases ~ 0.2,
    the router wider (so the softmax picks distinct experts and its top-3 weights differ)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) * (1.5 / shape[-1] ** 0.5)).half().float()

    def norm(n):
        return (1.0 + 0.2 * torch.randn(n, generator=g)).half().float()

    def bias(n):
        return (0.2 * torch.randn(n, generator=g)).half().float()

    def mlp(p, F):
        for n, shape in (("gate_proj", (F, D)), ("up_proj", (F, D)), ("down_proj", (D, F))):
            t[p + f"{n}.weight"] = mat(*shape)

    t = {"model.embed_tokens.weight": torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        for n, rows in (("q_proj", H * DH), ("k_proj", KV * DH), ("v_proj", KV * DH)):
            t[p + f"self_attn.{n}.weight"] = mat(rows, D)
            t[p + f"self_attn.{n}.bias"] = bias(rows)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        if not moe_layer(i):
            mlp(p + "mlp.", FFN)
            continue
        t[p + "mlp.gate.weight"] = (torch.randn(E, D, generator=g) * (3.0 / D ** 0.5)).half().float()
        for e in range(E):
            mlp(p + f"mlp.experts.{e}.", FE)
        mlp(p + "mlp.shared_experts.", FE * N_SHARED)
    t["model.norm.weight"] = norm(D)
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def route(h, router, norm_topk: bool):
    """MoEGate on h (T, D) float64 -> (weights (T, K), ids (T, K)): softmax scores, top-k, renormalized only with
    norm_topk_prob (denominator sum + 1e-20)."""
    p = (h @ router.T).softmax(-1)
    w, ids = p.topk(K, dim=-1)
    if K > 1 and norm_topk:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w, ids


def reference(t: dict, ids: list[int], record: list | None = None, scale: float = 1.0,
              norm_topk: bool = False) -> np.ndarray:
    """DeepSeek v1's forward on the HF tensors, float64 -> (T, V) float32 logits. record: gets each MoE layer's
    expert ids; scale: the routed weights' factor (llama.cpp's expert_weights_scale; 1 in the HF model)."""
    import torch
    import torch.nn.functional as F

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    rope = neox_rope(T, DH, THETA)                                       # rotate_half on the whole head

    def lin(x, p):
        y = x @ w[p + ".weight"].T
        return y + w[p + ".bias"] if p + ".bias" in w else y

    def mlp(h, p):
        return lin(F.silu(lin(h, p + "gate_proj")) * lin(h, p + "up_proj"), p + "down_proj")

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], EPS)
        q = rope(lin(h, p + "self_attn.q_proj").view(T, H, DH))
        k = rope(lin(h, p + "self_attn.k_proj").view(T, KV, DH))
        v = lin(h, p + "self_attn.v_proj").view(T, KV, DH)
        x = x + lin(causal_attention(q, k, v), p + "self_attn.o_proj")
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], EPS)
        if not moe_layer(i):
            x = x + mlp(h, p + "mlp.")
            continue
        wt, sel = route(h, w[p + "mlp.gate.weight"], norm_topk)
        wt = wt * scale
        if record is not None:
            record.append(sel.numpy())
        out = mlp(h, p + "mlp.shared_experts.")
        for j in range(K):
            for e in range(E):
                rows = sel[:, j] == e
                if rows.any():
                    out[rows] += wt[rows, j, None] * mlp(h[rows], p + f"mlp.experts.{e}.")
        x = x + out
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer,
                       keep_f32=lambda k, v: v.ndim != 2 or ".gate.weight" in k)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    rec: list = []
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids, rec)}
    arrays["choices"] = np.stack(rec).astype(np.int8)
    arrays["logits_scale"] = reference(t, ids[:SCALE_SEQ], scale=SCALE)
    used = [len(np.unique(c)) for c in arrays["choices"]]
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "expert_weights_scale_variant": SCALE, "experts_used_per_moe_layer": used},
           lambda x: reference(t, x), PROMPT, NEW, note=f", experts used {used}")


def goldens() -> None:
    from gguf import GGUFValueType

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens, llamacpp_variant, set_key

    llamacpp_goldens(OUT, NAME)
    llamacpp_variant(OUT, NAME, "lc_logits_scale", "logits_scale", lambda src, dst: set_key(
        src, dst, f"{NAME}.expert_weights_scale", SCALE, GGUFValueType.FLOAT32), SCALE_SEQ)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
