"""Make the arctic fixture: a tiny random Snowflake Arctic (Snowflake/snowflake-arctic-instruct / -base:
ArcticForCausalLM, remote code with no class in transformers 5.25) checkpoint in the released Hugging Face layout,
converted to GGUF by llama.cpp's own converter (conversion/arctic.py ArcticModel), with two references: a torch
forward of the HF checkpoint written here from the architecture, and llama.cpp's own logits (llama-cpp-python) on an
F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_arctic_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_arctic_fixture.py goldens

`build` writes, under tests/data/arch/:
  arctic.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every matrix drawn float16-exact, so the
               file holds exactly the weights the reference ran (norms and the router stay F32).
  arctic.npz   ids (T,), logits (T, V) float32: the torch forward below (float64) at every position; prompt (P,),
               greedy (N,): its greedy continuation; choices (L, T, K): the experts each layer chose.
  arctic.json  the config.json and tokenizer_config.json written, the seed, the experts each layer used.
`goldens` adds to arctic.npz lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention) and lc_greedy (N,): llama.cpp's greedy continuation of prompt; and to arctic.json `llamacpp_ignores`:
for each key in IGNORED, the largest |difference| between llama.cpp's logits of ids[:8] on a copy with that key set
and on the file itself (0.0: llama.cpp's arctic graph does not read the key; minfer refuses such a file by name).

The checkpoint (snowflake-arctic-instruct's config.json, shrunk): hidden 32, 4 heads of 8 over 2 kv heads (the
release: 56 over 8; GQA exercises the converter's k permutation by kv heads), 2 layers, every layer MoE
(moe_layer_frequency 1, as released: the only value llama.cpp's graph expresses) with parallel_attn_mlp_res and
use_residual true (as released): 8 experts (num_local_experts) of intermediate_size 16, num_experts_per_tok 2, and the
residual MLP of width hidden_size (modeling_arctic.py ArcticMLP(is_residual_mlp=True): ffn_dim = hidden_size);
rms_norm_eps 1e-5, rope_theta 1e4, untied lm_head, vocab 320. Tensor names as released: model.embed_tokens,
model.layers.N.input_layernorm, self_attn.{q,k,v,o}_proj, residual_layernorm, residual_mlp.{w1,w3,w2} (gate, up,
down), post_attention_layernorm, block_sparse_moe.gate.weight (router), block_sparse_moe.experts.E.{w1,w3,w2},
model.norm, lm_head. tokenizer.model: a SentencePiece BPE with byte fallback (gen_internlm2_fixture.make_spm_tokenizer);
tokenizer_config.json redefines the last two pieces as the special <|im_start|> / <|im_end|> (the converter's
ArcticModel.set_vocab comment: the release redefined pieces 31998 / 31999 in place of adding tokens).

The reference forward (reference() below) is the decoder layer as modeling_arctic.py computes it with
parallel_attn_mlp_res (also vLLM's and EasyDeL's Arctic ports), on the HF tensors:

    r   = x                                                  the layer input
    x   = r + o_proj(attn(rope(q), rope(k), v)(input_layernorm(r)))
    res = x + residual_mlp(residual_layernorm(x))            w2(silu(w1 h) * w3 h), width hidden_size
    x   = res + moe(post_attention_layernorm(r))             the MoE reads the layer INPUT, not x

moe(h): p = softmax(gate h); the top num_experts_per_tok of p, their weights divided by their sum (top_k > 1, as
modeling_arctic.py / vLLM's ArcticMoE: renormalize = top_k > 1); sum_k w_k w2_k(silu(w1_k h) * w3_k h).
rotate_half rope on the whole head (cos/sin of cat(freqs, freqs)), GQA (repeat_kv), causal softmax(q k / sqrt(Dh)).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from fixture_ref import (causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm,
                         routed_experts, swiglu)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "arctic"
SEED = 2077
VOCAB, D, H, KV, LAYERS = 320, 32, 4, 2, 2
DH = D // H                   # modeling_arctic.py: head_dim = hidden_size // num_attention_heads
E, FE, K = 8, 16, 2           # experts, their width (intermediate_size), experts per token
THETA, EPS = 1e4, 1e-5
SEQ, PROMPT, NEW = 24, 8, 10
# keys llama.cpp's arctic graph does not read (the goldens step measures that): the value a copy gets
IGNORED = {"expert_weights_scale": 2.5, "expert_weights_norm": False, "expert_gating_func": 2}


def hf_config() -> dict:
    return {"architectures": ["ArcticForCausalLM"], "model_type": "arctic", "vocab_size": VOCAB, "hidden_size": D,
            "intermediate_size": FE, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "num_local_experts": E, "num_experts_per_tok": K, "moe_layer_frequency": 1,
            "parallel_attn_mlp_res": True, "use_residual": True, "hidden_act": "silu",
            "max_position_embeddings": 4096, "initializer_range": 0.02, "rms_norm_eps": EPS, "rope_theta": THETA,
            "sliding_window": None, "attention_dropout": 0.0, "router_aux_loss_coef": 0.001,
            "moe_train_capacity_factor": 1, "moe_eval_capacity_factor": 1, "moe_min_capacity": 0,
            "moe_token_dropping": True, "enable_expert_tensor_parallelism": False, "quantization": None,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "use_cache": True,
            "torch_dtype": "bfloat16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "tokenizer_class": "LlamaTokenizer",
            "added_tokens_decoder": {str(VOCAB - 2): {"content": "<|im_start|>", "special": True},
                                     str(VOCAB - 1): {"content": "<|im_end|>", "special": True}}}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1 (each norm its
    own, so swapping two is seen), the router wider (so the softmax picks distinct experts, top-2 weights differ)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(*shape):
        return (torch.randn(*shape, generator=g) * (1.5 / shape[-1] ** 0.5)).half().float()

    def norm(n):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    def mlp(p, F):
        for n, shape in (("w1", (F, D)), ("w3", (F, D)), ("w2", (D, F))):
            t[p + f"{n}.weight"] = mat(*shape)

    t = {"model.embed_tokens.weight": torch.randn(VOCAB, D, generator=g).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        for n, rows in (("q_proj", H * DH), ("k_proj", KV * DH), ("v_proj", KV * DH)):
            t[p + f"self_attn.{n}.weight"] = mat(rows, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "residual_layernorm.weight"] = norm(D)
        mlp(p + "residual_mlp.", D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        t[p + "block_sparse_moe.gate.weight"] = (torch.randn(E, D, generator=g) * (3.0 / D ** 0.5)).half().float()
        for e in range(E):
            mlp(p + f"block_sparse_moe.experts.{e}.", FE)
    t["model.norm.weight"] = norm(D)
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int], record: list | None = None) -> np.ndarray:
    """Arctic's forward on the HF tensors, float64 -> (T, V) float32 logits. record: gets each layer's expert ids."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    rope = neox_rope(T, DH, THETA)                                       # rotate_half on the whole head

    def lin(x, p):
        return x @ w[p + ".weight"].T

    def mlp(h, p):
        return swiglu(h, w[p + "w1.weight"], w[p + "w3.weight"], w[p + "w2.weight"])

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        r = x
        h = rms(r, w[p + "input_layernorm.weight"])
        q = rope(lin(h, p + "self_attn.q_proj").view(T, H, DH))
        k = rope(lin(h, p + "self_attn.k_proj").view(T, KV, DH))
        v = lin(h, p + "self_attn.v_proj").view(T, KV, DH)
        x = r + lin(causal_attention(q, k, v), p + "self_attn.o_proj")
        res = x + mlp(rms(x, w[p + "residual_layernorm.weight"]), p + "residual_mlp.")
        hm = rms(r, w[p + "post_attention_layernorm.weight"])             # the layer input's norm
        prob = (hm @ w[p + "block_sparse_moe.gate.weight"].T).softmax(-1)
        wt, sel = prob.topk(K, dim=-1)
        if K > 1:
            wt = wt / wt.sum(-1, keepdim=True)
        if record is not None:
            record.append(sel.numpy())
        out = routed_experts(torch.zeros_like(hm), hm, wt, sel, E,
                             lambda e, he: mlp(he, p + f"block_sparse_moe.experts.{e}."))
        x = res + out
    x = rms(x, w["model.norm.weight"])
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    t = weights(SEED)
    # raw_config: transformers has no arctic config class; the converter reads config.json as written
    files = {"config.json": hf_config(), "tokenizer_config.json": tokenizer_config()}
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, files, lambda d: make_spm_tokenizer(d, VOCAB),
                       keep_f32=lambda k, v: v.ndim != 2 or ".gate.weight" in k)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB - 2, size=SEQ).tolist()
    rec: list = []
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids, rec)}
    arrays["choices"] = np.stack(rec).astype(np.int8)
    used = [len(np.unique(c)) for c in arrays["choices"]]
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config(), "experts_used_per_layer": used},
           lambda x: reference(t, x), PROMPT, NEW, f", experts used {used}")


def goldens() -> None:
    from gguf import GGUFValueType

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import f32_copy
    from gen_nanbeige_fixture import llamacpp_goldens, llamacpp_logits, set_key

    llamacpp_goldens(OUT, NAME)
    ids = np.load(OUT / f"{NAME}.npz")["ids"][:8].tolist()
    types = {"expert_weights_scale": GGUFValueType.FLOAT32, "expert_weights_norm": GGUFValueType.BOOL,
             "expert_gating_func": GGUFValueType.UINT32}
    ignores = {}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        f32_copy(OUT / f"{NAME}.gguf", f32)
        base, _ = llamacpp_logits(f32, ids)
        for key, value in IGNORED.items():
            edited = Path(tmp) / f"{NAME}-{key}.gguf"
            set_key(f32, edited, f"{NAME}.{key}", value, types[key])
            got, _ = llamacpp_logits(edited, ids)
            ignores[f"{NAME}.{key}={value}"] = float(np.abs(got - base).max())
    meta = json.loads((OUT / f"{NAME}.json").read_text())
    meta["llamacpp_ignores"] = ignores
    (OUT / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"llama.cpp's logits with a key it does not read set, max |diff|: {ignores}")


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece")
