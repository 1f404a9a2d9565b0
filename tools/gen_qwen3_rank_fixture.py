"""Make the decoder-reranker fixture tests/data/embed/qwen3-rank.gguf (a Qwen3-Reranker-shaped file) and its goldens
tests/data/embed/goldens-qwen3-rank.json, llama.cpp's own scores for it. Nothing here imports minfer.

Two steps (gguf-py for the first, llama-cpp-python 0.3.36's bindings for the second):

    /work/venv/bin/python tools/gen_qwen3_rank_fixture.py build
    PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python tools/gen_qwen3_rank_fixture.py goldens

`build` copies tests/data/arch/qwen3.gguf (the tiny random Qwen3 of tools/gen_arch_fixtures.py; tied embeddings:
no output.weight) with gguf-py, every key and tensor as it is, and adds what llama.cpp's converter writes for a
Qwen3-Reranker (conversion/qwen.py Qwen3Model: set_gguf_parameters, _get_cls_out_tensor, modify_tensors):
  qwen3.pooling_type                 uint32 4 (gguf.PoolingType.RANK)
  qwen3.classifier.output_labels     ["yes", "no"]
  tokenizer.chat_templates           ["rerank"]   (gguf_writer.add_chat_template of [{"name": "rerank", ...}])
  tokenizer.chat_template.rerank     TEMPLATE: the converter's Qwen3-Reranker template cut short, with the vocab's
                                     control tokens <s> / </s> standing in for <|im_start|> / <|im_end|> (this
                                     vocab has neither, and the full text spelled out byte by byte would not fit
                                     the file's context of 256 with a query and a document)
  cls.output.weight (2, 64) F16      the lm head's rows of two tokens, the "yes" one then the "no" one
                                     (_get_cls_out_tensor: stack([true_row, false_row])). The tied lm head is
                                     token_embd.weight; this vocab (320 byte-level BPE tokens) has no "yes" or
                                     "no" token, so the rows of "y" (YES_TOKEN) and "n" (NO_TOKEN) stand in, their
                                     F16 bytes copied as they are.
The converter would also leave out an untied model's output.weight (only the two rows are kept); this fixture is
tied, so nothing else changes. About 223 KB.

`goldens` writes tests/data/embed/goldens-qwen3-rank.json: llama.cpp's rank outputs (llama-cpp-python 0.3.36's
bindings over its vendor/llama.cpp, CPU: Llama(embedding=True, pooling_type=LLAMA_POOLING_TYPE_RANK) on an F32 copy
of the fixture (tools/gen_embed_goldens.copy_with_keys; F16 -> F32 is exact), the KV cache in F32, no flash
attention; each pair's ids decoded as one sequence; llama_get_embeddings_seq(ctx, 0)[:n_cls_out]: the softmax over
(yes, no) of the LAST token's row, llama-graph.cpp build_pooling RANK), and each pair's token ids laid out as
llama-server's format_prompt_rerank (tools/server/server-common.cpp) does with a rerank template: the template as
libllama reads it from the file (llama_model_chat_template(model, "rerank")), {query} then {document} replaced
(string_replace_all), tokenized with nothing added and special texts parsed (tokenize_input_subprompt(..., false,
true)). Also the vocab's add flags, n_cls_out, the labels and the pooling type as libllama reads them.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "tests" / "data" / "arch" / "qwen3.gguf"
OUT = ROOT / "tests" / "data" / "embed"
FIXTURE = OUT / "qwen3-rank.gguf"
GOLDENS = OUT / "goldens-qwen3-rank.json"
YES_TOKEN, NO_TOKEN = "y", "n"      # stand-ins for Qwen3's "yes" / "no" tokens (module doc)
LABELS = ["yes", "no"]
RANK = 4                            # llama.h LLAMA_POOLING_TYPE_RANK
TEMPLATE = ("<s>system\nJudge whether the Document meets the Query. Answer only \"yes\" or \"no\".</s>\n"
            "<s>user\n<Query>: {query}\n<Document>: {document}</s>\n<s>assistant\n<think>\n\n</think>\n\n")
QUERY = "what is the capital of china?"
DOCS = ["the capital of china is beijing.", "gravity pulls the cat down", "minfer reads gguf files",
        "naïve café 東京", "beijing"]
# the special texts of a query or document are parsed too (the whole filled-in template is), and the query is
# replaced first: a "{document}" inside it becomes the document (string_replace_all's order)
PAIRS = [(QUERY, d) for d in DOCS] + [("hello </s> world", "a <s> b"), ("what does {document} say?", "beijing")]


def build() -> None:
    import numpy as np
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(SRC))
    arch = r.fields["general.architecture"].contents()
    assert arch == "qwen3", arch
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    yes, no = tokens.index(YES_TOKEN), tokens.index(NO_TOKEN)
    tensors = {t.name: t for t in r.tensors}
    assert "output.weight" not in tensors, "qwen3.gguf was tied: the lm head is token_embd"
    embd = tensors["token_embd.weight"]
    cls_out = np.ascontiguousarray(np.asarray(embd.data)[[yes, no]])        # (2, D), token_embd's dtype (F16)
    extra = {f"{arch}.pooling_type": (RANK, GGUFValueType.UINT32),
             f"{arch}.classifier.output_labels": (LABELS, GGUFValueType.ARRAY),
             "tokenizer.chat_templates": (["rerank"], GGUFValueType.ARRAY),
             "tokenizer.chat_template.rerank": (TEMPLATE, GGUFValueType.STRING)}
    w = GGUFWriter(str(FIXTURE), arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in extra:
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for key, (val, vtype) in extra.items():
        w.add_key_value(key, val, vtype, sub_type=GGUFValueType.STRING if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=[int(d) for d in reversed(t.shape)], raw_dtype=t.tensor_type)
    w.add_tensor("cls.output.weight", cls_out, raw_shape=list(cls_out.shape), raw_dtype=embd.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {FIXTURE} ({FIXTURE.stat().st_size} bytes): cls.output = token_embd rows {yes} ({YES_TOKEN!r}), "
          f"{no} ({NO_TOKEN!r})", file=sys.stderr)


def goldens() -> None:
    import llama_cpp
    from llama_cpp import llama_cpp as C

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gen_embed_goldens import copy_with_keys

    out = {"source": "llama.cpp (llama-cpp-python 0.3.36's vendor/llama.cpp, CPU): Llama(embedding=True, "
                     "pooling_type=LLAMA_POOLING_TYPE_RANK) on an F32 copy of qwen3-rank.gguf, each pair's ids (laid "
                     "out as llama-server's format_prompt_rerank with the file's rerank template) decoded as one "
                     "sequence, llama_get_embeddings_seq(ctx, 0)[:n_cls_out] (softmax over yes/no of the last "
                     "token's row); command: PYTHONPATH=/tmp/llcpp-site /work/venv/bin/python "
                     "tools/gen_qwen3_rank_fixture.py goldens", "pairs": []}
    with tempfile.TemporaryDirectory() as tmp:
        f32 = Path(tmp) / "qwen3-rank.gguf"
        copy_with_keys(FIXTURE, f32, {}, f32=True)
        llm = llama_cpp.Llama(str(f32), embedding=True, pooling_type=C.LLAMA_POOLING_TYPE_RANK, n_ctx=256,
                              n_batch=256, n_ubatch=256, n_threads=2, type_k=0, type_v=0, flash_attn=False,
                              verbose=False)
        model = llm._model.model
        vocab = C.llama_model_get_vocab(model)
        n_cls = int(C.llama_model_n_cls_out(model))
        tmpl = C.llama_model_chat_template(model, b"rerank")
        assert tmpl is not None, "libllama found no rerank template"
        template = tmpl.decode("utf-8")
        flags = {"add_bos": bool(C.llama_vocab_get_add_bos(vocab)), "add_eos": bool(C.llama_vocab_get_add_eos(vocab)),
                 "bos": int(C.llama_vocab_bos(vocab)), "eos": int(C.llama_vocab_eos(vocab)),
                 "n_cls_out": n_cls, "labels": [C.llama_model_cls_label(model, i).decode() for i in range(n_cls)],
                 "pooling_type": int(llm.pooling_type())}
        assert flags["pooling_type"] == C.LLAMA_POOLING_TYPE_RANK and flags["labels"] == LABELS, flags
        out["vocab"] = flags
        out["template"] = template
        for q, doc in PAIRS:
            text = template.replace("{query}", q).replace("{document}", doc)
            ids = [int(x) for x in llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)]
            llm._batch.reset()
            llm._batch.add_sequence(ids, 0, True)
            llm._ctx.kv_cache_clear()
            llm._ctx.decode(llm._batch)
            ptr = C.llama_get_embeddings_seq(llm._ctx.ctx, 0)
            out["pairs"].append({"query": q, "document": doc, "ids": ids,
                                 "scores": [float(ptr[j]) for j in range(n_cls)]})
        del llm
    lines = ["{", f' "source": {json.dumps(out["source"])},', f' "vocab": {json.dumps(out["vocab"])},',
             f' "template": {json.dumps(out["template"], ensure_ascii=False)},', ' "pairs": [']
    lines += [f"  {json.dumps(p, ensure_ascii=False)}" + ("," if j + 1 < len(out["pairs"]) else "")
              for j, p in enumerate(out["pairs"])]        # one pair a line
    GOLDENS.write_text("\n".join(lines + [" ]", "}"]) + "\n", encoding="utf-8")
    for p in out["pairs"]:
        print(f"{len(p['ids']):4d} tokens  yes {p['scores'][0]:.6f}  no {p['scores'][1]:.6f}  {p['document']!r}",
              file=sys.stderr)
    print("wrote", GOLDENS, file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    sub.add_parser("build", help="the GGUF fixture from tests/data/arch/qwen3.gguf (needs gguf-py)")
    sub.add_parser("goldens", help="llama.cpp's scores and token layout (needs llama-cpp-python)")
    a = ap.parse_args()
    build() if a.step == "build" else goldens()


if __name__ == "__main__":
    main()
