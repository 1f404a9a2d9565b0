"""Make the codeshell fixture: a tiny random CodeShell (CodeShellForCausalLM, WisdomShell/CodeShell-7B and -Chat's
architecture, a remote-code model with no class in transformers 5.25) checkpoint, converted to GGUF by llama.cpp's own
converter (conversion/codeshell.py CodeShellModel, a plain TextModel: tensors renamed only, no permutation), with two
references: a torch forward of the HF checkpoint written here from the architecture (below), and llama.cpp's own
logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + tokenizers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_codeshell_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_codeshell_fixture.py goldens

`build` writes, under tests/data/arch/:
  codeshell.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below (every weight float16-exact).
  codeshell.npz   ids (T,), logits (T, V): the torch forward below (float64) at every position; prompt (P,),
                  greedy (N,): its greedy continuation; logits_noqkvb (NB, V): the forward without the c_attn bias,
                  on ids[:NB]; logits_f16gelu (NB, V): the forward with llama.cpp's CPU GELU (a float16 table,
                  gelu_f16_table) on ids[:NB], which accounts for all of llama.cpp's ~5e-4 miss of `logits`.
  codeshell.json  the config.json written, the seed.
`goldens` adds: lc_logits (T, V), lc_greedy (N,): llama.cpp on an F32 copy (F32 KV cache, no flash attention);
lc_logits_noqkvb (NB, V): llama.cpp on that copy without the blk.N.attn_qkv.bias tensors (create_tensor_qkv takes
the fused bias as TENSOR_NOT_REQUIRED).

The checkpoint (the release's config.json, WisdomShell/codeshell model/config.json, shrunk): n_embd 32, 4 heads of 8,
num_query_groups 2 (group_query_attention), n_inner 128 = 4 n_embd (the converter writes feed_forward_length
4 * n_embd whatever n_inner says), 2 layers, vocab 320, layer_norm_epsilon 1e-5, position_embedding_type "rope",
rope_scaling null, activation gelu_pytorch_tanh; tie_word_embeddings false (an lm_head unlike wte: the release's
config leaves the tie at its default and ships lm_head.weight, which the converter writes as output.weight; untied
weights here show which one is the head). tokenizer: a byte-level BPE (gen_arch_fixtures.make_tokenizer; the
converter's set_vocab is TextModel's _set_vocab_gpt2, convert() patches the pre-tokenizer hash to 'gpt-2').

The architecture (modeling_codeshell.py: CodeShellModel / CodeShellBlock / CodeShellAttention / CodeShellMLP;
src/models/codeshell.cpp), as the reference computes it on the HF tensors: x = wte[ids] (no wpe with rope); each
block: nn.LayerNorm ln_1 (weight, bias); c_attn (nn.Linear with bias) split (n_embd, kv_dim, kv_dim) into q, k, v;
rope on q and k over whole heads in HALVES (rotate_half; CodeShellRotaryEmbedding's base 10000, never configurable);
repeat_kv (kv head i // (H / KV)); softmax(q k / sqrt(head_dim)) causal; c_proj with bias; residual; ln_2;
c_proj(gelu_tanh(c_fc(h))) with biases; residual; ln_f; lm_head without bias.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rel_err

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "codeshell"
SEED = 2041
VOCAB, D, H, KV, FFN, LAYERS = 320, 32, 4, 2, 128, 2
DH = D // H
THETA, EPS = 1e4, 1e-5
SEQ, PROMPT, NEW, NB = 28, 8, 16, 8


def hf_config() -> dict:
    return {"architectures": ["CodeShellForCausalLM"], "model_type": "codeshell", "activation_function":
            "gelu_pytorch_tanh", "group_query_attention": True, "num_query_groups": KV,
            "position_embedding_type": "rope", "rope_scaling": None, "vocab_size": VOCAB, "n_embd": D,
            "n_inner": FFN, "n_layer": LAYERS, "n_head": H, "n_positions": 256, "layer_norm_epsilon": EPS,
            "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0, "scale_attn_weights": True,
            "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), LayerNorm weights around 1, every
    bias (LayerNorm and Linear) ~ N(0, 0.3^2) (large enough that each one moves the logits well past the
    tolerance)."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm(n=D):
        return (1.0 + 0.3 * torch.randn(n, generator=g)).half().float()

    def bias(n):
        return (0.3 * torch.randn(n, generator=g)).half().float()

    t = {"transformer.wte.weight": (0.5 * torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        t[p + "ln_1.weight"], t[p + "ln_1.bias"] = norm(), bias(D)
        t[p + "attn.c_attn.weight"], t[p + "attn.c_attn.bias"] = mat(D + 2 * KV * DH, D), bias(D + 2 * KV * DH)
        t[p + "attn.c_proj.weight"], t[p + "attn.c_proj.bias"] = mat(D, D), bias(D)
        t[p + "ln_2.weight"], t[p + "ln_2.bias"] = norm(), bias(D)
        t[p + "mlp.c_fc.weight"], t[p + "mlp.c_fc.bias"] = mat(FFN, D), bias(FFN)
        t[p + "mlp.c_proj.weight"], t[p + "mlp.c_proj.bias"] = mat(D, FFN), bias(D)
    t["transformer.ln_f.weight"], t["transformer.ln_f.bias"] = norm(), bias(D)
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def gelu_f16_table(u):
    """ggml's CPU GELU (ggml-cpu/vec.h ggml_vec_gelu_f32 under GGML_GELU_FP16, which vec.h defines): 0 at or below
    -10, x at or above 10, else the table ggml_table_gelu_f16 (ggml_gelu_f32 of each float16, rounded to float16)
    at float16(x). What llama.cpp's CPU backend computes in place of the tanh GELU."""
    import torch

    x16 = u.to(torch.float16).double()
    y = torch.nn.functional.gelu(x16.float(), approximate="tanh").to(torch.float16).double()
    return torch.where(u <= -10, torch.zeros_like(u), torch.where(u >= 10, u, y))


