"""Make the nomic-bert and modern-bert encoder fixtures in tests/data/arch/: tiny random Hugging Face models
(transformers' NomicBertModel and ModernBertModel), converted to GGUF by llama.cpp's own converter, with
transformers' float32 hidden states (last_hidden_state) as the reference and llama.cpp's token ids of some texts.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_bert2_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_bert2_fixture.py goldens

`build` writes, for each fixture:
  <name>.gguf   convert_hf_to_gguf.py --outtype f16 of the random model (2-D weights rounded to float16 first by
                gen_arch_fixtures.randomize, so the file holds exactly the weights transformers ran).
  <name>.npz    ids_<i> (T,), hidden_<i> (T, D) float32: transformers' last_hidden_state of input i (the model as
                released); hidden_ll_<i>: the same weights with the activation llama.cpp's graph computes where it
                differs (modern-bert: GELU's tanh form inside the GeGLU, ggml_geglu; nomic-bert's SiLU is the same
                formula in both, so there hidden_ll_<i> == hidden_<i>). Inputs: TEXTS encoded by the HF tokenizer and
                random ids of 40 and 100 tokens.
  <name>.json   the config, the seed, the transformers version, the texts.

nomic-bert: transformers' native NomicBertModel keeps other tensor and config names than the released checkpoints
(nomic-ai/nomic-embed-text-v1.5's remote code: encoder.layers.N.attn.Wqkv, mlp.fc11 / fc12 / fc2, norm1 / norm2,
emb_ln; config n_embd, n_inner, rotary_emb_base, ...), which is what llama.cpp's converter reads
(conversion/bert.py NomicBertModel: asserts n_positions 8192 / max_trained_positions 2048, activation swiglu, no
biases, prenorm false, rotary fraction 1, not interleaved). So the model directory is written in the released
format: transformers' own rename table read backwards (conversion_mapping.py "nomic_bert": fc11 <- up_proj,
fc12 <- gate_proj, fc2 <- down_proj, Wqkv <- cat(q, k, v)) and a released-style config.json, read raw by the
converter. Its vocab: gen_bert_fixture's WordPiece (nomic-embed uses bert-base-uncased's).

modern-bert: a byte-level BPE (gen_arch_fixtures.make_tokenizer, <s> / </s> as ModernBERT's [CLS] / [SEP], with a
post-processor wrapping each text in them as ModernBERT's tokenizer does; the converter writes add_bos, add_eos:
conversion/bert.py ModernBertModel.set_vocab). 4 layers, local_attention 8 (a symmetric window of 4 each side on
layers 1 and 2; layers 0 and 3 global: global_attn_every_n_layers 3), global / local rope bases 160000 / 10000.

`goldens` writes tests/data/embed/goldens-bert2.json.gz: llama.cpp's own pooled embeddings of each fixture (mean, cls,
last, none; as tools/gen_embed_goldens.py makes goldens.json) and llama.cpp's token ids (Llama.tokenize) of
TOKEN_TEXTS, with add_special and parse_special on and off.

llama.cpp's converter names the pre-tokenizer by hashing how a tokenizer splits a fixed text and refuses a hash it
does not know; these vocabularies are new, so the converter runs with get_vocab_base_pre answering 'bert-bge'
(WordPiece) or 'gpt-2' (byte-level BPE), the names whose pre-tokenizers these vocabularies were made with.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "data" / "arch"
FIXTURES = {"nomic-bert": 2468, "modern-bert": 1357}     # name -> seed
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it",
         "Hello world, naïve café 東京! The GGUF file: tokenizer.ggml.model=bert; 42 x\U0001F600y"]
TOKEN_TEXTS = TEXTS + [
    "", "  leading and trailing spaces\tand\ttabs\nnew lines  ",
    "ÜBER Straße \u2014 \u201cquotes\u201d and \u2018apostrophes\u2019 \u2026 ellipsis",
    "[CLS] special [SEP] tokens <s> and </s> in text", "MiXeD CaSe Ünïcödé résumé",
    "unbelievably-long-hyphenated_words_with_underscores and numbers 3.14159 1,000,000",
    "日本語のテキストと中文字符", "emoji \U0001F44D\U0001F3FD and symbols © ® ™ ° ± × ÷ € £ ¥", "café"]
NOMIC = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, hidden_act="silu",
             max_position_embeddings=2048, type_vocab_size=2, layer_norm_eps=1e-12,
             rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
MODERN = dict(hidden_size=32, num_hidden_layers=4, num_attention_heads=2, intermediate_size=64,
              hidden_activation="gelu", max_position_embeddings=512, norm_eps=1e-5, norm_bias=False,
              local_attention=8, global_attn_every_n_layers=3, global_rope_theta=160000.0, local_rope_theta=10000.0,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)


# This converter writes ModernBERT's norm_eps as attention.layer_norm_rms_epsilon only (TextModel.set_gguf_parameters
# finds it under "norm_eps"), but llama.cpp's loader requires attention.layer_norm_epsilon
# (src/models/modern-bert.cpp load_arch_hparams: get_key(LLM_KV_ATTENTION_LAYERNORM_EPS), "key not found in model"), so
# a file straight from it does not load. The key is added, as files from earlier converters carry it.
MODERN_EPS_PATCH = ("import conversion.bert as _cb\n"
                    "_mb_sgp = _cb.ModernBertModel.set_gguf_parameters\n"
                    "def _mb_fixed(self):\n"
                    "    _mb_sgp(self)\n"
                    "    self.gguf_writer.add_layer_norm_eps(self.hparams['norm_eps'])\n"
                    "_cb.ModernBertModel.set_gguf_parameters = _mb_fixed\n")


def nomic_released(model, d: Path, vocab: int) -> None:
    """The model's weights and config as the released nomic-embed checkpoints name them (see the docstring)."""
    import torch
    from safetensors.torch import save_file

    sd = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    out = {"embeddings.word_embeddings.weight": sd["embeddings.word_embeddings.weight"],
           "embeddings.token_type_embeddings.weight": sd["embeddings.token_type_embeddings.weight"],
           "emb_ln.weight": sd["embeddings.LayerNorm.weight"], "emb_ln.bias": sd["embeddings.LayerNorm.bias"]}
    for i in range(NOMIC["num_hidden_layers"]):
        s, o = f"layers.{i}.", f"encoder.layers.{i}."
        out[o + "attn.Wqkv.weight"] = torch.cat([sd[s + f"self_attn.{p}_proj.weight"] for p in "qkv"], 0)
        out[o + "attn.out_proj.weight"] = sd[s + "self_attn.o_proj.weight"]
        out[o + "mlp.fc11.weight"] = sd[s + "mlp.up_proj.weight"]
        out[o + "mlp.fc12.weight"] = sd[s + "mlp.gate_proj.weight"]
        out[o + "mlp.fc2.weight"] = sd[s + "mlp.down_proj.weight"]
        for a, b in (("norm1", "post_attention_layernorm"), ("norm2", "post_mlp_layernorm")):
            out[o + f"{a}.weight"], out[o + f"{a}.bias"] = sd[s + f"{b}.weight"], sd[s + f"{b}.bias"]
    left = set(sd) - {"embeddings.word_embeddings.weight", "embeddings.token_type_embeddings.weight",
                      "embeddings.LayerNorm.weight", "embeddings.LayerNorm.bias"} - {
        k for k in sd if k.startswith("layers.")}
    assert not left, left
    save_file(out, str(d / "model.safetensors"), metadata={"format": "pt"})
    (d / "config.json").write_text(json.dumps({
        "architectures": ["NomicBertModel"], "model_type": "nomic_bert", "vocab_size": vocab,
        "n_embd": NOMIC["hidden_size"], "n_layer": NOMIC["num_hidden_layers"], "n_head": NOMIC["num_attention_heads"],
        "n_inner": NOMIC["intermediate_size"], "n_positions": 8192, "max_trained_positions": 2048,
        "activation_function": "swiglu", "causal": False, "qkv_proj_bias": False, "mlp_fc1_bias": False,
        "mlp_fc2_bias": False, "prenorm": False, "rotary_emb_fraction": 1.0, "rotary_emb_interleaved": False,
        "rotary_emb_scale_base": None, "rotary_emb_base": NOMIC["rope_parameters"]["rope_theta"],
        "layer_norm_epsilon": NOMIC["layer_norm_eps"], "type_vocab_size": NOMIC["type_vocab_size"],
        "pad_token_id": 0}, indent=1))


