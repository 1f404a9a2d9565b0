"""Make the pangu-embedded fixture: a tiny random openPangu-Embedded (PanguEmbeddedForCausalLM, the
openPangu-Embedded-1B / 7B architecture, a remote-code model with no class in transformers 5.25) checkpoint, converted
to GGUF by llama.cpp's own converter (conversion/pangu.py PanguEmbeddedModel, a plain TextModel: no q/k permutation),
with two references: a torch forward of the HF checkpoint written here from the architecture (below), and llama.cpp's
own logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_pangu_embed_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_pangu_embed_fixture.py goldens

`build` writes, under tests/data/arch/:
  pangu-embedded.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (every weight float16-exact).
  pangu-embedded.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,),
                       greedy (N,): its greedy continuation; logits_noqkvb (NB, V): the forward with the q/k/v biases
                       left out, on ids[:NB].
  pangu-embedded.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention);
lc_logits_noqkvb (NB, V): llama.cpp on that copy without the blk.N.attn_{q,k,v}.bias tensors (create_tensor_qkv
takes them as TENSOR_NOT_REQUIRED).

The checkpoint (the release's config.json, FreedomIntelligence/openPangu-Embedded-7B-V1.1, shrunk): hidden 32, 4
heads of head_dim 12 (4 x 12 = 48 != 32: the converter writes key_length and rope.dimension_count 12), 2 kv heads,
FFN 64, 2 layers, vocab 320, rms_norm_eps 1e-5, `bias` true, tie_word_embeddings false (an lm_head), rope_theta 1e4
(the release's 1.6e7 barely turns 40 positions). tokenizer.model: a SentencePiece BPE with byte fallback
(gen_internlm2_fixture.make_spm_tokenizer; the converter's set_vocab is _set_vocab_sentencepiece, plus
add_prefix_space from tokenizer_config.json).

The architecture (modeling_openpangu_dense.py: LlamaAttention / LlamaMLP with every attention projection of
bias=config.bias; src/models/pangu-embed.cpp), as the reference computes it on the HF tensors: RMSNorm pre-norms;
q/k/v = W h + b; rope over whole heads in HALVES (rotate_half on the HF rows: llama_model_rope_type PANGU_EMBED ->
NEOX, and the converter permutes nothing), base rope_theta; GQA with kv head i // (H / KV); softmax(q k / sqrt(Dh));
o = W_o attn + b_o; SwiGLU MLP without biases; final norm; lm_head.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "pangu-embedded"
SEED = 2031
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 32, 4, 2, 12, 64, 2
THETA, EPS = 1e4, 1e-5
SEQ, PROMPT, NEW, NB = 28, 8, 16, 8


def hf_config() -> dict:
    return {"architectures": ["PanguEmbeddedForCausalLM"], "model_type": "PanguEmbedded", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu", "max_position_embeddings": 256,
            "rms_norm_eps": EPS, "rope_theta": THETA, "bias": True, "attention_dropout": 0.0,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
            "torch_dtype": "float16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "add_prefix_space": True, "bos_token": "<s>",
            "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<unk>", "legacy": True}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1, biases
    ~ N(0, 0.5^2) (large enough that each one moves the logits well past the tolerance)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    def bias(n):
        return (0.5 * torch.randn(n, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (0.5 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        for n, o in (("q", H * DH), ("k", KV * DH), ("v", KV * DH)):
            t[p + f"self_attn.{n}_proj.weight"] = mat(o, D)
            t[p + f"self_attn.{n}_proj.bias"] = bias(o)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "self_attn.o_proj.bias"] = bias(D)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int], qkv_bias: bool = True) -> np.ndarray:
    """openPangu-Embedded's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def proj(h, name, use_bias=True):
        y = h @ w[name + ".weight"].T
        return y + w[name + ".bias"] if use_bias else y

    rope = neox_rope(T, DH, THETA)                        # rotate_half: the halves (x[i], x[i + Dh/2])
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}.self_attn."
        h = rms_norm(x, w[f"model.layers.{i}.input_layernorm.weight"], EPS)
        q = rope(proj(h, p + "q_proj", qkv_bias).reshape(T, H, DH))
        k = rope(proj(h, p + "k_proj", qkv_bias).reshape(T, KV, DH))
        v = proj(h, p + "v_proj", qkv_bias).reshape(T, KV, DH)
        x = x + proj(causal_attention(q, k, v), p + "o_proj")
        m = f"model.layers.{i}.mlp."
        h = rms_norm(x, w[f"model.layers.{i}.post_attention_layernorm.weight"], EPS)
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    t = weights(SEED)
    files = {"config.json": hf_config(), "tokenizer_config.json": tokenizer_config()}
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, files, lambda d: make_spm_tokenizer(d, VOCAB))
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids),
              "logits_noqkvb": reference(t, ids[:NB], qkv_bias=False)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config()}, lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import gguf_copy, llamacpp_goldens, llamacpp_variant

    llamacpp_goldens(OUT, NAME)
    qkv_b = {f"blk.{i}.attn_{n}.bias" for i in range(LAYERS) for n in "qkv"}
    llamacpp_variant(OUT, NAME, "lc_logits_noqkvb", "logits_noqkvb",
                     lambda src, dst: gguf_copy(src, dst, drop=qkv_b), NB)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece")
