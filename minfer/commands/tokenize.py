"""`minfer tokenize`: show how a model's tokenizer cuts a text into tokens."""

from __future__ import annotations

import argparse
import json
import sys

from minfer.commands.common import add_model_arg

HELP = "show the tokens of a text under a model's tokenizer (ids and pieces)"
DESCRIPTION = """\
Tokenize a text with the tokenizer stored in a GGUF model file, exactly as llama.cpp does
(same ids as llama.cpp's llama-tokenize), and print one token per line: the id and the
piece of text it stands for (as a JSON string, so spaces, tabs and newlines are visible;
bytes of a character split across tokens show as \\x escapes).

Special tokens written in the text, such as <|im_start|>, become their single token id
unless --no-special is given. A BOS token is added when the model's metadata asks for it
(tokenizer.ggml.add_bos_token); --no-bos never adds one.

examples:
  minfer tokenize "Hello, world!"
  minfer tokenize -m smollm2-135m-instruct --ids "<|im_start|>user"
  minfer tokenize --file prompt.txt --ids
  git diff | minfer tokenize -m smollm2-135m-instruct --ids -      # '-': standard input
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    p.add_argument("text", nargs="?", metavar="TEXT",
                   help="the text to tokenize (or use --file); a lone '-' reads standard input, as "
                   "-f - does (to tokenize the text '-' itself, pipe it in: printf - | minfer tokenize -)")
    p.add_argument("-f", "--file", metavar="F",
                   help="read the text from file F (UTF-8, taken as is: a trailing newline "
                   "is part of the text); '-' reads standard input")
    p.add_argument("--ids", action="store_true",
                   help="print only the token ids, as one JSON list on one line")
    p.add_argument("--no-bos", action="store_true",
                   help="never add the BOS token, whatever the model's metadata says")
    p.add_argument("--no-special", action="store_true",
                   help="treat control-token texts such as <|im_end|> as plain text "
                   "(llama.cpp's parse_special=false; user-defined tokens such as Qwen's "
                   "<tool_call> are still matched, as in llama.cpp)")


def _read_text(args) -> str:
    from minfer.errors import MinferError
    from minfer.limits import check_text, read_stdin

    if args.file is not None and args.text is not None:
        raise MinferError("give the text either as TEXT or with --file, not both")
    if args.file == "":   # (an unset shell variable) was ": cannot read"
        raise MinferError("-f/--file is empty: give the text's file, or - for standard input")
    if args.text == "-" or args.file == "-":
        # a lone '-' is standard input (the usual convention, as `minfer run -`): it was tokenized
        # as the text "-"
        if sys.stdin is not None and sys.stdin.isatty():   # else it waits in silence
            print("minfer: reading the text from standard input; end it with Ctrl-D",
                  file=sys.stderr, flush=True)
        return read_stdin("the text")   # bytes as they are (no newline translation), UTF-8 checked
    if args.file is None:
        if args.text is None:
            raise MinferError("no text: give TEXT, --file F, or - to read standard input")
        # bytes of argv that are not UTF-8 arrive as lone surrogates, which the tokenizer rejects
        # with a TypeError: one line naming the place instead
        return check_text(args.text, "TEXT")
    try:
        with open(args.file, encoding="utf-8", newline="") as f:
            return f.read()
    except OSError as e:
        raise MinferError(f"{args.file}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise MinferError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from e


def main(args: argparse.Namespace) -> int:
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile
    from minfer.tokenizer import Tokenizer

    text = _read_text(args)
    tok = Tokenizer.from_gguf(GGUFFile(resolve_model(args.model)))
    ids = tok.encode(text, add_bos=False if args.no_bos else None,
                     parse_special=not args.no_special)
    if args.ids:
        print(json.dumps(ids))
        return 0
    if not ids:   # an empty text and no BOS: say so, rather than print nothing at all
        print("minfer: 0 tokens (the text is empty)", file=sys.stderr)
        return 0
    width = len(str(max(ids)))
    for i in ids:
        print(f"{i:>{width}} {show_piece(tok.piece_bytes(i))}")
    return 0


def show_piece(b: bytes) -> str:
    """A token's bytes as a quoted string: JSON escapes for control characters, \\xNN for
    bytes that are only part of a UTF-8 character."""
    out = []
    for ch in b.decode("utf-8", errors="surrogateescape"):
        if 0xDC80 <= ord(ch) <= 0xDCFF:  # an undecodable byte, smuggled by surrogateescape
            out.append(f"\\x{ord(ch) - 0xDC00:02x}")
        else:
            out.append(json.dumps(ch, ensure_ascii=False)[1:-1])
    return '"' + "".join(out) + '"'
