"""`minfer run`: one prompt in, generated text streamed out."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "answer one prompt (chat template applied when the model has one), streamed"
DESCRIPTION = """Answer PROMPT, streamed as it is generated; a line of timings goes to stderr at the end.

When the model file has a chat template (instruction-tuned models do), PROMPT is sent as a
user message through that template, as `llama-cli`, `ollama run` and `mlx_lm.generate` do, and
the answer ends at the model's end of turn. --raw (llama.cpp: -no-cnv, --no-conversation)
continues PROMPT as plain text instead; a model without a chat template always does that.

Sampling follows llama.cpp's chain and defaults: repetition penalties -> top-k -> top-p ->
min-p -> temperature. --temp 0 is greedy (always the most likely token).
Device: cuda when torch sees a GPU, else cpu (--device picks one); a device that cannot
run is an error, never a silent fall back to the CPU.

The timing line ends with `finish: REASON`: stop (end of turn or a --stop string), length
(-n tokens were generated) or context (the context was full; -c allows more).

The model may also come first, as with `ollama run`: `minfer run MODEL PROMPT`, MODEL a catalog
name (`minfer list`) or a .gguf file; `minfer run MODEL` alone reads the prompt from stdin.

examples:
  minfer run "Write a haiku about GPUs"
  minfer run smollm2-135m-instruct "Why is the sky blue?"
  minfer run -m smollm2-135m-instruct -sys "Answer in French" "What is the capital of Italy?"
  minfer run --raw --temp 0 -n 16 "The capital of France is"
  minfer run -s 42 --stop "\\n\\n" -p "def fibonacci(n):" --raw
