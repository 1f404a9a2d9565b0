"""`minfer run`: one prompt in, generated text streamed out."""

from __future__ import annotations

import argparse
import sys

from minfer.commands.common import add_device_arg, add_model_arg

HELP = "generate text from one prompt, streamed as it is produced"
DESCRIPTION = """Generate a continuation of PROMPT (or, with --chat, the assistant's reply to it).

Text is printed as it is generated; a line of timings goes to stderr at the end.
Sampling follows llama.cpp's chain and defaults: repetition penalties -> top-k -> top-p ->
min-p -> temperature. --temp 0 is greedy (always the most likely token).

examples:
  minfer run --temp 0 -n 16 "The capital of France is"
  minfer run -m smollm2-135m-instruct --chat "Write a haiku about the sea"
  minfer run --seed 42 --stop "\\n\\n" "def fibonacci(n):"
"""


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default 0.8)")
    g.add_argument("--top-k", type=int, default=40, help="keep the K most likely tokens; 0 = off (default 40)")
    g.add_argument("--top-p", type=float, default=0.95,
                   help="keep the most likely tokens up to this total probability; 1 = off (default 0.95)")
    g.add_argument("--min-p", type=float, default=0.05,
                   help="drop tokens less likely than MIN_P times the top token; 0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="divide the logits of recently seen tokens by this; 1 = off (default 1.0)")
    g.add_argument("--repeat-last-n", type=int, default=64,
                   help="how many recent tokens the penalties look at; -1 = all (default 64)")
    g.add_argument("--presence-penalty", type=float, default=0.0,
                   help="subtract this from the logit of every recently seen token (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0,
                   help="subtract this times the token's recent count from its logit (default 0)")
    g.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same text")


def sampling_from_args(args):
    from minfer.runtime.sampling import SamplingParams

    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty, seed=args.seed,
                          penalty_last_n=args.repeat_last_n)


def add_engine_args(p: argparse.ArgumentParser) -> None:
    add_model_arg(p)
    add_device_arg(p)
    p.add_argument("--ctx", type=int, default=None,
                   help="context size in tokens: prompt + generated text (default: the model's, at most 4096)")


def load_engine(args):
    """Engine.load with the device from --device (no GPU backend yet: cuda asked -> error,
    cuda by default -> the CPU)."""
    from minfer.commands.common import resolve_device
    from minfer.errors import MinferError
    from minfer.runtime.engine import Engine

    device = resolve_device(args.device)
    if device == "cuda" and args.device is None:
        from minfer.weights import cuda_backend

        try:
            cuda_backend()
        except MinferError:
            print("minfer: the CUDA backend is not available yet; running on the CPU", file=sys.stderr)
            device = "cpu"
    eng = Engine.load(args.model, device=device, ctx=args.ctx, progress=sys.stderr.isatty())
    if eng.tokenizer is None:
        raise MinferError(f"{eng.path}: no tokenizer could be built for this model")
    return eng


def encode_chat(tok, messages) -> list[int]:
    """Token ids of the chat rendered with the model's template, ready for the reply."""
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    ids = tok.encode(text, parse_special=True)
    if tok.bos_id is not None and len(ids) > 1 and ids[0] == ids[1] == tok.bos_id:
        ids = ids[1:]  # the template wrote BOS itself and the tokenizer added another
    return ids


def format_timings(stats: dict, finish: str | None) -> str:
    pt, ps = stats.get("prompt_tokens", 0), stats.get("prompt_s", 0.0)
    gt, gs = stats.get("gen_tokens", 0), stats.get("gen_s", 0.0)
    prate = f"{pt / ps:.1f}" if ps > 0 else "-"
    grate = f"{gt / gs:.1f}" if gs > 0 else "-"
    return (f"prompt: {pt} tokens in {ps:.2f} s ({prate} tok/s) | generated: {gt} tokens in "
            f"{gs:.2f} s ({grate} tok/s) | finish: {finish}")


def stream(eng, ids, params, max_tokens, stop, out=None) -> tuple[str, str | None]:
    """Generate, printing text as it comes; return (text, finish_reason)."""
    out = out or sys.stdout
    parts, finish = [], None
    for ev in eng.generate(ids, params, max_new_tokens=max_tokens, stop=stop):
        if ev.text:
            out.write(ev.text)
            out.flush()
            parts.append(ev.text)
        finish = ev.finish_reason or finish
    return "".join(parts), finish


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_engine_args(p)
    p.add_argument("prompt", nargs="?", default=None, metavar="PROMPT",
                   help="the prompt; '-' or nothing reads it from stdin")
    p.add_argument("-n", "--max-tokens", type=int, default=256,
                   help="stop after this many new tokens; -1 = until the context is full (default 256)")
    p.add_argument("--stop", action="append", default=[], metavar="S",
                   help="stop when the text contains S (S itself is not printed); repeatable; "
                   "backslash escapes such as \\n are understood")
    p.add_argument("--chat", action="store_true",
                   help="treat PROMPT as a user message and apply the model's chat template")
    p.add_argument("--system", default=None, metavar="S", help="system message (with --chat)")
    add_sampling_args(p)


def main(args) -> int:
    from minfer.errors import MinferError

    prompt = args.prompt
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if args.system is not None and not args.chat:
        raise MinferError("--system needs --chat")
    # "\n" typed on a shell arrives as backslash + n; non-ASCII text must survive the unescape
    stop = [s.encode("latin-1", "backslashreplace").decode("unicode_escape") if "\\" in s else s
            for s in args.stop]
    eng = load_engine(args)
    tok = eng.tokenizer
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        ids = encode_chat(tok, messages + [{"role": "user", "content": prompt}])
    else:
        ids = tok.encode(prompt)
    max_tokens = None if args.max_tokens < 0 else args.max_tokens
    text, finish = stream(eng, ids, sampling_from_args(args), max_tokens, stop)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    print(format_timings(eng.stats, finish), file=sys.stderr)
    return 0
