"""Make the bailingmoe fixture: a tiny random Ling v1 (inclusionAI Ling-lite / Ling-plus / Ling-Coder-lite:
BailingMoeForCausalLM, remote code with no class in transformers 5.25) checkpoint in the released Hugging Face layout,
converted to GGUF by llama.cpp's own converter (conversion/bailingmoe.py BailingMoeModel), with two references: a
torch forward of the HF checkpoint written here from the architecture, and llama.cpp's own logits (llama-cpp-python)
on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_bailingmoe_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_bailingmoe_fixture.py goldens

`build` writes, under tests/data/arch/:
  bailingmoe.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every matrix drawn float16-exact, so
                   the file holds exactly the weights the reference ran (norms and the router stay F32).
  bailingmoe.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
                   greedy (N,): its greedy continuation; choices (L, T, K): the experts each MoE layer chose.
  bailingmoe.json  the config.json written, the seed, the experts each layer used.
`goldens` adds to bailingmoe.npz lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention), lc_greedy (N,): llama.cpp's greedy continuation of prompt.

The checkpoint (Ling-lite's config.json, shrunk): hidden 32, 2 heads of 16 over 1 kv head, 2 layers (the 250 KB fixture budget), all MoE
(first_k_dense_replace 0 as Ling-lite; llama.cpp's graph has no dense layers anyway), 8 experts of
moe_intermediate_size 32, num_experts_per_tok 4, two shared experts (one MLP of width 2 * 32, as
modeling_bailing_moe.py builds it), softmax router, norm_topk_prob true, rope_theta 6e5 on the whole head,
norm_head false, untied lm_head, vocab 320 (the tiny byte-level BPE of tools/gen_arch_fixtures.py). Tensor names as
released: model.word_embeddings, model.layers.N.input_layernorm, attention.query_key_value (rows q, then k, then v),
attention.dense, post_attention_layernorm, mlp.gate.weight (router), mlp.experts.E.{gate,up,down}_proj,
mlp.shared_experts.{gate,up,down}_proj, model.norm, lm_head.

The reference forward (reference() below) is the architecture as modeling_bailing_moe.py computes it, on the HF
tensors: RMSNorm; q, k, v split from query_key_value; rotate_half rope on the whole head; GQA (repeat_kv); causal
softmax(q k / sqrt(head_dim)); dense; MoE: p = softmax(router h), the top-k of p, weights p[top] / sum (norm_topk_prob);
sum_k w_k expert_k(h) + shared_experts(h).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import (causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm,
                         routed_experts, swiglu)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "bailingmoe"
SEED = 2024
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 32, 2, 1, 16, 64, 2
E, FE, K, N_SHARED = 8, 32, 4, 2
THETA, EPS = 6e5, 1e-6
SEQ, PROMPT, NEW = 24, 8, 12


def hf_config() -> dict:
    return {"architectures": ["BailingMoeForCausalLM"], "model_type": "bailing_moe", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu", "use_qkv_bias": False, "use_bias": False,
            "rms_norm_eps": EPS, "tie_word_embeddings": False, "max_position_embeddings": 4096, "rope_theta": THETA,
            "rope_scaling": None, "num_experts": E, "num_shared_experts": N_SHARED, "num_experts_per_tok": K,
            "moe_intermediate_size": FE, "first_k_dense_replace": 0, "norm_topk_prob": True, "norm_head": False,
            "initializer_range": 0.02, "use_cache": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1, the router wider
    (so the softmax picks distinct experts)."""
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
        t[p + "attention.dense.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "mlp.gate.weight"] = (torch.randn(E, D, generator=g) * (3.0 / D ** 0.5)).half().float()
        for e in range(E):
            for n, shape in (("gate_proj", (FE, D)), ("up_proj", (FE, D)), ("down_proj", (D, FE))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = mat(*shape)
        Fs = FE * N_SHARED
        for n, shape in (("gate_proj", (Fs, D)), ("up_proj", (Fs, D)), ("down_proj", (D, Fs))):
            t[p + f"mlp.shared_experts.{n}.weight"] = mat(*shape)
    t["model.norm.weight"] = norm(D)
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def route(h, router):
    """BailingMoeGate on h (T, D) float64 -> (weights (T, K), ids (T, K)): softmax, top-k, renormalized."""
    p = (h @ router.T).softmax(-1)
    w, ids = p.topk(K, dim=-1)
    return w / w.sum(-1, keepdim=True), ids


def reference(t: dict, ids: list[int], record: list | None = None) -> np.ndarray:
    """Ling v1's forward on the HF tensors, float64 -> (T, V) float32 logits. record: gets each layer's expert ids."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    rope = neox_rope(T, DH, THETA)                                       # rotate_half on the whole head

    def mlp(h, p):
        return swiglu(h, w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"])

    x = w["model.word_embeddings.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q, k, v = (h @ w[p + "attention.query_key_value.weight"].T).split([H * DH, KV * DH, KV * DH], -1)
        q, k = rope(q.view(T, H, DH)), rope(k.view(T, KV, DH))
        x = x + causal_attention(q, k, v.view(T, KV, DH)) @ w[p + "attention.dense.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        wt, sel = route(h, w[p + "mlp.gate.weight"])
        if record is not None:
            record.append(sel.numpy())
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
    arrays["choices"] = np.stack(rec).astype(np.int8)
    used = [len(np.unique(c)) for c in arrays["choices"]]
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "experts_used_per_layer": used}, lambda x: reference(t, x), PROMPT, NEW,
           f", experts used {used}")


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
