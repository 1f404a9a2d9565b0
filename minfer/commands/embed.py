"""`minfer embed`: the embedding vector of each text (minfer/runtime/embed.py), one JSON list a line."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "print the embedding vector of each text (an embedding model's, or any model's with --pooling)"
DESCRIPTION = """\
Run the model over each text and print its embedding: the hidden rows after the model's output norm
pooled into one vector, as llama.cpp's llama-embedding computes it (the same file gives the same
numbers). One JSON list of floats a line, in the order of the texts.

The pooling is the file's pooling_type (embedding models' files carry it: Qwen3-Embedding pools the
last token) or --pooling; a chat model's file names none, so give --pooling mean or last. Vectors are
normalised to unit length unless --normalize says otherwise (llama.cpp's --embd-normalize values).

examples:
  minfer embed -m Qwen3-Embedding-0.6B-Q8_0.gguf "What is the capital of China?" "Gravity pulls"
  minfer embed -m model.gguf --pooling mean --dimensions 256 -f texts.txt    # one text a line
  echo "a text" | minfer embed -m model.gguf -f -
"""


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent

    return [engine_parent()]   # -m, --device, -c/--ctx-size, -t, -ngl


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("texts", nargs="*", metavar="TEXT", help="the texts to embed (or use -f)")
    p.add_argument("-f", "--file", metavar="F",
                   help="embed each non-empty line of file F (UTF-8) as one text; '-' reads standard input")
    p.add_argument("--pooling", choices=["mean", "cls", "last", "none"], default=None,
                   help="how the hidden rows become one vector: mean, cls (the first token's), last (the last "
                   "token's), none (a vector per token: a list of lists a line) (default: the file's pooling_type)")
    p.add_argument("--normalize", "--embd-normalize", dest="normalize", type=int, default=2, metavar="N",
                   help="2 euclidean (unit length, the default), -1 none, 0 scaled to the int16 range, 1 taxicab, "
                   "N > 2 the N-norm (llama.cpp's --embd-normalize)")
    p.add_argument("--dimensions", type=int, default=None, metavar="N",
                   help="keep the first N values of each vector (before normalising: Matryoshka models)")


def _texts(args, arg: str = "TEXT", noun: str = "text", verb: str = "embed") -> list[str]:
    """The texts of the TEXT arguments or of -f (one a line); `minfer rerank` reads its DOC arguments so."""
    from minfer.errors import MinferError
    from minfer.limits import check_text, read_stdin

    if args.file is not None and args.texts:
        raise MinferError(f"give the {noun}s either as {arg} arguments or with -f, not both")
    if args.file is None:
        if not args.texts:
            raise MinferError(f"no {noun}: give one or more {arg} arguments, or -f F (one {noun} a line; - for "
                              "standard input)")
        return [check_text(t, f"{arg} {i + 1}") for i, t in enumerate(args.texts)]
    if args.file == "-":
        data = read_stdin(f"the {noun}s")
    else:
        try:
            with open(args.file, encoding="utf-8") as f:
                data = f.read()
        except OSError as e:
            raise MinferError(f"{args.file}: cannot read: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise MinferError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    texts = [line for line in data.splitlines() if line.strip()]
    if not texts:
        raise MinferError(f"{args.file if args.file != '-' else 'standard input'}: no non-empty line to {verb}")
    return texts


def main(args: argparse.Namespace) -> int:
    from minfer.commands.run import load_engine
    from minfer.errors import MinferError
    from minfer.runtime.embed import check_normalize

    texts = _texts(args)             # every check that needs no model before the load
    check_normalize(args.normalize)
    if args.dimensions is not None and args.dimensions < 1:
        raise MinferError(f"--dimensions {args.dimensions}: expected at least 1")
    eng = load_engine(args, generates=False)
    from minfer.runtime.embed import pooling_of

    hint = "give --pooling mean or last" if eng.model.causal else "give --pooling mean or cls"   # (an encoder: bert)
    pooling_of(eng.config, args.pooling, str(eng.path), hint)   # the file's, or this error
    for v in eng.embed(texts, pooling=args.pooling, normalize=args.normalize, dimensions=args.dimensions):
        sys.stdout.write(json.dumps(v) + "\n")
    return 0
