"""Make the maincoder fixture: a tiny random Maincoder (MaincoderForCausalLM, Maincode/Maincoder-1B's architecture, a
remote-code model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/maincoder.py MaincoderModel, a plain TextModel: no q/k permutation), with two references: a torch forward
of the HF checkpoint written here from the architecture (below), and llama.cpp's own logits (llama-cpp-python) on an
F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_maincoder_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_maincoder_fixture.py goldens

`build` writes, under tests/data/arch/:
  maincoder.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (weights drawn float16-exact).
  maincoder.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,),
                  greedy (N,): its greedy continuation.
  maincoder.json  the config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention).

The architecture (conversion/maincoder.py; src/models/maincoder.cpp), as the reference computes it on the HF
tensors: RMSNorm pre-norms; q/k/v/o without bias; head_dim 24 from config.json (4 x 24 = 96 != hidden 64: the
converter writes rope.dimension_count = head_dim, key_length 24); rope over whole heads on ADJACENT pairs
(x[2i], x[2i+1]) of the rows as the checkpoint has them (llama_model_rope_type: MAINCODER -> NORM, and the
converter permutes nothing), base rope_theta; THEN each q and k head RMS-normalized with self_attn.q_norm /
k_norm (maincoder.cpp: build_norm after ggml_rope_ext); GQA with kv head i // (H / KV); softmax(q k / sqrt(Dh));
SwiGLU MLP; final norm; the lm head tied to the embedding (tie_word_embeddings, no lm_head tensor: llama.cpp's
loader falls back to token_embd).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "maincoder"
SEED = 2027
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 64, 4, 2, 24, 96, 2
THETA, EPS = 1e4, 1e-6
SEQ, PROMPT, NEW = 40, 8, 16


def hf_config() -> dict:
    return {"architectures": ["MaincoderForCausalLM"], "model_type": "maincoder", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "head_dim": DH, "hidden_act": "silu", "max_position_embeddings": 256,
            "rms_norm_eps": EPS, "rope_theta": THETA, "rope_scaling": None, "attention_bias": False,
            "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1; the embedding
    (also the lm head) ~ N(0, 0.09): small beside the layers, so the tied head does not just echo the last token."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (0.3 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
        t[p + "self_attn.k_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.v_proj.weight"] = mat(KV * DH, D)
        t[p + "self_attn.q_norm.weight"] = norm(DH)
        t[p + "self_attn.k_norm.weight"] = norm(DH)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """Maincoder's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    pos = torch.arange(T, dtype=torch.float64)
    inv = THETA ** (-torch.arange(0, DH, 2, dtype=torch.float64) / DH)
    ang = pos[:, None] * inv[None]                        # (T, Dh/2): pair i turns by pos * inv[i]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]     # (T, 1, Dh/2)

    def rope(x):                                          # adjacent pairs (x[2i], x[2i+1])
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, DH))
        q, k = rms(q, w[p + "self_attn.q_norm.weight"]), rms(k, w[p + "self_attn.k_norm.weight"])   # after rope
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, DH)
        x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    x = rms(x, w["model.norm.weight"])
    return (x @ w["model.embed_tokens.weight"].T).float().numpy()      # tied lm head


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    # byte-level BPE (convert() patches the pre-tokenizer hash to 'gpt-2'); AutoConfig knows no 'maincoder'
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config()},
           lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
