"""Make the XLM-RoBERTa fixtures tests/data/arch/xlmr.{gguf,npz,json} and xlmr-rank.{gguf,npz,json} and their
llama.cpp goldens tests/data/embed/goldens-xlmr.json.gz: tiny random Hugging Face XLMRobertaModel (as bge-m3,
multilingual-e5) and XLMRobertaForSequenceClassification (1 label, as bge-reranker-v2-m3) with a SentencePiece
Unigram vocabulary trained here, converted to GGUF by llama.cpp's own converter (conversion/bert.py
XLMRobertaModel: GGUF arch `bert`, tokenizer.ggml.model `t5`). Nothing here imports minfer.

Two steps, in two environments (transformers + sentencepiece for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_xlmr_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_xlmr_fixture.py goldens

`build`:
  the vocabulary  sentencepiece's trainer, model_type unigram, VOCAB pieces, on CORPUS (below, fixed: the same
                  vocabulary each build); a normalization rule table of a few NFKC-like rules (RULES: full-width
                  letters and digits, a ligature, an ideographic space ...) instead of the default nmt_nfkc, so the
                  precompiled charsmap is a few hundred bytes, not XLM-R's 240 KB, and still walked by the tokenizer;
                  add_dummy_prefix and remove_extra_whitespaces on, as XLM-R's sentencepiece.bpe.model. Written
                  into the model directory as sentencepiece.bpe.model (what the converter reads first,
                  _xlmroberta_set_vocab: the fairseq realignment <s> <pad> </s> <unk> + pieces[3:]), and as
                  transformers' XLMRobertaTokenizer (tokenizer.json: Unigram with HF's ids, which are the realigned
                  ids; the post-processor <s> A </s> and <s> A </s></s> B </s>, from which gguf-py's SpecialVocab
                  writes add_bos_token, add_eos_token and add_sep_token true).
  xlmr.gguf       convert_hf_to_gguf.py --outtype f16 (2-D weights rounded to float16 first, so the file holds what
                  transformers ran). The converter cuts the position table's first pad_token_id + 1 rows
                  (XLMRobertaModel.modify_tensors; context_length = max_position_embeddings - 2), as HF's XLM-R
                  numbers positions from padding_idx + 1; type_vocab_size 1 (one token type row).
  xlmr.npz        ids_<i> (T,), hidden_<i> (T, D): transformers' last_hidden_state as released (erf GELU) and
                  hidden_tanh_<i> with GELU's tanh form (llama.cpp's ggml_gelu); inputs: TEXTS as HF's tokenizer
                  encodes them and random ids of 40 and 100 tokens (no <pad>: HF gives a pad its own position).
  xlmr-rank.*     the same for XLMRobertaForSequenceClassification (num_labels 1): conversion keeps the
                  classification head, `classifier.dense` -> cls, `classifier.out_proj` -> cls.output (gguf-py
                  tensor_mapping), which is llama.cpp's RANK head tanh(cls x + b) -> cls.output: HF's
                  XLMRobertaClassificationHead on <s>'s row. npz: hf_ids_<i> (HF's pair encoding), hf_logit_<i> (as
                  released), tanh_logit_<i> (GELU's tanh form).

`goldens` writes tests/data/embed/goldens-xlmr.json.gz: llama.cpp's pooled embeddings of xlmr.gguf (an F32 copy;
Llama.embed(normalize=False), pooling mean / cls / last / none, F32 KV, no flash attention) of TEXTS, its token ids
of TOKEN_TEXTS (Llama.tokenize, add_special / parse_special on and off), the vocab's add_bos / add_eos / add_sep,
and xlmr-rank.gguf's rerank scores (pooling RANK, each pair laid out as llama-server's format_prompt_rerank from
libllama's own add flags, llama_get_embeddings_seq(ctx, 0)[:n_cls_out]).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
ARCH = ROOT / "tests" / "data" / "arch"
OUT = ROOT / "tests" / "data" / "embed"
FIXTURES = {"xlmr": 4242, "xlmr-rank": 4343}          # name -> seed
VOCAB = 200                                            # sentencepiece pieces (the GGUF has VOCAB + 2 tokens)
CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=130, type_vocab_size=1, layer_norm_eps=1e-5, hidden_act="gelu",
              pad_token_id=1, bos_token_id=0, eos_token_id=2)
CORPUS = [
    "the cat sat on the mat, and then the dog came in and sat beside it",
    "Hello world, this is a small multilingual corpus for a tiny unigram vocabulary.",
    "the capital of china is beijing. the capital of france is paris. the capital of japan is tokyo.",
    "what is the capital of germany? berlin is the capital of germany.",
    "Bonjour le monde, je suis un petit modèle de langue. Où est la gare ? Ça va très bien, merci.",
    "Hallo Welt, die Straße ist lang und grün. Über den Fluss fährt ein Boot. Schöne Grüße!",
    "Hola mundo, ¿cómo estás? El niño come una manzana en la mañana. Adiós, señor.",
    "Привет мир, как дела? Москва столица России. Спасибо большое.",
    "東京は日本の首都です。北京是中国的首都。こんにちは世界。你好世界。",
    "gravity pulls the cat down; a model file holds a tokenizer and weights",
    "embedding models map a text to a vector; a reranker scores a query and a document",
    "numbers 3.14159 and 1,000,000 and 42; dates 2026-12-07; times 17:05",
]
CORPUS = CORPUS * 8
# normalization rules (sentencepiece's rule TSV: source code points -> target code points, hex)
RULES = [("FF21", "41"), ("FF22", "42"), ("FF43", "63"), ("FF11", "31"), ("FF12", "32"), ("FB01", "66 69"),
         ("3000", "20"), ("2460", "31"), ("00A0", "20"), ("2126", "3A9"), ("212B", "C5")]
TEXTS = ["Hello world", "the capital of china is beijing.", "Bonjour le monde, Ça va très bien ?",
         "東京は日本の首都です。 Привет мир", "Ｈｅｌｌｏ ﬁne ①② worlds\u3000end"]
TOKEN_TEXTS = TEXTS + [
    "", " ", "  leading and   inner\tand\ttabs\nnew lines  ", "ÜBER Straße \u2014 \u201cquotes\u201d \u2026",
    "<s> special </s> tokens <pad> and <unk> in text", "MiXeD CaSe Ünïcödé résumé café naïve",
    "emoji \U0001F44D\U0001F3FD and symbols © ® ™ ° ± × ÷ € £ ¥", "Ω Å Ａｂｃ ｃａｔ １２", "x" * 30,
    "the cat\u00a0sat", "¿cómo estás? señor niño mañana", "日本語のテキストと中文字符"]
QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "gravity pulls the cat down", "北京是中国的首都。",
        "Bonjour le monde", "beijing"]
PAIRS = [(QUERY, d) for d in DOCS] + [("hello world", "hello world"), ("<s> a </s>", "Ｈｅｌｌｏ ﬁne")]


def make_tokenizer(d: Path) -> None:
    """The Unigram model (sentencepiece.bpe.model) and transformers' XLMRobertaTokenizer on it, in d."""
    import sentencepiece as spm
    from transformers import XLMRobertaTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        corpus, rules = Path(tmp) / "corpus.txt", Path(tmp) / "rules.tsv"
        corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
        rules.write_text("".join(f"{a}\t{b}\n" for a, b in RULES), encoding="utf-8")
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(Path(tmp) / "m"), vocab_size=VOCAB, model_type="unigram",
            character_coverage=0.995, normalization_rule_tsv=str(rules), add_dummy_prefix=True,
            remove_extra_whitespaces=True, num_threads=1, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
            hard_vocab_limit=True, minloglevel=2)
        model = (Path(tmp) / "m.model").read_bytes()
    (d / "sentencepiece.bpe.model").write_bytes(model)
    sp = spm.SentencePieceProcessor(model_proto=model)
    from sentencepiece import sentencepiece_model_pb2 as pb
    proto = pb.ModelProto()
    proto.ParseFromString(model)
    # HF's XLM-R ids (convert_slow_tokenizer XLMRobertaConverter): <s> <pad> </s> <unk>, pieces 3.., <mask>
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(sp.id_to_piece(i), sp.get_score(i)) for i in range(3, sp.get_piece_size())] + [("<mask>", 0.0)]
    tok = XLMRobertaTokenizer(vocab=vocab, _spm_precompiled_charsmap=proto.normalizer_spec.precompiled_charsmap)
    tok.save_pretrained(d)


