"""Make the eurobert encoder fixture tests/data/arch/eurobert.{gguf,npz,json} and its llama.cpp goldens
tests/data/embed/goldens-eurobert.json.gz: a tiny random transformers EuroBertModel (EuroBERT-210m / 610m / 2.1B's
architecture: llama-like RMSNorm pre-norm layers, rope, SwiGLU, grouped kv heads, bidirectional attention),
converted to GGUF by llama.cpp's own converter, with transformers' float32 hidden states as the reference.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_eurobert_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_eurobert_fixture.py goldens

Nothing here imports minfer (the helpers come from tools/gen_arch_fixtures.py, gen_bert_fixture.py,
gen_embed_goldens.py).

`build` writes:
  eurobert.gguf  convert_hf_to_gguf.py --outtype f16 (conversion/bert.py EuroBertModel) of the random model, every
                 weight rounded to float16 first (gen_arch_fixtures.randomize), so the file holds exactly the weights
                 transformers ran. 2 layers, hidden 64, 4 heads of 16 with 2 kv heads (GQA), ffn 96, rope_theta
                 250000 (EuroBERT-210m's), rms_norm_eps 1e-5; a byte-level BPE of 320 tokens
                 (gen_arch_fixtures.make_tokenizer) whose post-processor wraps a text in <s> ... </s> (a begin / end of
                 text pair, as a BERT-style encoder's; the converter's SpecialVocab turns it into add_bos_token and
                 add_eos_token true, over set_vocab's add_bos false); a sentence-transformers mean Pooling
                 module, so the file carries eurobert.pooling_type MEAN (_try_set_pooling_type).
  eurobert.npz   ids_<i> (T,), hidden_<i> (T, D) float32: transformers' last_hidden_state (after the final norm: the
                 row llama.cpp's graph hands to pooling, res->t_embd after output_norm) of input i: TEXTS encoded by
                 the HF tokenizer, then random ids of 40 and 100 tokens.
  eurobert.json  the config, the seed, the transformers version, the texts.

Converter patches (passed to gen_arch_fixtures.convert as code run before it):
  - get_vocab_base_pre answers 'gpt-2' (gen_arch_fixtures.convert's default): this vocabulary is new, so its
    pre-tokenizer hash is unknown to the converter; 'gpt-2' is the pre-tokenizer it was trained with.
  - transformers' EuroBertConfig defaults classifier_pooling to "late", which _try_set_pooling_type refuses
    (NotImplementedError: cls / mean only); that key is the classifier head's pooling (a rank head the embeddings
    path does not read), so the patch hides a "late" value from it and writes no classifier pooling key.

`goldens` writes tests/data/embed/goldens-eurobert.json.gz: llama.cpp's own pooled embeddings (Llama.embed on an F32
copy of the file, F32 KV, no flash attention: gen_embed_goldens.embed) for mean, cls, last, none and the file's
pooling, not normalized (`embedding`) and normalized (`embedding_normalized`: Llama.embed(normalize=True), L2), and
llama.cpp's token ids (Llama.tokenize) of TOKEN_TEXTS with add_special and parse_special on and off.
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
NAME = "eurobert"
SEED = 8642
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it",
         "Hello world, naïve café 東京! The GGUF file: tokenizer.ggml.model=gpt2; 42 x\U0001F600y"]
TOKEN_TEXTS = TEXTS + [
    "", "  leading and trailing spaces\tand\ttabs\nnew lines  ",
    "ÜBER Straße \u2014 \u201cquotes\u201d and \u2018apostrophes\u2019 \u2026 ellipsis",
    "special <s> and </s> and <pad> in text", "MiXeD CaSe Ünïcödé résumé",
    "unbelievably-long-hyphenated_words_with_underscores and numbers 3.14159 1,000,000",
    "日本語のテキストと中文字符", "emoji \U0001F44D\U0001F3FD and symbols © ® ™ ° ± × ÷ € £ ¥", "café"]
CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=96, hidden_act="silu", max_position_embeddings=512, rms_norm_eps=1e-5,
              rope_parameters={"rope_type": "default", "rope_theta": 250000.0},
              pad_token_id=0, bos_token_id=1, eos_token_id=2, mask_token_id=0)

CONVERT_PATCH = ("import conversion.bert as _cb\n"
                 "_eb_pool = _cb.EuroBertModel._try_set_pooling_type\n"
                 "def _eb_pool_fixed(self):\n"
                 "    late = self.hparams.get('classifier_pooling') == 'late'\n"
                 "    if late:\n"
                 "        del self.hparams['classifier_pooling']\n"
                 "    _eb_pool(self)\n"
                 "_cb.EuroBertModel._try_set_pooling_type = _eb_pool_fixed\n")


def tokenizer(d: Path) -> None:
    """gen_arch_fixtures' byte-level BPE with a post-processor: <s> text </s> (EuroBERT's begin / end of text)."""
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    from gen_arch_fixtures import make_tokenizer

    make_tokenizer(d)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    tok.backend_tokenizer.post_processor = TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1),
                                                                                                    ("</s>", 2)])
    tok.save_pretrained(d)


def sentence_transformers_files(d: Path) -> None:
    """modules.json + 1_Pooling/config.json (mean), which the converter reads into eurobert.pooling_type."""
    (d / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (d / "1_Pooling").mkdir()
    (d / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": CONFIG["hidden_size"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))


def build(llamacpp: Path) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import VOCAB, convert, randomize
    from gen_bert_fixture import hidden

    torch.manual_seed(SEED)
    cfg = transformers.EuroBertConfig(vocab_size=VOCAB, **CONFIG)
    model = transformers.EuroBertModel(cfg).float().eval()
    model.config._attn_implementation = "eager"
    randomize(model, SEED)          # RMSNorm weights around 1, matrices float16-exact
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        model.save_pretrained(d, safe_serialization=True)
        tokenizer(d)
        sentence_transformers_files(d)
        convert(d, OUT / f"{NAME}.gguf", llamacpp, extra=CONVERT_PATCH)
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(SEED)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    assert all(ids[0] == 1 and ids[-1] == 2 for ids in inputs), inputs
    inputs += [[1, *rng.integers(5, VOCAB, size=n - 2).tolist(), 2] for n in (40, 100)]
    arrays = {}
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{i}"] = hidden(model, ids)
    np.savez_compressed(OUT / f"{NAME}.npz", **arrays)
    (OUT / f"{NAME}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": type(model).__name__, "seed": SEED, "texts": TEXTS,
        "pooling": "mean (sentence-transformers 1_Pooling)",
        "config": json.loads(cfg.to_json_string())}, indent=1, sort_keys=True) + "\n")
    print(f"{NAME}: {(OUT / f'{NAME}.gguf').stat().st_size} bytes, {len(inputs)} inputs")


def embed_both(path: Path, pooling: int | None) -> dict:
    """gen_embed_goldens.embed (normalize=False), plus Llama.embed(normalize=True) of the same texts."""
    import llama_cpp

    from gen_embed_goldens import embed

    d = embed(path, pooling)
    kw = {} if pooling is None else {"pooling_type": pooling}
    llm = llama_cpp.Llama(str(path), embedding=True, n_ctx=256, n_batch=256, n_ubatch=256, n_threads=2,
                          type_k=0, type_v=0, flash_attn=False, verbose=False, **kw)
    for inp in d["inputs"]:
        inp["embedding_normalized"] = llm.embed(inp["text"], normalize=True)
    return d


def goldens() -> None:
    import llama_cpp

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_bert_fixture import token_rows
    from gen_embed_goldens import POOLINGS, copy_with_keys

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama.embed(normalize=False and "
                     "True) on an F32 copy of the fixture, Llama.tokenize(text, add_bos, special); command: "
                     "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_eurobert_fixture.py goldens",
           "fixtures": {}, "tokens": {}}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(OUT / f"{NAME}.gguf", f32, {}, f32=True)
        per = {}
        for pname, p in POOLINGS.items():
            per[pname] = embed_both(f32, p)
            assert per[pname]["pooling_type"] == p, pname
        per["file"] = embed_both(f32, None)
        assert per["file"]["pooling_type"] == 1, per["file"]["pooling_type"]     # MEAN, from the Pooling module
        out["fixtures"][NAME] = per
        llm = llama_cpp.Llama(str(OUT / f"{NAME}.gguf"), vocab_only=True, verbose=False)
        out["tokens"][NAME] = token_rows(llm, TOKEN_TEXTS)
        del llm
    dst = ROOT / "tests" / "data" / "embed" / "goldens-eurobert.json.gz"
    # gzipped (no name, mtime 0: deterministic): the repository travels to the GPU machine under a size limit
    import gzip

    with open(dst, "wb") as f, gzip.GzipFile(filename="", mode="wb", fileobj=f, mtime=0, compresslevel=9) as z:
        z.write((json.dumps(out, indent=0, ensure_ascii=False) + "\n").encode("utf-8"))
    print("wrote", dst, file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and transformers' hidden states (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's embeddings and token ids (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