def modern_tokenizer(d: Path) -> None:
    """gen_arch_fixtures' byte-level BPE with a post-processor: <s> text </s> (ModernBERT's [CLS] text [SEP])."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from gen_arch_fixtures import make_tokenizer

    make_tokenizer(d)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1),
                                                                                                    ("</s>", 2)])
    tok.save_pretrained(d)


def build(name: str, seed: int, llamacpp: Path) -> None:
    import torch
    import transformers
    from transformers.activations import ACT2FN

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import VOCAB, convert, randomize
    from gen_bert_fixture import make_tokenizer as make_wordpiece
    from gen_bert_fixture import VOCAB as WP_VOCAB
    from gen_bert_fixture import hidden

    torch.manual_seed(seed)
    if name == "nomic-bert":
        cfg = transformers.NomicBertConfig(vocab_size=WP_VOCAB, **NOMIC)
        model = transformers.NomicBertModel(cfg).float().eval()
    else:
        cfg = transformers.ModernBertConfig(vocab_size=VOCAB, **MODERN)
        model = transformers.ModernBertModel(cfg).float().eval()
    model.config._attn_implementation = "eager"
    randomize(model, seed, centered_bias=True)     # norm weights around 1, every bias around 0, float16-exact
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        d.mkdir()
        if name == "nomic-bert":
            make_wordpiece(d)
            nomic_released(model, d, WP_VOCAB)
            convert(d, OUT / f"{name}.gguf", llamacpp, raw_config=True,
                    extra="base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'bert-bge'\n")
        else:
            model.save_pretrained(d, safe_serialization=True)
            modern_tokenizer(d)
            convert(d, OUT / f"{name}.gguf", llamacpp, extra=MODERN_EPS_PATCH)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(seed)
    bos, eos = (2, 3) if name == "nomic-bert" else (1, 2)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == bos and ids[-1] == eos for ids in inputs), inputs
    inputs += [[bos, *rng.integers(5, cfg.vocab_size, size=n - 2).tolist(), eos] for n in (40, 100)]
    arrays = {}
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{i}"] = hidden(model, ids)
    if name == "modern-bert":     # llama.cpp's GeGLU: GELU's tanh form (ggml_geglu)
        for layer in model.layers:
            layer.mlp.act = ACT2FN["gelu_pytorch_tanh"]
    for i, ids in enumerate(inputs):
        arrays[f"hidden_ll_{i}"] = hidden(model, ids)
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    (OUT / f"{name}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": type(model).__name__, "seed": seed, "texts": TEXTS,
        "config": json.loads(cfg.to_json_string())}, indent=1, sort_keys=True) + "\n")
    d_ll = max(float(np.abs(arrays[f"hidden_{i}"] - arrays[f"hidden_ll_{i}"]).max()
                     / np.abs(arrays[f"hidden_{i}"]).max()) for i in range(len(inputs)))
    print(f"{name}: {(OUT / f'{name}.gguf').stat().st_size} bytes, {len(inputs)} inputs, "
          f"released vs llama.cpp's activation: hidden states apart by {d_ll:.2e} (max abs / max |h|)")


def goldens() -> None:
    """tests/data/embed/goldens-bert2.json.gz: llama.cpp's pooled embeddings (gen_embed_goldens.embed: Llama.embed
    normalize=False on an F32 copy, F32 KV, no flash attention) of each fixture for each pooling, and its token ids
    of TOKEN_TEXTS (Llama.tokenize on the file: add_special on with parse_special on and off, and neither)."""
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys, embed, write_json_gz

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False) on an "
                     "F32 copy of each fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_bert2_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in FIXTURES:
            f32 = Path(tmp) / f"{name}.gguf"
            copy_with_keys(OUT / f"{name}.gguf", f32, {}, f32=True)
            per = {}
            for pname, p in POOLINGS.items():
                per[pname] = embed(f32, p)
                assert per[pname]["pooling_type"] == p, (name, pname)
            out["fixtures"][name] = per
            llm = llama_cpp.Llama(str(OUT / f"{name}.gguf"), vocab_only=True, verbose=False)
            out["tokens"][name] = token_rows(llm, TOKEN_TEXTS)
            del llm
            print(name, "ok", file=sys.stderr)
    write_json_gz(ROOT / "tests" / "data" / "embed" / "goldens-bert2.json.gz", out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and transformers' hidden states (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    b.add_argument("--only", choices=sorted(FIXTURES), help="one fixture")
    sub.add_parser("goldens", help="llama.cpp's embeddings and token ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        for name, seed in FIXTURES.items():
            if a.only in (None, name):
                build(name, seed, a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