def reference(t: dict, ids: list[int], qkv_bias: bool = True, f16_gelu: bool = False) -> np.ndarray:
    """CodeShell's forward on the HF tensors, float64 -> (T, V) float32 logits. f16_gelu: with llama.cpp's CPU
    GELU table (gelu_f16_table) in place of HF's tanh GELU."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def ln(x, name):
        mu = x.mean(-1, keepdim=True)
        var = (x - mu).pow(2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + EPS) * w[name + ".weight"] + w[name + ".bias"]

    def lin(x, name, use_bias=True):
        y = x @ w[name + ".weight"].T
        return y + w[name + ".bias"] if use_bias else y

    rope = neox_rope(T, DH, THETA)                        # rotate_half: the halves (x[i], x[i + Dh/2])
    x = w["transformer.wte.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"transformer.h.{i}."
        h = ln(x, p + "ln_1")
        q, k, v = lin(h, p + "attn.c_attn", qkv_bias).split((D, KV * DH, KV * DH), -1)
        o = causal_attention(rope(q.reshape(T, H, DH)), rope(k.reshape(T, KV, DH)), v.reshape(T, KV, DH))
        x = x + lin(o, p + "attn.c_proj")
        h = ln(x, p + "ln_2")
        u = lin(h, p + "mlp.c_fc")
        f = gelu_f16_table(u) if f16_gelu else torch.nn.functional.gelu(u, approximate="tanh")
        x = x + lin(f, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import make_tokenizer

    t = weights(SEED)
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, {"config.json": hf_config()}, make_tokenizer)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids),
              "logits_noqkvb": reference(t, ids[:NB], qkv_bias=False),
              "logits_f16gelu": reference(t, ids[:NB], f16_gelu=True)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config()},
           lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import gguf_copy, llamacpp_goldens, llamacpp_variant

    llamacpp_goldens(OUT, NAME)
    qkv_b = {f"blk.{i}.attn_qkv.bias" for i in range(LAYERS)}
    arrays = llamacpp_variant(OUT, NAME, "lc_logits_noqkvb", "logits_noqkvb",
                              lambda src, dst: gguf_copy(src, dst, drop=qkv_b), NB)
    print(f"lc_logits vs logits_f16gelu: max rel err "
          f"{rel_err(arrays['lc_logits'][:NB], arrays['logits_f16gelu']):.2e}")


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, tokenizers")
