"""Make the xverse fixture: a tiny random XVERSE (XverseForCausalLM, a remote-code model with no class in transformers
5.25) checkpoint in the released Hugging Face layout, converted to GGUF by llama.cpp's own converter
(conversion/xverse.py XverseModel), with two references: a torch forward of the HF checkpoint written here from the
XVERSE architecture (modeling_xverse.py: Llama's layer with rotate_half rope, GQA, no biases), and llama.cpp's own
logits (llama-cpp-python) on an F32 copy of the file. Nothing here imports minfer.

Two steps, in two environments (torch + transformers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_xverse_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_xverse_fixture.py goldens

`build` writes, under tests/data/arch/:
  xverse.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight drawn float16-exact, so the
               file holds exactly the weights the reference ran.
  xverse.npz   ids (T,), logits (T, V) float32: the torch forward below (computed in float64) at every position;
               prompt (P,), greedy (N,): its greedy continuation.
  xverse.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds to xverse.npz: lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention); lc_greedy (N,): llama.cpp's greedy continuation of prompt; tok_<i>: llama.cpp's token ids of TEXTS[i]
(Llama.tokenize(add_bos=True, special=True)); and texts to xverse.json.

The checkpoint (xverse/XVERSE-7B's layout, shrunk):
- config.json: architectures XverseForCausalLM, model_type xverse, hidden 32, 4 heads of 8 with 2 kv heads (GQA;
  4 == 2 ** 2: the converter's k permutation is right only without GQA or where n_head == n_kv_head ** 2, as
  conversion/xverse.py _reverse_hf_permute divides the head count by the kv head count), FFN 64, 3 layers, vocab
  304, rms_norm_eps 1e-6, rope_theta 50000 (written as rope.freq_base: TextModel.set_gguf_parameters; not the default,
  so reading it is tested), tie_word_embeddings false.
- model.safetensors, the release's names: model.embed_tokens, model.layers.N.input_layernorm /
  post_attention_layernorm, model.layers.N.self_attn.q_proj / k_proj / v_proj / o_proj (no biases),
  model.layers.N.mlp.gate_proj / up_proj / down_proj, model.norm, lm_head. The converter permutes q_proj / k_proj
  to llama.cpp's NORM rope order.
- tokenizer.json (XverseModel.set_vocab asserts it and reads it through AutoTokenizer): a SentencePiece BPE with byte
  fallback (make_spm_tokenizer: unk 0, <s> 1, </s> 2, <0x00>..) turned into a tokenizers BPE by transformers'
  LlamaTokenizer; the converter writes tokenizer.ggml.model llama with its tokens and types and no scores.
  tokenizer_config.json add_bos_token true (gguf.SpecialVocab).

The reference forward (reference() below) is the architecture as modeling_xverse.py computes it, on the HF tensors:
RMSNorm, q/k/v projections, rotate_half rope on the HF rows (base rope_theta), kv heads shared by H / Hkv consecutive
query heads (repeat_kv), causal softmax(q k / sqrt(Dh)), o_proj, down(silu(gate x) * up x), final norm, lm_head.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "xverse"
SEED = 2026
VOCAB, D, H, HKV, DH, FFN, LAYERS = 304, 32, 4, 2, 8, 64, 3
THETA, EPS = 50000.0, 1e-6
SEQ, PROMPT, NEW = 24, 6, 10
TEXTS = ["The model file and the tokenizer.", " leading space and  two"]


def hf_config() -> dict:
    return {"architectures": ["XverseForCausalLM"], "model_type": "xverse", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": HKV, "hidden_act": "silu", "max_position_embeddings": 8192,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "rope_theta": THETA, "use_cache": True,
            "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False,
            "torch_dtype": "bfloat16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}


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
        t[p + "self_attn.q_proj.weight"] = mat(H * DH, D)
        t[p + "self_attn.k_proj.weight"] = mat(HKV * DH, D)
        t[p + "self_attn.v_proj.weight"] = mat(HKV * DH, D)
        t[p + "self_attn.o_proj.weight"] = mat(D, H * DH)
        t[p + "post_attention_layernorm.weight"] = norm()
        t[p + "mlp.gate_proj.weight"] = mat(FFN, D)
        t[p + "mlp.up_proj.weight"] = mat(FFN, D)
        t[p + "mlp.down_proj.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["lm_head.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """XVERSE's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    rope = neox_rope(T, DH, THETA)                               # rotate_half: the two halves of each head
    x = w["model.embed_tokens.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "input_layernorm.weight"], EPS)
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, H, DH))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, HKV, DH))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, HKV, DH)
        x = x + causal_attention(q, k, v) @ w[p + "self_attn.o_proj.weight"].T    # repeat_kv: kv head j -> H/HKV
        h = rms_norm(x, w[p + "post_attention_layernorm.weight"], EPS)
        m = p + "mlp."
        x = x + swiglu(h, w[m + "gate_proj.weight"], w[m + "up_proj.weight"], w[m + "down_proj.weight"])
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["lm_head.weight"].T).float().numpy()


def make_tokenizer_json(d: Path) -> None:
    """tokenizer.json (+ transformers' tokenizer_config.json, replaced afterwards) from a SentencePiece model of
    VOCAB pieces: transformers' LlamaTokenizer reads tokenizer.model and saves the tokenizers-library BPE."""
    from transformers import LlamaTokenizer

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_internlm2_fixture import make_spm_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        make_spm_tokenizer(Path(tmp), VOCAB)
        tok = LlamaTokenizer.from_pretrained(tmp)
        tok.save_pretrained(str(d))
    if not (d / "tokenizer.json").is_file() or len(json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]) \
            != VOCAB:
        raise SystemExit("tokenizer.json was not written with the expected vocabulary")


def build(llamacpp: Path) -> None:
    import torch

    t = weights(SEED)
    files = {"config.json": hf_config(), "tokenizer_config.json": tokenizer_config()}
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, files, make_tokenizer_json)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config()}, lambda x: reference(t, x), PROMPT, NEW)


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME, texts=TEXTS)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, transformers, sentencepiece", "logits, greedy ids and token ids")