"""


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent, generation_parent

    return [engine_parent(), generation_parent()]


def sampling_from_args(args):
    from minfer.runtime.sampling import SamplingParams

    return SamplingParams(temperature=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                          repeat_penalty=args.repeat_penalty, presence_penalty=args.presence_penalty,
                          frequency_penalty=args.frequency_penalty,
                          # -1 is llama.cpp's "a random seed" (common/arg.cpp, --seed); as a literal
                          # seed it gave a llama.cpp user the same text on every run
                          seed=None if args.seed == -1 else args.seed,
                          penalty_last_n=args.repeat_last_n)


def load_engine(args, generates: bool = True):
    """Engine.load after the cheap checks: the catalog model's architecture (before a download),
    the device (minfer.device's rule: never a silent CPU fall back), an encoder's file where the
    command generates (`generates`: all but embed), the context against the memory its KV cache
    needs and the trained length; then torch's threads (-t)."""
    from minfer.catalog import resolve_model
    from minfer.commands.common import apply_threads, device_from_args, resolve_device, warn
    from minfer.commands.preflight import check_ctx, check_generates, check_runnable
    from minfer.errors import MinferError
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.engine import Engine

    device = resolve_device(device_from_args(args))
    check_runnable(args.model)
    gf = GGUFFile(resolve_model(args.model))
    if generates:
        check_generates(gf)
    check_ctx(gf, args.ctx, device, warn)
    apply_threads(args)
    eng = Engine.load(gf, device=device, ctx=args.ctx, progress=sys.stderr.isatty())
    apply_threads(args)   # -t wins over the engine's own MINFER_THREADS setting
    if eng.tokenizer is None:
        raise MinferError(f"{eng.path}: no tokenizer could be built for this model")
    return eng


def encode_chat(tok, messages) -> list[int]:
    """Token ids of the chat rendered with the model's template, ready for the reply: chat_token_ids with the
    content's control-token text read as tokens (llama.cpp's CLI does), its doubled-BOS drop and spelling errors."""
    from minfer.tokenizer.chat_template import chat_token_ids

    return chat_token_ids(tok, messages, special_in_content=True)


def finish_reason(finish: str | None, stats: dict, n_ctx: int, max_tokens: int | None) -> str:
    """The engine's reason, with a stop forced by a full context told apart from -n's limit.

    The engine can generate n_ctx - prompt + 1 tokens (the last one is never fed back); when that
    room, not -n, ended the text, the reason is 'context'. -n 0 generates nothing: 'length'."""
    room = n_ctx - stats.get("prompt_tokens", 0) + 1
    if finish == "length" and stats.get("gen_tokens", 0) >= room and (max_tokens is None or max_tokens > room):
        return "context"
    if finish is None and max_tokens == 0:
        return "length"
    return finish or "length"


COMPILE_NOTE_S = 1.0   # compile seconds worth a word in the timing line


def format_timings(stats: dict, finish: str | None) -> str:
    pt, ps = stats.get("prompt_tokens", 0), stats.get("prompt_s", 0.0)
    gt, gs = stats.get("gen_tokens", 0), stats.get("gen_s", 0.0)
    prate = f"{pt / ps:.1f}" if ps > 0 else "-"
    grate = f"{gt / gs:.1f}" if gs > 0 else "-"
    cs = stats.get("compile_s", 0.0)      # Triton's compiles within those times (runtime/compile_watch.py)
    compiled = f" | {cs:.1f} s of it compiling GPU kernels (once per machine)" if cs >= COMPILE_NOTE_S else ""
    return (f"prompt: {pt} tokens in {ps:.2f} s ({prate} tok/s) | generated: {gt} tokens in "
            f"{gs:.2f} s ({grate} tok/s){compiled} | finish: {finish}")


def stream(eng, ids, params, max_tokens, stop, out=None, **gen_kw) -> tuple[str, str | None]:
    """Generate, printing text as it comes; return (text, finish_reason). A KeyboardInterrupt
    raised meanwhile propagates (the chat catches it to stop only the reply)."""
    out = out or sys.stdout
    parts, finish = [], None
    for ev in eng.generate(ids, params, max_new_tokens=max_tokens, stop=stop, **gen_kw):
        if ev.text:
            out.write(ev.text)
            out.flush()
            parts.append(ev.text)
        finish = ev.finish_reason or finish
    return "".join(parts), finish


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("prompt", nargs="?", default=None, metavar="PROMPT",
                   help="the prompt; '-' or nothing (and no -p/-f) reads it from stdin")
    p.add_argument("-p", "--prompt", dest="prompt_opt", default=None, metavar="PROMPT",
                   help="the prompt, as llama.cpp's -p (instead of the positional PROMPT)")
    p.add_argument("-f", "--file", default=None, metavar="FILE",
                   help="read the prompt from FILE (UTF-8); '-' reads standard input")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--raw", "-no-cnv", "--no-conversation", dest="raw", action="store_true",
                      help="continue PROMPT as plain text; no chat template")
    mode.add_argument("--chat", "-cnv", "--conversation", dest="chat", action="store_true",
                      help="apply the chat template (the default when the model has one; a model "
                      "without one gets its family's turn format, found from its vocabulary, or ChatML)")
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None, metavar="S",
                   help="a system message before PROMPT (chat mode)")
    p.add_argument("--stop", action="append", default=[], metavar="S",
                   help="stop when the text contains S (S itself is not printed); repeatable; "
                   "backslash escapes such as \\n are understood")
    p.add_argument("-j", "--json-schema", default=None, metavar="FILE|JSON",
                   help="constrain the answer to JSON valid for this JSON schema (a file, or the schema "
                   "itself as llama.cpp's -j takes it); '{}' means any JSON value")


def read_prompt(args) -> str:
    from minfer.errors import MinferError

    given = [x for x in (args.prompt, args.prompt_opt, args.file) if x is not None]
    if len(given) > 1:
        raise MinferError("give the prompt once: as PROMPT, with -p/--prompt, or with -f/--file")
    if args.file == "":   # (an unset shell variable) was ": cannot read the prompt file"
        raise MinferError("-f/--file is empty: give the prompt's file, or - for standard input")
    if args.file == "-":   # as tokenize's --file -: standard input
        from minfer.limits import read_stdin

        return read_stdin("the prompt")
    if args.file is not None:
        try:
            with open(args.file, encoding="utf-8") as f:
                return f.read()
        except OSError as e:
            raise MinferError(f"{args.file}: cannot read the prompt file: {e.strerror}") from e
        except UnicodeDecodeError as e:
            raise MinferError(f"{args.file}: not UTF-8 text ({e.reason} at byte {e.start})") from e
    prompt = args.prompt if args.prompt is not None else args.prompt_opt
    if prompt is None or prompt == "-":
        from minfer.limits import read_stdin

        if sys.stdin is not None and sys.stdin.isatty():
            # `minfer run -m MODEL` with no prompt would otherwise wait in silence
            print("minfer: reading the prompt from standard input; end it with Ctrl-D "
                  "(or give it as PROMPT, -p or -f; `minfer chat` holds a conversation)",
                  file=sys.stderr, flush=True)
        prompt = read_stdin("the prompt")
    return prompt


