"""Make the internlm2 fixture: a tiny random InternLM2 (InternLM2ForCausalLM, a remote-code model with no class in
transformers 5.25) checkpoint in the released Hugging Face layout, converted to GGUF by llama.cpp's own converter
(conversion/internlm.py InternLM2Model), with two references: a torch forward of the HF checkpoint written here from
the InternLM2 architecture, and llama.cpp's own logits (llama-cpp-python) on an F32 copy of the file. Nothing here
imports minfer.

Two steps, in two environments (torch + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_internlm2_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_internlm2_fixture.py goldens

`build` writes, under tests/data/arch/:
  internlm2.gguf  convert_hf_to_gguf.py --outtype f16 of the checkpoint below; every weight drawn float16-exact, so
                  the file holds exactly the weights the reference ran.
  internlm2.npz   ids (T,), logits (T, V) float32: the torch forward below (computed in float64) at every position;
                  prompt (P,), greedy (N,): its greedy continuation.
  internlm2.json  the config.json and tokenizer_config.json written, the seed.
`goldens` adds to internlm2.npz: lc_logits (T, V): llama.cpp's logits of ids (F32 weights, F32 KV cache, no flash
attention); lc_greedy (N,): llama.cpp's greedy continuation of prompt; tok_<i>: llama.cpp's token ids of TEXTS[i]
(Llama.tokenize(add_bos=True, special=True)); and texts to internlm2.json.

The checkpoint (internlm/internlm2_5-7b-chat's config.json and modeling_internlm2.py, shrunk):
- config.json: architectures InternLM2ForCausalLM, model_type internlm2, hidden 64, 4 heads of 16, 2 kv heads (2
  query heads per kv head), FFN 96, 2 layers, vocab 320, rms_norm_eps 1e-6, bias false, rope_theta 1e6,
  rope_scaling {type dynamic, factor 2.0} (the release's: dynamic NTK applies past max_position_embeddings only, 256
  here, and llama.cpp's converter writes no scaling key for it: conversion/base.py TextModel.set_gguf_parameters
  "dynamic": pass), tie_word_embeddings false.
- model.safetensors, the release's names: model.tok_embeddings, model.layers.N.attention_norm / ffn_norm,
  model.layers.N.attention.wqkv / wo, model.layers.N.feed_forward.w1 (gate) / w3 (up) / w2 (down), model.norm,
  output. wqkv is (H*Dh + 2*KV*Dh, D) with its rows grouped per kv head: for kv head g, its Q_PER_KV query heads'
  rows, then its key's, then its value's (modeling_internlm2.py: rearrange(qkv, "b q (h gs d) -> b q h gs d",
  gs=2 + num_key_value_groups); query head g * Q_PER_KV + j belongs to kv head g).
- tokenizer.model: a SentencePiece BPE with byte fallback (make_spm_tokenizer: unk 0, <s> 1, </s> 2, <0x00>..);
  tokenizer_config.json as the release's: add_bos_token true, the ChatML chat template, and added_tokens_decoder
  putting <|im_end|> and <|im_start|> (special) at the last two ids, over pieces of the SentencePiece model (the
  release has them at 92542 / 92543 over [UNUSED_TOKEN_*] pieces). The converter (InternLM2Model.set_vocab) makes
  them CONTROL tokens and, for a chat model, writes eos = <|im_end|>'s id.

The reference forward (reference() below) is the architecture as modeling_internlm2.py computes it, on the HF
tensors: RMSNorm, wqkv split per kv group as above, rotate_half rope on the HF rows (base rope_theta), GQA with
kv head g serving query heads g * Q_PER_KV .. g * Q_PER_KV + Q_PER_KV - 1, causal softmax(q k / sqrt(Dh)), wo,
w2(silu(w1 x) * w3 x), final norm, output.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from fixture_ref import causal_attention, checkpoint_to_gguf, cli, finish, neox_rope, rms_norm, swiglu

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
NAME = "internlm2"
SEED = 2024
VOCAB, D, H, KV, DH, FFN, LAYERS = 320, 64, 4, 2, 16, 96, 2
Q_PER_KV = H // KV
THETA, EPS = 1e6, 1e-6
SEQ, PROMPT, NEW = 40, 8, 16
IM_END, IM_START = VOCAB - 2, VOCAB - 1
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
                 "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
                 "{{ '<|im_start|>assistant\n' }}{% endif %}")
TEXTS = ["<|im_start|>user\nminfer runs GGUF models<|im_end|>\n<|im_start|>assistant\n",
         "The model file and the tokenizer.", " leading space and  two"]


def hf_config() -> dict:
    return {"architectures": ["InternLM2ForCausalLM"], "model_type": "internlm2", "vocab_size": VOCAB,
            "hidden_size": D, "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": H,
            "num_key_value_heads": KV, "hidden_act": "silu", "max_position_embeddings": 256,
            "initializer_range": 0.02, "rms_norm_eps": EPS, "use_cache": True, "pad_token_id": 0,
            "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "bias": False,
            "rope_theta": THETA, "rope_scaling": {"type": "dynamic", "factor": 2.0}, "torch_dtype": "float16"}


def tokenizer_config() -> dict:
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "pad_token": "</s>", "chat_template": CHAT_TEMPLATE,
            "tokenizer_class": "InternLM2Tokenizer",
            "added_tokens_decoder": {str(IM_END): {"content": "<|im_end|>", "special": True},
                                     str(IM_START): {"content": "<|im_start|>", "special": True}}}


def weights(seed: int) -> dict:
    """The HF tensors, float16-exact float32: matrices ~ N(0, 1.5 / fan_in) as gen_arch_fixtures.randomize, norm
    weights around 1."""
    import torch

    g = torch.Generator().manual_seed(seed)

    def mat(o, i):
        return (torch.randn(o, i, generator=g) * (1.5 / i ** 0.5)).half().float()

    def norm():
        return (1.0 + 0.2 * torch.randn(D, generator=g)).half().float()

    t = {"model.tok_embeddings.weight": (torch.randn(VOCAB, D, generator=g)).half().float()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t[p + "attention_norm.weight"] = norm()
        t[p + "attention.wqkv.weight"] = mat((H + 2 * KV) * DH, D)
        t[p + "attention.wo.weight"] = mat(D, H * DH)
        t[p + "ffn_norm.weight"] = norm()
        t[p + "feed_forward.w1.weight"] = mat(FFN, D)
        t[p + "feed_forward.w3.weight"] = mat(FFN, D)
        t[p + "feed_forward.w2.weight"] = mat(D, FFN)
    t["model.norm.weight"] = norm()
    t["output.weight"] = mat(VOCAB, D)
    return t


def reference(t: dict, ids: list[int]) -> np.ndarray:
    """InternLM2's forward on the HF tensors, float64 -> (T, V) float32 logits."""
    import torch

    w = {k: v.double() for k, v in t.items()}
    T = len(ids)
    rope = neox_rope(T, DH, THETA)                               # rotate_half: the two halves of each head
    x = w["model.tok_embeddings.weight"][torch.tensor(ids)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms_norm(x, w[p + "attention_norm.weight"], EPS)
        qkv = (h @ w[p + "attention.wqkv.weight"].T).reshape(T, KV, Q_PER_KV + 2, DH)
        q = qkv[:, :, :Q_PER_KV].reshape(T, H, DH)               # head g * Q_PER_KV + j
        k, v = qkv[:, :, Q_PER_KV], qkv[:, :, Q_PER_KV + 1]      # (T, KV, Dh)
        # causal_attention's repeat_kv: kv head g -> heads gQ..gQ+Q-1
        x = x + causal_attention(rope(q), rope(k), v) @ w[p + "attention.wo.weight"].T
        h = rms_norm(x, w[p + "ffn_norm.weight"], EPS)
        f = p + "feed_forward."
        x = x + swiglu(h, w[f + "w1.weight"], w[f + "w3.weight"], w[f + "w2.weight"])
    x = rms_norm(x, w["model.norm.weight"], EPS)
    return (x @ w["output.weight"].T).float().numpy()


def make_spm_tokenizer(path: Path, vocab: int = VOCAB) -> None:
    """A SentencePiece BPE of `vocab` pieces with byte fallback (as the release's tokenizer.model: <0x00>..<0xFF>
    pieces, so any text encodes; llama.cpp's SPM tokenizer needs them for a character outside the pieces, its
    byte_to_token): unk 0, <s> 1, </s> 2, the 256 byte pieces, then characters and merges trained on the README
    folded to lower-case letters, digits and spaces (few characters, so merges fit in VOCAB)."""
    import io
    import re

    import sentencepiece as spm

    text = re.sub(r"[^a-z0-9 ]+", " ", (ROOT / "README.md").read_text(encoding="utf-8").lower())
    lines = [ln.strip() for ln in re.split(r" {2,}", text) if len(ln.strip()) > 3]
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buf, vocab_size=vocab,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2)
    (path / "tokenizer.model").write_bytes(buf.getvalue())


