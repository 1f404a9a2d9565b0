"""`minfer` command line: a thin dispatcher over minfer/commands/<name>.py.

Each command module defines HELP (one line), add_arguments(parser) and main(args) -> int,
and keeps heavy imports (torch, triton) inside main() so that `minfer --help` is instant. A
module may also define parents() -> [argparse parsers]: the flags shared by every command that
runs a model (minfer/commands/common.py), defined once so the commands cannot drift apart.

Process-level setting made here, before torch is imported: OMP_WAIT_POLICY=PASSIVE (unless the
environment already sets it). torch's OpenMP threads otherwise spin at the end of each parallel
region waiting for the next one; on a machine shared with other work that spinning steals the
cores the other threads need, and a 2-thread decode step ran 5-7x slower than a 1-thread one
(issue 14). Passive threads sleep instead; on an idle machine the cost is a few microseconds of
wake-up per region. The CLI is the process's owner, so it may set this; the library does not.
"""

from __future__ import annotations

import argparse
import errno
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
    ("embed", "embed"),
    ("rerank", "rerank"),
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
        description="Run GGUF language models (llama.cpp's file format) on NVIDIA GPUs and the CPU.\n"
        "MODEL arguments (-m) take a path to a .gguf file or a catalog name (see `minfer list`);\n"
        "a catalog model not yet on disk is pulled first.",
        # the top level had no example: a first user saw ten commands and no first line to type
        epilog="examples:\n"
        "  minfer run \"Write a haiku about GPUs\"                  # the default model, pulled on first use\n"
        "  minfer chat smollm2-135m-instruct                      # a conversation\n"
        "  minfer serve -m smollm2-135m-instruct --port 8080      # an OpenAI-compatible server\n"
        "  minfer inspect model.gguf                              # what a GGUF file holds\n"
        "  minfer COMMAND --help                                  # each command's flags and examples",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"minfer {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, modname in COMMANDS:
        mod = importlib.import_module(f"minfer.commands.{modname}")
        parents = mod.parents() if hasattr(mod, "parents") else []
        p = sub.add_parser(name, help=mod.HELP, description=getattr(mod, "DESCRIPTION", mod.HELP),
                           formatter_class=argparse.RawDescriptionHelpFormatter, parents=parents)
        mod.add_arguments(p)
        p.set_defaults(_main=mod.main, _parser=p)
    return parser


def set_process_env() -> None:
    """OMP_WAIT_POLICY=PASSIVE before torch (and its OpenMP runtime) is loaded; see the module
    docstring. Too late once torch is imported (OpenMP reads it at start-up), so left alone then."""
    if "torch" not in sys.modules:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def _names_a_model(s: str) -> bool:
    """A catalog name, or a path to an existing .gguf file."""
    from minfer.catalog import CATALOG

    return s in CATALOG or (s.endswith(".gguf") and os.path.isfile(s))


def _model_first(args, extra: list, argv: list) -> list:
    """The `ollama run MODEL [PROMPT]` order, for run, tokenize and chat: `minfer run MODEL PROMPT`,
    `minfer tokenize MODEL TEXT` and `minfer chat MODEL` name the model by position when -m is not
    given and that word is a catalog name or a .gguf file (else argparse's error stands, with a
    hint). Returns the arguments still unknown."""
    if getattr(args, "model", None) is None or any(a in ("-m", "--model") or a.startswith("--model=")
                                                    for a in argv):
        return extra
    main = getattr(args, "_main", None)
    cmd = getattr(main, "__module__", "")
    if not extra and cmd.endswith((".run", ".tokenize")):
        # `minfer run MODEL` alone (`ollama run MODEL`), or with -p/-f: the word is the model, not
        # a prompt for the default model; the prompt then comes from -p, -f or stdin
        field = "prompt" if cmd.endswith(".run") else "text"
        word = getattr(args, field, None)
        if word is not None and _names_a_model(word):
            args.model = word
            setattr(args, field, None)
        return extra
    # ("-" is a word: `minfer run MODEL -` / `minfer tokenize MODEL -` read stdin; it was refused
    # as an unrecognized argument)
    pos = [e for e in extra if e == "-" or not e.startswith("-")]
    if len(pos) != 1 or len(extra) != 1:
        return extra
    field = "prompt" if cmd.endswith(".run") else "text" if cmd.endswith(".tokenize") else None
    if field and getattr(args, field, None) is not None and _names_a_model(getattr(args, field)):
        args.model = getattr(args, field)
        setattr(args, field, pos[0])
        return []
    if cmd.endswith(".chat") and _names_a_model(pos[0]):
        args.model = pos[0]
        return []
    if cmd.endswith((".run", ".chat", ".tokenize")):
        word = getattr(args, field) if field else pos[0]
        form = {"run": "minfer run MODEL PROMPT", "chat": "minfer chat MODEL",
                "tokenize": "minfer tokenize MODEL TEXT"}[cmd.rsplit(".", 1)[1]]
        from minfer.catalog import did_you_mean

        return [f"{pos[0]} (to name the model first, as `{form}`, MODEL must be a catalog name from "
                f"`minfer list` or an existing .gguf file; {word!r} is neither.{did_you_mean(word)})"]
    return extra