def read_json_schema(arg: str) -> dict:
    """--json-schema: inline JSON (starting with '{') or a file holding it."""
    from minfer.errors import MinferError

    where = "--json-schema"
    text = arg
    if not arg.strip():   # was ": cannot read the JSON schema file"
        raise MinferError("-j/--json-schema is empty: give a JSON schema file, or the schema itself ('{}': any JSON)")
    if not arg.lstrip().startswith("{"):
        try:
            with open(arg, encoding="utf-8") as f:
                text, where = f.read(), arg
        except UnicodeDecodeError as e:   # (was a traceback)
            raise MinferError(f"{arg}: the JSON schema file is not UTF-8 text ({e.reason} at byte {e.start})") from e
        except OSError as e:
            try:   # not a file: inline JSON that is not an object ('[1]', '"x"') gets that error below
                json.loads(arg)
            except ValueError:
                raise MinferError(f"{arg}: cannot read the JSON schema file: {e.strerror}") from e
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise MinferError(f"{where}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno})") from e
    if not isinstance(schema, dict):
        raise MinferError(f"{where}: a JSON schema is an object, got {type(schema).__name__}")
    return schema


def main(args) -> int:
    from minfer.errors import MinferError

    from minfer.limits import check_text, unescape_flag

    prompt = check_text(read_prompt(args), "the prompt")
    if args.system is not None:   # invalid UTF-8 from argv: one line now, not a tokenizer TypeError
        check_text(args.system, "-sys/--system-prompt")
    if args.system is not None and args.raw:
        raise MinferError("-sys/--system-prompt needs chat mode; drop --raw")
    if args.max_tokens < -1:
        raise MinferError(f"-n/--n-predict {args.max_tokens}: expected a number of tokens >= 0, or -1")
    if not prompt.strip() and (prompt == "" or not args.raw):
        # an empty chat message gets a made-up answer to nothing; an empty raw prompt has no token
        src = ("-f " + args.file if args.file is not None else "-p" if args.prompt_opt is not None
               else "PROMPT" if args.prompt not in (None, "-") else "standard input")
        got = "no text" if not prompt else "only white space"
        raise MinferError(f"the prompt is empty ({src} gave {got}): give the text to answer as PROMPT, "
                          "with -p, -f FILE or on stdin")
    params = sampling_from_args(args)
    # "\n" typed on a shell arrives as backslash + n; non-ASCII text must survive the unescape
    stop = [unescape_flag(s, "--stop") for s in args.stop]
    if "" in stop:   # (an unset shell variable) was dropped without a word: the answer never stopped on it
        raise MinferError("--stop is empty: give the text that ends the answer, e.g. --stop '\\n\\n'")
    schema = read_json_schema(args.json_schema) if args.json_schema is not None else None
    eng = load_engine(args)
    tok = eng.tokenizer
    gen_kw = {}
    if schema is not None:
        from minfer.server.structured import GrammarConstraint, GrammarError, json_schema_grammar

        try:
            gen_kw["logits_processors"] = [GrammarConstraint(tok, json_schema_grammar(schema))]
        except GrammarError as e:
            raise MinferError(f"--json-schema {args.json_schema}: {e}") from e
    chat = args.chat or args.system is not None or (not args.raw and tok.chat_template is not None)
    if not chat and not args.raw:
        # a question put to a base model is continued, not answered: say why, once, on stderr
        print(f"minfer: note: {eng.path.name} has no chat template (a base model), so PROMPT is "
              f"continued as plain text; --chat writes it as a user turn ({tok.chat_format} format, "
              "from the vocabulary), --raw silences this note", file=sys.stderr, flush=True)
    if chat:
        messages = ([{"role": "system", "content": args.system}] if args.system is not None else [])
        ids = encode_chat(tok, messages + [{"role": "user", "content": prompt}])
    else:
        ids = tok.encode(prompt)
    max_tokens = None if args.max_tokens < 0 else args.max_tokens
    text, finish = stream(eng, ids, params, max_tokens, stop, **gen_kw)
    if not text.endswith("\n"):
        sys.stdout.write("\n")
    sys.stdout.flush()
    print(format_timings(eng.stats, finish_reason(finish, eng.stats, eng.n_ctx, max_tokens)),
          file=sys.stderr)
    return 0
