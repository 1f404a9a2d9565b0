"""Make the orion fixture: a tiny random Orion (OrionForCausalLM, the OrionStarAI Orion-14B-Base / -Chat architecture,
a remote-code model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/orion.py OrionModel, a plain TextModel: no q/k permutation), with two references: a torch forward of the HF
checkpoint written here from the architecture (below), and llama.cpp's own logits (llama-cpp-python) on an F32 copy of
the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_orion_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_orion_fixture.py goldens

`build` writes, under tests/data/arch/:
  orion.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (every weight float16-exact).
  orion.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,), greedy (N,):
              its greedy continuation; qkv_bias (L, H*Dh + 2*KV*Dh): q/k/v biases (float16-exact) that the release
              has none of, and logits_qkvb (NB, V): the forward with them added, on ids[:NB].
  orion.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention);
lc_logits_qkvb (NB, V): llama.cpp on that copy with blk.N.attn_{q,k,v}.bias added (src/models/orion.cpp
load_arch_tensors: create_tensor_qkv, whose q/k/v biases are TENSOR_NOT_REQUIRED; build_qkv adds each one present).

The checkpoint (the release's config.json, OrionStarAI/Orion-14B-Base, shrunk): hidden 32, 4 heads of 8 (head_dim is
hidden / heads: OrionAttention has no head_dim setting, and the converter writes neither key_length nor
rope.dimension_count), 2 kv heads (the release has 40 of 40; HF's repeat_kv takes fewer), FFN 64, 2 layers, vocab 320,
rms_norm_eps 1e-5 (the LayerNorms' eps despite its name), rope_theta 1e4 (the release's; the converter writes no
rope.freq_base and llama.cpp's default is 1e4), attention_bias false, an untied lm_head. tokenizer.model: a
SentencePiece BPE with byte fallback (gen_internlm2_fixture.make_spm_tokenizer; OrionModel.set_vocab is
_set_vocab_sentencepiece).

The architecture (modeling_orion.py, as vLLM's models/orion.py restates it; src/models/orion.cpp), as the reference
computes it on the HF tensors: nn.LayerNorm(hidden, eps=rms_norm_eps) with weight and bias before attention
(input_layernorm), before the MLP (post_attention_layernorm) and at the end (model.norm) -- llama.cpp LLM_NORM with
attn_norm_b / ffn_norm_b / output_norm_b; q/k/v without bias; rope over whole heads in HALVES (rotate_half on the HF
rows: llama_model_rope_type ORION -> NEOX, and the converter permutes nothing), base rope_theta; GQA with kv head
i // (H / KV); softmax(q k / sqrt(Dh)); o = W_o attn (no bias); SwiGLU MLP without biases; lm_head.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "orion"
SEED = 2047
VOCAB, D, H, KV, FFN, LAYERS = 320, 32, 4, 2, 64, 2
DH = D // H
THETA, EPS = 1e4, 1e-5
SEQ, PROMPT, NEW, NB = 28, 8, 16, 8


def hf_config() -> dict:
    return {"architectures": ["OrionForCausalLM"], "model_type": "orion", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "hidden_act": "silu", "max_position_embeddings": 256,
            "max_sequence_length": 256, "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None,
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "torch_dtype": "float16",
            "auto_map": {"AutoConfig": "configuration_orion.OrionConfig",
                         "AutoModelForCausalLM": "modeling_orion.OrionForCausalLM"}}


def tokenizer_config() -> dict:
    return {"add_bos_token": False, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<unk>"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), LayerNorm weights around 1, LayerNorm
    biases ~ N(0, 0.3^2) (large enough that each one moves the logits well past the tolerance)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    def bias(n=D):
        return (0.3 * torch.randn(n, generator=g)).half().float()

    # embedding rows with a mean far from 0, so LayerNorm's mean removal matters as much as RMSNorm's scale
    t = {"model.embed_tokens.weight": (0.5 * torch.randn(VOCAB, D, generator=g) + 0.4).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "input_layernorm.bias"] = bias()
        for n, o in (("q", H * DH), ("k", KV * DH), ("v", KV * DH)):
            t[p + f"self_attn.{n}_proj.weight"] = mat(o, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "post_attention_layernorm.bias"] = bias()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["model.norm.bias"] = bias()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def qkv_biases(seed: int) -> np.ndarray:
    """(L, H*Dh + 2*KV*Dh) float16-exact q|k|v biases ~ N(0, 0.5^2), for the llama.cpp-only optional-bias case."""
    rng = np.random.default_rng(seed + 1)
    return (0.5 * rng.standard_normal((LAYERS, (H + 2 * KV) * DH))).astype(np.float16).astype(np.float32)


def split_qkv(row: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return row[:H * DH], row[H * DH:(H + KV) * DH], row[(H + KV) * DH:]


def reference(t: dict, ids: list[int], qkv_b: np.ndarray | None = None) -> np.ndarray:
    """Orion's forward on the HF tensors, float64 -> (T, V) float32 logits (qkv_b: q/k/v biases to add, per layer)."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def ln(x, name):                                      # nn.LayerNorm: biased variance, eps inside the root
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) * torch.rsqrt(var + EPS) * w[name + ".weight"] + w[name + ".bias"]

    rope = neox_rope(T, DH, THETA)                        # rotate_half: the halves (x[i], x[i + Dh/2])
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        h = ln(x, p + "input_layernorm")
        q, k, v = (h @ w[a + f"{n}_proj.weight"].T for n in "qkv")
        if qkv_b is not None:
            bq, bk, bv = (torch.from_numpy(b).double() for b in split_qkv(qkv_b[i]))
            q, k, v = q + bq, k + bk, v + bv
        q, k = rope(q.reshape(T, H, DH)), rope(k.reshape(T, KV, DH))
        x = x + causal_attention(q, k, v.reshape(T, KV, DH)) @ w[a + "o_proj.weight"].T
        m = p + "mlp."
        h = ln(x, p + "post_attention_layernorm")
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    x = ln(x, "model.norm")
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
    qb = qkv_biases(SEED)
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids), "qkv_bias": qb,
              "logits_qkvb": reference(t, ids[:NB], qb)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config()}, lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import gguf_copy, llamacpp_goldens, llamacpp_variant

    llamacpp_goldens(OUT, NAME)
    extra = {}
    for i, row in enumerate(np.load(OUT / f"{NAME}.npz")["qkv_bias"]):
        for n, b in zip("qkv", split_qkv(row)):
            extra[f"blk.{i}.attn_{n}.bias"] = b
    llamacpp_variant(OUT, NAME, "lc_logits_qkvb", "logits_qkvb", lambda src, dst: gguf_copy(src, dst, add=extra), NB)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece")
