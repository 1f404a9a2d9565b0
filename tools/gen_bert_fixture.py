"""Make the BERT encoder fixtures in tests/data/arch/: tiny random Hugging Face BertModels with a small
WordPiece vocabulary trained here, converted to GGUF by llama.cpp's own converter, with transformers'
float32 hidden states (last_hidden_state) as the reference and llama.cpp's token ids of some texts.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    python tools/gen_bert_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site python tools/gen_bert_fixture.py tokens

`build` writes, for each fixture (FIXTURES: bert, a plain BertModel directory; bert-mean, the same kind of
model saved as a sentence-transformers model with mean pooling: modules.json and 1_Pooling/config.json,
which the converter reads into `bert.pooling_type`, conversion/base.py _try_set_pooling_type):
  <name>.gguf   convert_hf_to_gguf.py --outtype f16 of the random model. The random 2-D weights are
                rounded to float16 first (gen_arch_fixtures.randomize), so the f16 file holds exactly the
                weights transformers ran (norms and biases stay f32).
  <name>.npz    ids_<i> (T,) and hidden_<i> (T, D) float32: transformers' last_hidden_state of input i (the
                model as released: hidden_act "gelu", the exact erf GELU); hidden_tanh_<i>: the same model with
                its GELU swapped for the tanh approximation (ggml_gelu's formula, which llama.cpp's bert graph
                runs: build_ffn LLM_FFN_GELU). Inputs: TEXTS encoded by the HF tokenizer ([CLS] ... [SEP]) and
                random ids of 40 and 100 tokens.
  <name>.json   the HF config, the seed, the transformers version, the texts.

`tokens` writes bert.tokens.json: llama.cpp's ids (llama-cpp-python's Llama.tokenize on a vocab-only load) of
TOKEN_TEXTS for each fixture, with add_special (BOS = [CLS] ... SEP) and parse_special on and off.

llama.cpp's converter names the pre-tokenizer by hashing how a tokenizer splits a fixed text and refuses a
hash it does not know; this vocabulary is new, so the converter runs with get_vocab_base_pre answering
'bert-bge' (bge-small's WordPiece entry; a WPM vocab's pre-tokenizer name changes nothing in llama.cpp).
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
FIXTURES = {"bert": 1234, "bert-mean": 4321}     # name -> seed
VOCAB = 400
CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
              max_position_embeddings=128, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu")
TEXTS = ["Hello world", "the cat sat on the mat, and then the dog came in and sat beside it",
         "Hello world, naïve café 東京! The GGUF file: tokenizer.ggml.model=bert; 42 x\U0001F600y"]
TOKEN_TEXTS = TEXTS + [
    "", "  leading and trailing spaces\tand\ttabs\nnew lines  ",
    "ÜBER Straße \u2014 \u201cquotes\u201d and \u2018apostrophes\u2019 \u2026 ellipsis",
    "[CLS] special [SEP] tokens [MASK] in text", "MiXeD CaSe Ünïcödé résumé",
    "unbelievably-long-hyphenated_words_with_underscores and numbers 3.14159 1,000,000",
    "日本語のテキストと中文字符", "emoji \U0001F44D\U0001F3FD and symbols © ® ™ ° ± × ÷ € £ ¥",
    "control\u0000chars\u200bzero width\ufeffbom", "the model's GGUF file", "café"]
EXTRA_TEXT = ["naïve café 東京 日本 über straße"] * 3    # some accented / CJK words in the training text


def make_tokenizer(path: Path) -> None:
    """A lowercasing WordPiece vocab of VOCAB entries, saved as a transformers BertTokenizer (vocab.txt,
    tokenizer.json, tokenizer_config.json). Built deterministically (tokenizers' WordPiece trainer breaks
    ties in another order from run to run) from the README's words as BERT's normalizer and pre-tokenizer
    give them: [PAD] [UNK] [CLS] [SEP] [MASK], every character as a word start and as a "##" continuation,
    then the most frequent words and 2-4 character word endings ("##" pieces), ties in alphabetical order."""
    from collections import Counter

    from tokenizers.normalizers import BertNormalizer
    from tokenizers.pre_tokenizers import BertPreTokenizer
    from transformers import BertTokenizer

    norm, pre = BertNormalizer(lowercase=True), BertPreTokenizer()
    words: Counter = Counter()
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines() + EXTRA_TEXT:
        words.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
    pieces: Counter = Counter()
    for w, n in words.items():
        if len(w) > 1:
            pieces[w] += n
        for k in (2, 3, 4):
            if len(w) > k:
                pieces["##" + w[-k:]] += n
    for piece, _ in sorted(pieces.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) == VOCAB:
            break
        vocab.append(piece)
    assert len(vocab) == VOCAB, len(vocab)
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "vocab.txt").write_text("".join(v + "\n" for v in vocab), encoding="utf-8")
        BertTokenizer(vocab=str(Path(tmp) / "vocab.txt")).save_pretrained(path)


def sentence_transformers_files(path: Path) -> None:
    """modules.json and 1_Pooling/config.json as sentence-transformers saves a mean-pooling model."""
    (path / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": CONFIG["hidden_size"], "pooling_mode_cls_token": False,
        "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False}))


def hidden(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].float().numpy()


def build(name: str, seed: int, llamacpp: Path) -> None:
    import torch
    import transformers
    from transformers.activations import ACT2FN

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, randomize

    torch.manual_seed(seed)
    cfg = transformers.BertConfig(vocab_size=VOCAB, **CONFIG)
    model = transformers.BertModel(cfg).float().eval()
    randomize(model, seed, centered_bias=True)     # LayerNorm weights around 1, every bias around 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / name
        model.save_pretrained(d, safe_serialization=True)
        make_tokenizer(d)
        if name == "bert-mean":
            sentence_transformers_files(d)
        convert(d, OUT / f"{name}.gguf", llamacpp,
                extra="base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'bert-bge'\n")
        tok = transformers.AutoTokenizer.from_pretrained(d)
    rng = np.random.default_rng(seed)
    inputs = [tok(t)["input_ids"] for t in TEXTS]
    inputs += [[2, *rng.integers(5, VOCAB, size=n - 2).tolist(), 3] for n in (40, 100)]
    arrays = {}
    for i, ids in enumerate(inputs):
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        arrays[f"hidden_{i}"] = hidden(model, ids)
    gelu = [layer.intermediate.intermediate_act_fn for layer in model.encoder.layer]
    for layer in model.encoder.layer:
        layer.intermediate.intermediate_act_fn = ACT2FN["gelu_pytorch_tanh"]
    for i, ids in enumerate(inputs):
        arrays[f"hidden_tanh_{i}"] = hidden(model, ids)
    for layer, f in zip(model.encoder.layer, gelu):
        layer.intermediate.intermediate_act_fn = f
    np.savez_compressed(OUT / f"{name}.npz", **arrays)
    (OUT / f"{name}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": "BertModel", "seed": seed, "texts": TEXTS,
        "pooling": "mean (sentence-transformers 1_Pooling)" if name == "bert-mean" else None,
        "config": json.loads(cfg.to_json_string())}, indent=1, sort_keys=True) + "\n")
    d_tanh = max(float(np.abs(arrays[f"hidden_{i}"] - arrays[f"hidden_tanh_{i}"]).max()
                     / np.abs(arrays[f"hidden_{i}"]).max()) for i in range(len(inputs)))
    print(f"{name}: {(OUT / f'{name}.gguf').stat().st_size} bytes, {len(inputs)} inputs, "
          f"erf vs tanh GELU hidden states apart by {d_tanh:.2e} (max abs / max |h|)")


def token_rows(llm, texts) -> list[dict]:
    """llama.cpp's ids of each text (a vocab-only llama_cpp.Llama): BOS added with special texts left as text
    ("special") and parsed ("special_parsed"), and neither ("plain")."""
    rows = []
    for t in texts:
        b = t.encode("utf-8")
        rows.append({"text": t,
                     "special": [int(x) for x in llm.tokenize(b, add_bos=True, special=False)],
                     "special_parsed": [int(x) for x in llm.tokenize(b, add_bos=True, special=True)],
                     "plain": [int(x) for x in llm.tokenize(b, add_bos=False, special=False)]})
    return rows


def tokens() -> None:
    import llama_cpp

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama(vocab_only=True)"
                     ".tokenize(text, add_bos, special); command: PYTHONPATH=/tmp/llcpp-site python "
                     "tools/gen_bert_fixture.py tokens", "fixtures": {}}
    for name in FIXTURES:
        llm = llama_cpp.Llama(str(OUT / f"{name}.gguf"), vocab_only=True, verbose=False)
        out["fixtures"][name] = token_rows(llm, TOKEN_TEXTS)
        del llm
    lines = ["{", f' "source": {json.dumps(out["source"])},', ' "fixtures": {']
    for i, (name, rows) in enumerate(out["fixtures"].items()):     # one text a line
        lines.append(f"  {json.dumps(name)}: [")
        lines += [f"   {json.dumps(r, ensure_ascii=False)}" + ("," if j + 1 < len(rows) else "") for j, r in enumerate(rows)]
        lines.append("  ]" + ("," if i + 1 < len(out["fixtures"]) else ""))
    (OUT / "bert.tokens.json").write_text("\n".join(lines + [" }", "}"]) + "\n", encoding="utf-8")
    print("wrote", OUT / "bert.tokens.json", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and transformers' hidden states (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("tokens", help="llama.cpp's token ids of TOKEN_TEXTS (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        for name, seed in FIXTURES.items():
            build(name, seed, a.llamacpp.resolve())
    else:
        tokens()


if __name__ == "__main__":
    main()