def _unknown_command(word: str) -> str | None:
    """argparse's "invalid choice" for COMMAND, with what was likely meant: a close command name
    ("serv"), or `minfer run` when the word names a model (`minfer smollm2-135m-instruct`)."""
    import difflib

    names = [name for name, _ in COMMANDS]
    if word in names or word.startswith("-"):
        return None
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    if close:
        return f"unknown command {word!r}. Did you mean `minfer {close[0]}`? (commands: {', '.join(names)})"
    if _names_a_model(word):
        return f"unknown command {word!r}: to run a model, `minfer run {word} PROMPT` or `minfer chat {word}`"
    return None


def _flag_of_other_commands(parser, args, extra: list) -> str:
    """Why a flag another command takes is unknown here: `minfer tokenize --device cpu hi` read
    "unrecognized arguments: --device hi" (cpu taken as TEXT), as if --device were misspelt."""
    import argparse

    here = getattr(args, "command", None)
    subs = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), {})
    for word in extra:
        flag = word.split("=", 1)[0]
        if not here or not flag.startswith("-") or flag == "-":
            continue
        takes = [name for name, p in subs.items() if name != here and flag in p._option_string_actions]
        if takes:
            why = ", which loads no model onto a device" if here in ("tokenize", "inspect") else ""
            return f" ({flag} is a flag of `minfer {'`, `minfer '.join(takes)}`, not of `minfer {here}`{why})"
    return ""


# errors of writing the output (a full disk or quota, a failing or closed descriptor): one line
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EBADF, errno.EFBIG}


def _discard_stdout() -> None:
    """Point stdout at /dev/null: what is still buffered for a pipe or disk that failed would
    otherwise fail again, with a traceback, when the interpreter flushes it at exit."""
    try:
        sys.stdout = open(os.devnull, "w")
    except OSError:
        pass


def _close_bars() -> None:
    """Close the progress bars an error left open (a load that failed mid-way): the error line
    was written at the end of the bar's line ("loading m.gguf:   0%|...| 0/6minfer: error: ...")."""
    tqdm = sys.modules.get("tqdm")   # (no bar without tqdm imported)
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ()) or ()):
        try:
            bar.close()
        except Exception:   # noqa: BLE001 -- a bar that cannot close must not hide the error
            pass


def main(argv: list[str] | None = None) -> int:
    set_process_env()
    if sys.stdout is None:   # started with stdout closed (`minfer run ... >&-`): the text goes nowhere
        _discard_stdout()
    parser = build_parser()
    words = sys.argv[1:] if argv is None else argv
    if words and words[0] == "help":   # `minfer help [COMMAND]`, as git and pip take it
        words = [*words[1:2], "--help"]
        argv = words
    if words and (hint := _unknown_command(words[0])):
        parser.error(hint)
    # parse_args would report an unknown flag with the top-level usage; the subcommand's usage
    # (and its flags) is what helps, so unknown arguments are reported by the subcommand's parser
    args, extra = parser.parse_known_args(argv)
    extra = _model_first(args, extra, sys.argv[1:] if argv is None else argv)
    if extra:
        (getattr(args, "_parser", None) or parser).error(
            f"unrecognized arguments: {' '.join(extra)}{_flag_of_other_commands(parser, args, extra)}")
    if not getattr(args, "_main", None):
        parser.print_help()
        return 2
    try:
        return int(args._main(args) or 0)
    except MinferError as e:
        _close_bars()
        print(f"minfer: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nminfer: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # output piped into `head` and closed: not an error of ours
        _discard_stdout()
        return 0
    except OSError as e:
        if e.errno not in _WRITE_ERRNOS:
            raise
        print(f"minfer: error: cannot write {e.filename or 'the output'}: {e.strerror}", file=sys.stderr)
        _discard_stdout()
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
