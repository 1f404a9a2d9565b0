"""Make the reranker (cross-encoder) fixture tests/data/arch/bert-rank.{gguf,npz,json} and its goldens
tests/data/embed/goldens-rank.json: a tiny random Hugging Face BertForSequenceClassification (1 label, as
cross-encoder/ms-marco-MiniLM-L-6-v2) with the WordPiece vocabulary of tools/gen_bert_fixture.py, converted
to GGUF by llama.cpp's own converter. Nothing here imports minfer.

Two steps, in two environments (transformers for the first, llama-cpp-python for the second):

    /work/tfvenv/bin/python tools/gen_rerank_fixture.py build --llamacpp /tmp/arch/llama_cpp_python-0.3.36/vendor/llama.cpp
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_rerank_fixture.py goldens

`build` writes
  bert-rank.gguf  convert_hf_to_gguf.py --outtype f16 of the random model (2-D weights rounded to float16 first,
                  so the file holds what transformers ran). conversion/bert.py BertModel: id2label {0: LABEL_0}
                  -> bert.classifier.output_labels ["LABEL_0"]; `classifier` renamed classifier.out_proj ->
                  `cls.output` (gguf-py tensor_mapping CLS_OUT); `bert.pooler.dense` is dropped by filter_tensors
                  ("we are only using BERT for embeddings"), so the file has no `cls` tensor; no pooling_type key
                  (a sentence-transformers CrossEncoder has no modules.json: llama-server's --reranking picks
                  pooling RANK).
  bert-rank.npz   for each (query, document) pair of PAIRS: hf_ids_<i> / hf_types_<i>, transformers' own
                  encoding of the pair ([CLS] q [SEP] d [SEP], token types 0 then 1), hf_logit_<i>: the model's
                  logit as released (pooler dense + tanh, erf GELU, token types 0/1), and llfn_logit_<i>: the same
                  weights computing the function llama.cpp's graph computes (build_pooling RANK with `cls`
                  absent: classifier(hidden[0]); token types all 0, bert.cpp; GELU tanh, ggml_gelu), on
                  hf_ids_<i>.
  bert-rank.json  the HF config, the seed, the transformers version, the pairs, and how far hf_logit and
                  llfn_logit are apart (the pooler's and token types' effect: the score's scale differs).

`goldens` writes tests/data/embed/goldens-rank.json: llama.cpp's own rerank scores (llama-cpp-python 0.3.36's
bindings over its vendor/llama.cpp: Llama(embedding=True, pooling_type=LLAMA_POOLING_TYPE_RANK) on an F32 copy
of the fixture, the pair's tokens decoded as one sequence, llama_get_embeddings_seq(ctx, 0)[:n_cls_out]; the
server's send_rerank returns element 0 as relevance_score) and the token ids of each pair laid out as
llama-server's format_prompt_rerank (tools/server/server-common.cpp) lays them out: BOS if
llama_vocab_get_add_bos, the query's tokens (tokenize add_special false, parse_special false), EOS (SEP when the
vocab has no EOS) if add_eos, SEP if add_sep, the document's tokens, EOS if add_eos; the vocab's add_* flags are
read from libllama, so the layout is llama.cpp's for this file. Also `template`: llama.cpp's ids of a made-up
rerank template's text (TEMPLATE, tokenized as format_prompt_rerank tokenizes one: no BOS/EOS, specials parsed).

The WordPiece vocabulary is trained on README.md as it is when `build` runs (gen_bert_fixture.make_tokenizer), so
a later build makes another vocabulary: rebuild and regenerate the goldens together.
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
NAME, SEED = "bert-rank", 2468
CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              max_position_embeddings=64, type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu", num_labels=1)
QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "gravity pulls the cat down", "a model file: tokenizer and weights",
        "naïve café 東京", "beijing", "the dog sat on the mat and then the cat came in and sat beside it"]
PAIRS = [(QUERY, d) for d in DOCS] + [("hello world", "hello world"), ("[CLS] special [SEP]", "x [MASK] y")]
TEMPLATE = "[CLS]query: {query}[SEP]document: {document}[SEP]"     # a made-up tokenizer.chat_template.rerank
TEMPLATE_PAIR = ("the [MASK] capital", "beijing, china")


def build(llamacpp: Path) -> None:
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_arch_fixtures import convert, randomize
    from gen_bert_fixture import VOCAB, make_tokenizer

    torch.manual_seed(SEED)
    cfg = transformers.BertConfig(vocab_size=VOCAB, **CONFIG)
    model = transformers.BertForSequenceClassification(cfg).float().eval()
    randomize(model, SEED, centered_bias=True)     # LayerNorm weights around 1, every bias around 0
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / NAME
        model.save_pretrained(d, safe_serialization=True)
        make_tokenizer(d)
        convert(d, ARCH / f"{NAME}.gguf", llamacpp,
                extra="base.TextModel.get_vocab_base_pre = lambda self, tokenizer: 'bert-bge'\n")
        tok = transformers.AutoTokenizer.from_pretrained(d)
    arrays = {}
    with torch.no_grad():
        for i, (q, doc) in enumerate(PAIRS):
            enc = tok(q, doc)
            ids, types = enc["input_ids"], enc["token_type_ids"]
            arrays[f"hf_ids_{i}"] = np.array(ids, dtype=np.int64)
            arrays[f"hf_types_{i}"] = np.array(types, dtype=np.int64)
            t = torch.tensor([ids])
            arrays[f"hf_logit_{i}"] = model(t, token_type_ids=torch.tensor([types])).logits[0].float().numpy()
        # llama.cpp's function of the same weights: token types all 0, GELU tanh, no pooler: classifier(h[CLS])
        for layer in model.bert.encoder.layer:
            layer.intermediate.intermediate_act_fn = transformers.activations.ACT2FN["gelu_pytorch_tanh"]
        for i in range(len(PAIRS)):
            t = torch.tensor([arrays[f"hf_ids_{i}"].tolist()])
            h = model.bert(t, token_type_ids=torch.zeros_like(t)).last_hidden_state[0, 0]
            arrays[f"llfn_logit_{i}"] = model.classifier(h).float().numpy()
    np.savez_compressed(ARCH / f"{NAME}.npz", **arrays)
    apart = max(float(np.abs(arrays[f"hf_logit_{i}"] - arrays[f"llfn_logit_{i}"]).max()) for i in range(len(PAIRS)))
    (ARCH / f"{NAME}.json").write_text(json.dumps({
        "transformers": transformers.__version__, "class": "BertForSequenceClassification", "seed": SEED,
        "pairs": PAIRS, "config": json.loads(cfg.to_json_string()),
        "hf_vs_llama_function_max_abs": apart}, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    print(f"{NAME}: {(ARCH / f'{NAME}.gguf').stat().st_size} bytes, {len(PAIRS)} pairs; transformers' logits "
          f"(pooler, token types 0/1, erf GELU) vs llama.cpp's function: max abs {apart:.3f}")


def goldens() -> None:
    import llama_cpp
    from llama_cpp import llama_cpp as C

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_embed_goldens import copy_with_keys

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama(embedding=True, "
                     "pooling_type=LLAMA_POOLING_TYPE_RANK) on an F32 copy of bert-rank.gguf, each pair's ids (laid "
                     "out as llama-server's format_prompt_rerank) decoded as one sequence, "
                     "llama_get_embeddings_seq(ctx, 0)[:n_cls_out]; command: PYTHONPATH=/tmp/llcpp-site "
                     "python tools/gen_rerank_fixture.py goldens", "pairs": []}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / f"{NAME}.gguf"
        copy_with_keys(ARCH / f"{NAME}.gguf", f32, {}, f32=True)
        llm = llama_cpp.Llama(str(f32), embedding=True, pooling_type=C.LLAMA_POOLING_TYPE_RANK, n_ctx=64,
                              n_batch=64, n_ubatch=64, n_threads=2, type_k=0, type_v=0, flash_attn=False,
                              verbose=False)
        model = llm._model.model
        vocab = C.llama_model_get_vocab(model)
        n_cls = int(C.llama_model_n_cls_out(model))
        flags = {"add_bos": bool(C.llama_vocab_get_add_bos(vocab)), "add_eos": bool(C.llama_vocab_get_add_eos(vocab)),
                 "add_sep": bool(C.llama_vocab_get_add_sep(vocab)), "bos": int(C.llama_vocab_bos(vocab)),
                 "eos": int(C.llama_vocab_eos(vocab)), "sep": int(C.llama_vocab_sep(vocab)),
                 "rerank_template": C.llama_model_chat_template(model, b"rerank") is not None,
                 "n_cls_out": n_cls, "labels": [C.llama_model_cls_label(model, i).decode() for i in range(n_cls)],
                 "pooling_type": int(llm.pooling_type())}
        assert not flags["rerank_template"] and flags["pooling_type"] == C.LLAMA_POOLING_TYPE_RANK, flags
        out["vocab"] = flags
        eos = flags["eos"] if flags["eos"] != -1 else flags["sep"]     # LLAMA_TOKEN_NULL -> SEP
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
        # a rerank template's text (llama_model_chat_template(model, "rerank") with {query} / {document} replaced)
        # is tokenized with tokenize_input_subprompt(vocab, mctx, prompt, false, true): nothing added, specials parsed
        q, doc = TEMPLATE_PAIR
        text = TEMPLATE.replace("{query}", q).replace("{document}", doc)
        out["template"] = {"template": TEMPLATE, "query": q, "document": doc, "text": text,
                           "ids": [int(x) for x in llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)]}
        del llm
    OUT.mkdir(parents=True, exist_ok=True)
    lines = ["{", f' "source": {json.dumps(out["source"])},', f' "vocab": {json.dumps(out["vocab"])},',
             f' "template": {json.dumps(out["template"], ensure_ascii=False)},', ' "pairs": [']
    lines += [f"  {json.dumps(r, ensure_ascii=False)}" + ("," if j + 1 < len(out["pairs"]) else "")
              for j, r in enumerate(out["pairs"])]        # one pair a line
    (OUT / "goldens-rank.json").write_text("\n".join(lines + [" ]", "}"]) + "\n", encoding="utf-8")
    print("wrote", OUT / "goldens-rank.json", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    b = sub.add_parser("build", help="the GGUF file and transformers' logits (needs transformers)")
    b.add_argument("--llamacpp", required=True, type=Path,
                   help="vendor/llama.cpp of the llama-cpp-python 0.3.36 source archive")
    sub.add_parser("goldens", help="llama.cpp's scores and token layout (needs llama-cpp-python)")
    a = ap.parse_args()
    if a.step == "build":
        build(a.llamacpp.resolve())
    else:
        goldens()


if __name__ == "__main__":
    main()
