"""Make the baichuan fixture: a tiny random Baichuan-7B (BaiChuanForCausalLM / BaichuanForCausalLM, a remote-code
model with no class in transformers 5.25) checkpoint in the released Hugging Face layout, converted to GGUF by
llama.cpp's own converter (conversion/baichuan.py BaichuanModel, with CONVERT_CODE's fix of its recursion), with two references: a torch forward of the HF
checkpoint written here from the Baichuan-7B architecture, and llama.cpp's own logits (llama-cpp-python) on an F32
copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_baichuan_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_baichuan_fixture.py goldens

Why 32 layers: llama.cpp picks the position encoding from the layer count alone (src/models/baichuan.cpp
load_arch_hparams: 32 layers -> LLM_TYPE_7B, rope; 40 -> LLM_TYPE_13B, ALiBi with max bias 8; any other count ->
LLM_TYPE_UNKNOWN, which the graph runs with neither). A 7B-kind fixture must therefore have 32 layers, so it is
narrow: hidden 16, one head of 16, FFN 16, vocab 304 (the repository's size budget).

`build` writes, under tests/data/arch/:
  baichuan.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight drawn float16-exact, so
                 the file holds exactly the weights the reference ran.
  baichuan.npz   ids (T,), logits (T, V) float32: the torch forward below (computed in float64) at every position;
                 prompt (P,), greedy (N,): its greedy continuation.
  baichuan.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds to baichuan.npz: lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention); lc_greedy (N,): llama.cpp's greedy continuation of prompt; tok_<i>: llama.cpp's token ids of TEXTS[i]
(Llama.tokenize(add_bos=True, special=True)); and texts to baichuan.json.

The checkpoint (baichuan-inc/Baichuan-7B's config.json and modeling_baichuan.py, shrunk):
- config.json: architectures BaiChuanForCausalLM, model_type baichuan, hidden 16, 1 head of 16, FFN 16, 32
  layers, vocab 304, rms_norm_eps 1e-6, no rope_theta (modeling_baichuan.py's RotaryEmbedding base 10000; the
  converter writes no freq_base key), tie_word_embeddings false.
- model.safetensors, the release's names: model.embed_tokens, model.layers.N.input_layernorm /
  post_attention_layernorm, model.layers.N.self_attn.W_pack (3*D, D: q rows, then k, then v) / o_proj,
  model.layers.N.mlp.gate_proj / up_proj / down_proj, model.norm, lm_head. The converter splits W_pack in thirds
  and permutes the q/k thirds to llama.cpp's NORM rope order (BaichuanModel._reverse_hf_permute_part).
- lm_head is plain (Baichuan-7B). Baichuan2's NormHead normalizes the lm_head rows inside the forward; the converter
  maps lm_head.weight as written (no normalization baked in) and llama.cpp's graph applies none either.
- tokenizer.model: a SentencePiece BPE with byte fallback (make_spm_tokenizer: unk 0, <s> 1, </s> 2, <0x00>..);
  tokenizer_config.json add_bos_token true (the converter's _set_vocab_sentencepiece).

The reference forward (reference() below) is the architecture as modeling_baichuan.py computes it, on the HF
tensors: RMSNorm, W_pack split in thirds, rotate_half rope on the HF rows (base 10000), causal softmax(q k /
sqrt(Dh)), o_proj, down(silu(gate x) * up x), final norm, lm_head.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "baichuan"
SEED = 2025
VOCAB, D, H, DH, FFN, LAYERS = 304, 16, 1, 16, 16, 32
THETA, EPS = 10000.0, 1e-6
SEQ, PROMPT, NEW = 24, 6, 10
TEXTS = ["The model file and the tokenizer.", " leading space and  two"]


# BaichuanModel.modify_tensors passes every tensor but W_pack to `self.modify_tensors(data_torch,
# self.map_tensor_name(name), bid)`: itself again, with the mapped name, which map_tensor_name cannot map a second
# time (RecursionError in 0.3.36's converter). The patch sends those tensors to TextModel.modify_tensors (the
# base class's mapping, once), as meant; W_pack still goes through the converter's own split and permutation.
CONVERT_CODE = (
    "import conversion.baichuan as _bc\n"
    "_bc_mt = _bc.BaichuanModel.modify_tensors\n"
    "def _bc_fixed(self, data_torch, name, bid):\n"
    "    if bid is not None and name == f'model.layers.{bid}.self_attn.W_pack.weight':\n"
    "        yield from _bc_mt(self, data_torch, name, bid)\n"
    "    else:\n"
    "        yield from _bc.TextModel.modify_tensors(self, data_torch, name, bid)\n"
    "_bc.BaichuanModel.modify_tensors = _bc_fixed\n")


def hf_config() -> dict:
    return {"architectures": ["BaiChuanForCausalLM"], "model_type": "baichuan", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "hidden_act": "silu", "max_position_embeddings": 4096, "initializer_range": 0.02,
            "rms_norm_eps": EPS, "use_cache": True, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
            "tie_word_embeddings": False, "torch_dtype": "float16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<unk>", "tokenizer_class": "BaiChuanTokenizer"}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in), norm weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.embed_tokens.weight": (torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm()
        t[p + "self_attn.W_pack.weight"] = mat(3 * H * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """Baichuan-7B's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)

    def rms(x, wt):
        return rms_norm(x, wt, EPS)

    rope = neox_rope(T, DH, THETA)                                # rotate_half: the two halves of each head
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        qkv = (h @ w[p + "self_attn.W_pack.weight"].T).reshape(T, 3, H, DH)   # W_pack: q, k, v thirds
        q, k, v = rope(qkv[:, 0]), rope(qkv[:, 1]), qkv[:, 2]
        x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        m = p + "mlp."
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    x = rms(x, w["model.norm.weight"])
    return (x @ w["lm_head.weight"].T).float().numpy()


def build(llamacpp: Path) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer     # the SentencePiece BPE with byte fallback, VOCAB pieces

    t = weights(SEED)
    # raw_config: the converter reads config.json as written (AutoConfig knows no baichuan without remote code)
    files = {"config.json": hf_config(), "tokenizer_config.json": tokenizer_config()}
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, files, lambda d: make_spm_tokenizer(d, VOCAB), extra=CONVERT_CODE)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config()}, lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME, TEXTS)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece", "logits, greedy ids and token ids")