def hidden(model, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).last_hidden_state[0].float().numpy()


def build(llamacpp: Path) -> None:
    import torch
    import transformers
    from transformers.activations import ACT2FN

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, randomize

    for name, seed in FIXTURES.items():
        torch.manual_seed(seed)
        rank = name == "xlmr-rank"
        cfg = transformers.XLMRobertaConfig(vocab_size=VOCAB + 2, **CONFIG, **({"num_labels": 1} if rank else {}))
        cls = transformers.XLMRobertaForSequenceClassification if rank else transformers.XLMRobertaModel
        model = cls(cfg).float().eval()
        model.config._attn_implementation = "eager"
        randomize(model, seed, centered_bias=True)
        with tempfile.TemporaryDirectory() as tmp:
            d = Path(tmp) / name
            d.mkdir()
            model.save_pretrained(d, safe_serialization=True)
            make_tokenizer(d)
            convert(d, ARCH / f"{name}.gguf", llamacpp)
            tok = transformers.AutoTokenizer.from_pretrained(d)
        arrays: dict = {}
        enc = model.roberta if rank else model

        def tanh_gelu():
            for layer in enc.encoder.layer:
                layer.intermediate.intermediate_act_fn = ACT2FN["gelu_pytorch_tanh"]

        if not rank:
            rng = np.random.default_rng(seed)
            inputs = [tok(t)["input_ids"] for t in TEXTS]
            assert all(ids[0] == 0 and ids[-1] == 2 for ids in inputs), inputs
            inputs += [[0, *rng.integers(4, VOCAB + 2, size=n - 2).tolist(), 2] for n in (40, 100)]
            for i, ids in enumerate(inputs):
                arrays[f"ids_{i}"] = np.array(ids, dtype=np.int64)
                arrays[f"hidden_{i}"] = hidden(model, ids)
            tanh_gelu()
            for i, ids in enumerate(inputs):
                arrays[f"hidden_tanh_{i}"] = hidden(model, ids)
        else:
            with torch.no_grad():
                for i, (q, doc) in enumerate(PAIRS):
                    ids = tok(q, doc)["input_ids"]
                    arrays[f"hf_ids_{i}"] = np.array(ids, dtype=np.int64)
                    arrays[f"hf_logit_{i}"] = model(torch.tensor([ids])).logits[0].float().numpy()
                tanh_gelu()
                for i in range(len(PAIRS)):
                    arrays[f"tanh_logit_{i}"] = model(torch.tensor([arrays[f"hf_ids_{i}"].tolist()])).logits[0].numpy()
        np.savez_compressed(ARCH / f"{name}.npz", **arrays)
        (ARCH / f"{name}.json").write_text(json.dumps({
            "transformers": transformers.__version__, "class": type(model).__name__, "seed": seed,
            "texts": TEXTS, "pairs": PAIRS, "config": json.loads(cfg.to_json_string()),
            "commands": [f"/work/tfvenv/bin/python tools/gen_xlmr_fixture.py build --llamacpp {llamacpp}",
                         "PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_xlmr_fixture.py goldens"]},
            indent=1, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")
        print(f"{name}: {(ARCH / f'{name}.gguf').stat().st_size} bytes")


def goldens() -> None:
    import llama_cpp
    from llama_cpp import llama_cpp as C

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_embed_goldens import POOLINGS, copy_with_keys, write_json_gz

    out: dict = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU) on F32 copies of xlmr.gguf and "
                           "xlmr-rank.gguf: Llama.embed(normalize=False) per pooling, Llama.tokenize(text, add_bos, "
                           "special), pooling RANK scores (llama_get_embeddings_seq[:n_cls_out]) of pairs laid out as "
                           "format_prompt_rerank; command: PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python "
                           "tools/gen_xlmr_fixture.py goldens", "embed": {}, "tokens": [], "pairs": []}
    kw = dict(n_ctx=128, n_batch=128, n_ubatch=128, n_threads=2, type_k=0, type_v=0, flash_attn=False, verbose=False)
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "xlmr.gguf"
        copy_with_keys(ARCH / "xlmr.gguf", f32, {}, f32=True)
        for pname, p in POOLINGS.items():
            llm = llama_cpp.Llama(str(f32), embedding=True, pooling_type=p, **kw)
            assert int(llm.pooling_type()) == p
            out["embed"][pname] = [{"text": t, "ids": [int(x) for x in llm.tokenize(t.encode("utf-8"))],
                                    "embedding": llm.embed(t, normalize=False)} for t in TEXTS]
            del llm
        llm = llama_cpp.Llama(str(ARCH / "xlmr.gguf"), vocab_only=True, verbose=False)
        for t in TOKEN_TEXTS:
            b = t.encode("utf-8")
            out["tokens"].append({"text": t,
                                  "special": [int(x) for x in llm.tokenize(b, add_bos=True, special=False)],
                                  "special_parsed": [int(x) for x in llm.tokenize(b, add_bos=True, special=True)],
                                  "plain": [int(x) for x in llm.tokenize(b, add_bos=False, special=False)],
                                  "plain_parsed": [int(x) for x in llm.tokenize(b, add_bos=False, special=True)]})
        del llm
        f32 = Path(tmp) / "xlmr-rank.gguf"
        copy_with_keys(ARCH / "xlmr-rank.gguf", f32, {}, f32=True)
        llm = llama_cpp.Llama(str(f32), embedding=True, pooling_type=C.LLAMA_POOLING_TYPE_RANK, **kw)
        model = llm._model.model
        vocab = C.llama_model_get_vocab(model)
        n_cls = int(C.llama_model_n_cls_out(model))
        flags = {"add_bos": bool(C.llama_vocab_get_add_bos(vocab)), "add_eos": bool(C.llama_vocab_get_add_eos(vocab)),
                 "add_sep": bool(C.llama_vocab_get_add_sep(vocab)), "bos": int(C.llama_vocab_bos(vocab)),
                 "eos": int(C.llama_vocab_eos(vocab)), "sep": int(C.llama_vocab_sep(vocab)), "n_cls_out": n_cls,
                 "rerank_template": C.llama_model_chat_template(model, b"rerank") is not None}
        assert not flags["rerank_template"]
        out["vocab"] = flags
        eos = flags["eos"] if flags["eos"] != -1 else flags["sep"]
        for q, doc in PAIRS:
            qt = [int(x) for x in llm.tokenize(q.encode("utf-8"), add_bos=False, special=False)]
            dt = [int(x) for x in llm.tokenize(doc.encode("utf-8"), add_bos=False, special=False)]
            ids = ([flags["bos"]] if flags["add_bos"] else []) + qt + ([eos] if flags["add_eos"] else []) \
                + ([flags["sep"]] if flags["add_sep"] else []) + dt + ([eos] if flags["add_eos"] else [])
            llm._batch.reset()
            llm._batch.add_sequence(ids, 0, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            ptr = C.llama_get_embeddings_seq(llm._ctx.ctx, 0)
            out["pairs"].append({"query": q, "document": doc, "ids": ids, "scores": [float(ptr[j]) for j in range(n_cls)]})
        del llm
    OUT.mkdir(parents=True, exist_ok=True)
    write_json_gz(OUT / "goldens-xlmr.json.gz", out)
    print("wrote", OUT / "goldens-xlmr.json.gz", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF files and transformers' references (needs transformers, sentencepiece)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's embeddings, token ids and rerank scores (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
