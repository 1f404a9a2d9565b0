"""`minfer` command line: a thin dispatcher over minfer/commands/<name>.py.

Each command module defines HELP (one line), add_arguments(parser) and main(args) -> int,
and keeps heavy imports (torch, triton) inside main() so that `minfer --help` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from minfer.errors import MinferError

# (command, module under minfer.commands); the order is the order of `minfer --help`.
COMMANDS = [
    ("run", "run"),
    ("chat", "chat"),
    ("serve", "serve"),
    ("bench", "bench"),
    ("perplexity", "perplexity"),
    ("tokenize", "tokenize"),
    ("inspect", "inspect"),
    ("synth", "synth"),
    ("pull", "pull"),
    ("list", "list_models"),
]


def build_parser() -> argparse.ArgumentParser:
    from minfer import __version__

    parser = argparse.ArgumentParser(
        prog="minfer",
        description="Run GGUF language models (llama.cpp's file format) on NVIDIA GPUs and the CPU. "
        "MODEL arguments (-m) take a path to a .gguf file or a catalog name (see `minfer list`); "
        "a catalog model not yet on disk is pulled first.",
    )
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS:
        try:
            mod = importlib.import_module(f"minfer.commands.{modname}")
        except ModuleNotFoundError as e:  # a command not built yet must not break the others
            if e.name != f"minfer.commands.{modname}":
                raise
            continue
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except MinferError as e:
        print(f"minfer: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nminfer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # output piped into `head` and closed: not an error of ours
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
