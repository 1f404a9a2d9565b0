"""Make the plamo fixture: a tiny random PLaMo-13B (PlamoForCausalLM, pfnet/plamo-13b's architecture, a remote-code
model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own converter
(conversion/plamo.py PlamoModel, with its q / o head shuffle generalized to this checkpoint's shape: CONVERT_CODE),
with two references: a torch forward of the HF checkpoint written here from the architecture (below), and llama.cpp's
own logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_plamo_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_plamo_fixture.py goldens

`build` writes, under tests/data/arch/:
  plamo.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (every weight float16-exact).
  plamo.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,), greedy (N,):
              its greedy continuation.
  plamo.json  the config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention).

The checkpoint (pfnet/plamo-13b's config.json, shrunk): hidden 48, 6 heads of 8, n_shared_head 3 (so ceil(6 / 3) = 2
kv heads, each shared by 3 query heads: 2 x 3 is not square, so the shuffle's two axes cannot be swapped unseen), FFN
64, 2 layers, vocab 320, rms_norm_eps 1e-6, an untied lm_head. tokenizer.model: a SentencePiece BPE with byte fallback
(gen_internlm2_fixture.make_spm_tokenizer; PlamoModel.set_vocab is _set_vocab_sentencepiece).

The architecture (modeling_plamo.py as mlx-lm's models/plamo.py ports it; src/models/plamo.cpp), as the reference
computes it on the HF tensors: ONE RMSNorm per layer (model.layers.layers.N.norm) feeds both the attention and the
SwiGLU MLP, and x + attn + mlp is the next residual (PlamoDecoderLayer; plamo.cpp: ffn on sa_inp, then ffn + sa_out
+ inpL); q/k/v/o without bias; rope over whole heads in HALVES (rotate_half, base 10000: the remote code's constant;
the converter writes no rope.freq_base, llama.cpp's default is 10000; llama_model_rope_type PLAMO -> NEOX); the kv
heads shared TILED: query head j reads kv head j % KV (modeling_plamo _expand_kv / mlx-lm mx.tile(keys, [1,
n_shared_head, 1, 1])), not llama's j // (H / KV); softmax(q k / sqrt(Dh)); final norm; lm_head.

The converter's GQA layout (conversion/plamo.py PlamoModel, "shuffle for broadcasting of gqa in ggml_mul_mat"):
attn_q's rows, seen as (n_shared_head, KV, Dh, D), become (KV, n_shared_head, Dh, D), and attn_output's columns the
same, so the file's query head i * n_shared_head + s is HF's head s * KV + i and llama.cpp's grouping j // n_shared
gives it kv head i -- HF's tiled sharing. It hard-codes the 13B's shape (reshape(8, 5, 128, 5120), an assert on
(5120, 5120)) and add_head_count_kv(5) ("hparams['num_key_value_heads'] is wrong"); CONVERT_CODE runs the same two
permutations on (n_shared_head, ceil(H / n_shared_head)) and writes that kv head count, nothing else changed.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "plamo"
SEED = 2043
VOCAB, D, H, SHARED, FFN, LAYERS = 320, 48, 6, 3, 64, 2
KV, DH = -(-H // SHARED), D // H            # modeling_plamo: k_num_heads = ceil(q_num_heads / n_shared_head)
THETA, EPS = 10000.0, 1e-6
SEQ, PROMPT, NEW = 26, 8, 16

# run in the converter's process before convert_hf_to_gguf (gen_arch_fixtures.convert's `extra`): PlamoModel's
# shuffles and kv head count for any (n_shared_head, kv heads) instead of the 13B's (8, 5)
CONVERT_CODE = (
    "import conversion.plamo as _plamo\n"
    "def _plamo_geom(self):\n"
    "    hp = self.hparams\n"
    "    h, s, d = hp['num_attention_heads'], hp['n_shared_head'], hp['hidden_size']\n"
    "    assert h % s == 0, 'the converter needs whole groups'\n"
    "    return s, h // s, d // h, d\n"
    "def _plamo_q(self, t):\n"
    "    s, kv, dh, d = _plamo_geom(self)\n"
    "    return t.reshape(s, kv, dh, d).permute(1, 0, 2, 3).reshape(d, d)\n"
    "def _plamo_o(self, t):\n"
    "    s, kv, dh, d = _plamo_geom(self)\n"
    "    return t.reshape(d, s, kv, dh).permute(0, 2, 1, 3).reshape(d, d)\n"
    "_plamo.PlamoModel.shuffle_attn_q_weight = _plamo_q\n"
    "_plamo.PlamoModel.shuffle_attn_output_weight = _plamo_o\n"
    "_plamo_params = _plamo.PlamoModel.set_gguf_parameters\n"
    "def _plamo_params_kv(self):\n"
    "    w = self.gguf_writer\n"
    "    add = w.add_head_count_kv\n"
    "    w.add_head_count_kv = lambda n: add(_plamo_geom(self)[1])\n"
    "    try:\n"
    "        _plamo_params(self)\n"
    "    finally:\n"
    "        del w.add_head_count_kv\n"
    "_plamo.PlamoModel.set_gguf_parameters = _plamo_params_kv\n")


def hf_config() -> dict:
    return {"architectures": ["PlamoForCausalLM"], "model_type": "plamo", "vocab_size": VOCAB, "hidden_size": D,
            "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": H, "n_shared_head": SHARED, "max_position_embeddings": 4096,
            "rms_norm_eps": EPS, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
            "pad_token_id": 0, "tokenizer_class": "PlamoTokenizer", "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (0.5 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.layers.{i}."
        t[p + "norm.weight"] = norm()
        for n, o in (("q", H * DH), ("k", KV * DH), ("v", KV * DH)):
            t[p + f"self_attn.{n}_proj.weight"] = mat(o, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """PLaMo's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    rope = neox_rope(T, DH, THETA)                        # rotate_half: the halves (x[i], x[i + Dh/2])

    def expand(kv):                                       # (T, KV, Dh) -> (T, H, Dh): head j reads kv j % KV
        return kv.repeat(1, SHARED, 1)[:, :H]

    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.layers.{i}."
        h = rms_norm(x, w[p + "norm.weight"], EPS)
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
        k = expand(rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV, DH)))
        v = expand((h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV, DH))
        a = causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T     # k, v already H heads
        m = p + "mlp."
        f = swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
        x = x + a + f                                     # both branches read h; one residual add
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, lambda d: make_spm_tokenizer(d, VOCAB),
                       extra=CONVERT_CODE)
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
    cli(__doc__, build, goldens, "torch, sentencepiece")