def build(llamacpp: Path) -> None:
    import torch

    t = weights(SEED)
    files = {"config.json": hf_config(), "tokenizer_config.json": tokenizer_config()}
    checkpoint_to_gguf(OUT, NAME, llamacpp, t, files, make_spm_tokenizer)
    rng = np.random.default_rng(SEED)
    ids = rng.integers(3, VOCAB - 2, size=SEQ).tolist()
    arrays = {"ids": np.array(ids, dtype=np.int64), "logits": reference(t, ids)}
    finish(OUT, NAME, arrays, {"seed": SEED, "torch": torch.__version__, "config": hf_config(),
                               "tokenizer_config": tokenizer_config()}, lambda x: reference(t, x), PROMPT, NEW)


def f32_copy(src: Path, dst: Path) -> None:
    """The file with every tensor as F32 (gguf-py), so llama.cpp's CPU matmuls keep F32 activations."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
    from gguf.quants import dequantize

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = f.types[0]
        val = 0 if key == "general.file_type" else f.contents()
        w.add_key_value(key, val, vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        x = dequantize(t.data, t.tensor_type).astype(np.float32)
        w.add_tensor(t.name, x.reshape([int(s) for s in reversed(t.shape)]), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def goldens() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_nanbeige_fixture import llamacpp_goldens

    llamacpp_goldens(OUT, NAME, texts=TEXTS)


if __name__ == "__main__":
    cli(__doc__, build, goldens, "torch, sentencepiece", "logits, greedy ids and token ids")
