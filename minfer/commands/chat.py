"""`minfer chat`: an interactive multi-turn conversation in the terminal."""

from __future__ import annotations

import argparse
import sys

HELP = "chat with a model, turn by turn (reads your messages from stdin)"
DESCRIPTION = """Talk to an instruction-tuned model. Each line you type is a user message; the
reply streams back. The conversation is kept (the model's chat template renders it) until
you type /reset; /exit or end of input (Ctrl-D) quits. Works with piped input too:

  printf 'Hi!\\nWhat did I just say?\\n' | minfer chat -m smollm2-135m-instruct --temp 0

Only the new part of the conversation is computed each turn: the KV cache keeps the rest.
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    from minfer.commands.run import add_engine_args, add_sampling_args

    add_engine_args(p)
    p.add_argument("--system", default=None, metavar="S", help="a system message opening the conversation")
    p.add_argument("-n", "--max-tokens", type=int, default=512,
                   help="longest reply in tokens; -1 = until the context is full (default 512)")
    add_sampling_args(p)


def main(args) -> int:
    from minfer.commands.run import encode_chat, format_timings, load_engine, sampling_from_args, stream
    from minfer.errors import MinferError

    eng = load_engine(args)
    tok = eng.tokenizer
    params = sampling_from_args(args)
    interactive = sys.stdin.isatty()
    start = [{"role": "system", "content": args.system}] if args.system is not None else []
    messages = list(start)
    if interactive:
        print(f"minfer chat: {eng.path.name} on {eng.device} (context {eng.n_ctx} tokens). "
              "/reset starts over, /exit quits.", file=sys.stderr)
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        line = line.rstrip("\n")
        if line.strip() == "/exit":
            break
        if line.strip() == "/reset":
            messages = list(start)
            eng.reset()
            print("(conversation cleared)", file=sys.stderr)
            continue
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        ids = encode_chat(tok, messages)
        room = eng.n_ctx - len(ids)
        if room < 1:
            messages.pop()
            raise MinferError(f"the conversation is {len(ids)} tokens, past the context of {eng.n_ctx}; "
                              "type /reset, or start with a larger --ctx")
        max_tokens = None if args.max_tokens < 0 else args.max_tokens
        text, finish = stream(eng, ids, params, max_tokens, stop=[])
        print(flush=True)
        messages.append({"role": "assistant", "content": text})
        if interactive:
            print(format_timings(eng.stats, finish), file=sys.stderr)
    return 0
