"""`minfer rerank`: score documents against a query with a cross-encoder (runtime/embed.py Engine.rerank)."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "score documents' relevance to a query with a reranker (a cross-encoder's GGUF), highest first"
DESCRIPTION = """\
Run a reranker (a cross-encoder such as cross-encoder/ms-marco-MiniLM-L-6-v2 or bge-reranker, or
Qwen3-Reranker, converted by llama.cpp's convert_hf_to_gguf.py: a file with a classifier head, tensors
cls / cls.output) over each (query, document) pair and print the documents sorted by relevance, highest
first, one a line:

  SCORE <TAB> INDEX <TAB> DOCUMENT

SCORE is the classifier's raw logit for the pair (no sigmoid: compare scores with each other, not with a
fixed threshold; Qwen3-Reranker's is the probability of "yes", 0..1), what llama-server's /v1/rerank
returns as relevance_score for the same file; INDEX is the document's position in the input, from 0.
Each pair is tokenized as llama-server does it: [CLS] query [SEP] document [SEP] for a BERT vocab (the
file's rerank template when it has one, as Qwen3-Reranker's has).
A model without a classifier head (an embedding or chat model) is refused.

examples:
  minfer rerank -m ms-marco-MiniLM-L6-v2-f16.gguf --query "capital of China?" "Beijing is..." "Paris is..."
  minfer rerank -m reranker.gguf --query "how to bake bread" -f docs.txt --top-n 3    # one document a line
  minfer rerank -m reranker.gguf --query "q" -f docs.txt --json     # {"index", "relevance_score", "document"}
"""


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent

    return [engine_parent()]   # -m, --device, -c/--ctx-size, -t, -ngl


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("documents", nargs="*", metavar="DOC", help="the documents to score (or use -f)")
    p.add_argument("-q", "--query", required=True, metavar="Q", help="the query the documents are scored against")
    p.add_argument("-f", "--file", metavar="F",
                   help="score each non-empty line of file F (UTF-8) as one document; '-' reads standard input")
    p.add_argument("--top-n", type=int, default=None, metavar="N", help="print only the N best documents")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object a line: {\"index\", \"relevance_score\", \"document\"}")


def main(args: argparse.Namespace) -> int:
    from minfer.commands.embed import _texts
    from minfer.commands.run import load_engine
    from minfer.errors import MinferError
    from minfer.limits import check_text

    if args.top_n is not None and args.top_n < 1:
        raise MinferError(f"--top-n {args.top_n}: expected at least 1")
    query = check_text(args.query, "--query")
    args.texts = args.documents
    docs = _texts(args, "DOC", "document", "score")      # every check that needs no model before the load
    eng = load_engine(args, generates=False)
    r = eng.rerank(query, docs, top_n=args.top_n)
    for i, score in r.ranking:
        if args.json:
            sys.stdout.write(json.dumps({"index": i, "relevance_score": score, "document": docs[i]},
                                        ensure_ascii=False) + "\n")
        else:
            sys.stdout.write(f"{score:.6f}\t{i}\t{docs[i]}\n")
    return 0
