"""`minfer chat`: an interactive multi-turn conversation in the terminal.

Line editing and history come from the standard library's `readline` (GNU readline or
libedit, whichever Python was built with): importing it gives input() arrow keys, Ctrl-R
search and a history kept in $MINFER_HOME/chat_history. prompt_toolkit (also installed here)
was the alternative; readline was chosen because it is part of Python (no new dependency),
costs nothing at start-up, and leaves stdout a plain stream that the reply is written to as
it is generated, where prompt_toolkit wants to own the terminal while a prompt is active.
"""

from __future__ import annotations

import argparse
import re
import sys

HELP = "chat with a model, turn by turn (line editing and history in a terminal)"
DESCRIPTION = """Talk to an instruction-tuned model. Each line you type is a user message; the
reply streams back. The conversation is kept (the model's chat template renders it) until
you type /reset (or /clear); /exit or end of input (Ctrl-D) quits; /help lists the commands, and
any other /word is an unknown command, not a message.

Ctrl-C during a reply stops the reply (what was said so far stays in the conversation) and
the prompt comes back; Ctrl-C at the prompt clears the line. When the conversation no longer
fits in the context (-c), the oldest turns are dropped, and the chat says so; a single
message too long for the context is refused and the prompt comes back.

The model may also be named first, as with `ollama run`: `minfer chat smollm2-135m-instruct`.

Only the new part of the conversation is computed each turn: the KV cache keeps the rest.

examples:
  minfer chat smollm2-135m-instruct
  minfer chat -m qwen2.5-coder-0.5b-instruct -sys "Answer in one sentence" --temp 0
  printf 'Hi!\\nWhat did I just say?\\n' | minfer chat -m smollm2-135m-instruct --temp 0   # piped input
"""

COMMANDS_HELP = "/reset starts over, /exit quits (Ctrl-D too), Ctrl-C stops a reply"


def parents() -> list[argparse.ArgumentParser]:
    from minfer.commands.common import engine_parent, generation_parent

    return [engine_parent(), generation_parent()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None, metavar="S",
                   help="a system message opening the conversation")
    p.add_argument("-p", "--prompt", dest="first", default=None, metavar="TEXT",
                   help="the first user message (then the chat goes on); an empty TEXT is an error, "
                   "as an empty line typed at the prompt is skipped, not sent")
    from minfer.commands.common import set_default

    set_default(p, "max_tokens", 512, "stop a reply after N new tokens; -1 = until the context is full "
                "(default 512)")


class Chat:
    """The conversation and the engine; `turn(text)` answers one user message."""

    def __init__(self, eng, params, max_tokens: int | None, system: str | None, err=None):
        self.eng, self.params, self.max_tokens = eng, params, max_tokens
        self.start = [{"role": "system", "content": system}] if system is not None else []
        self.messages = list(self.start)
        self.err = err or sys.stderr

    def say(self, msg: str) -> None:
        print(f"({msg})", file=self.err, flush=True)

    def reset(self) -> None:
        self.messages = list(self.start)
        self.eng.reset()

    def reserve(self) -> int:
        """Room kept for the reply when old turns must go: -n, at most a quarter of the context."""
        quarter = max(1, self.eng.n_ctx // 4)
        return quarter if self.max_tokens is None else max(1, min(self.max_tokens, quarter))

    def fit(self, messages: list[dict]) -> tuple[list[dict], list[int]] | None:
        """The messages (oldest turns dropped as needed, the system message kept) and their ids,
        or None when the newest message alone does not fit."""
        from minfer.commands.run import encode_chat

        tok, n_ctx = self.eng.tokenizer, self.eng.n_ctx
        ids = encode_chat(tok, messages)
        if len(ids) + self.reserve() <= n_ctx:
            return messages, ids
        head, turns = messages[:len(self.start)], messages[len(self.start):]
        dropped = 0
        while len(turns) > 1:
            # drop the oldest user message with the replies that followed it
            cut = 1
            while cut < len(turns) - 1 and turns[cut]["role"] != "user":
                cut += 1
            turns = turns[cut:]
            dropped += cut
            ids = encode_chat(tok, head + turns)
            if len(ids) + self.reserve() <= n_ctx:
                break
        if len(ids) >= n_ctx:
            return None
        if dropped:
            self.say(f"the context of {n_ctx} tokens is full: dropped the {dropped} oldest "
                     f"message{'s' if dropped > 1 else ''}")
        return head + turns, ids

    def turn(self, text: str, out=None) -> str | None:
        """Answer `text`; returns the finish reason ('interrupted' after Ctrl-C), or None when the
        message was refused. Never raises for a full context."""
        from minfer.commands.run import finish_reason, stream

        fitted = self.fit(self.messages + [{"role": "user", "content": text}])
        if fitted is None:
            from minfer.commands.run import encode_chat

            n = len(encode_chat(self.eng.tokenizer, self.start + [{"role": "user", "content": text}]))
            self.say(f"that message is {n} tokens with the template; the context holds "
                     f"{self.eng.n_ctx}: send a shorter one, or restart with a larger -c")
            return None
        self.messages, ids = fitted
        parts: list[str] = []
        out = out or sys.stdout

        class Tee:
            def write(self, s):
                parts.append(s)
                out.write(s)

            def flush(self):
                out.flush()

        try:
            _, finish = stream(self.eng, ids, self.params, self.max_tokens, stop=[], out=Tee())
            finish = finish_reason(finish, self.eng.stats, self.eng.n_ctx, self.max_tokens)
        except KeyboardInterrupt:
            finish = "interrupted"
            # (a Ctrl-C landing inside the engine's call-lock bookkeeping leaves the lock held; the
            # chat is this engine's only thread, so the next turn must not be refused as concurrent)
            self.eng._release_after_interrupt()
        print(file=out, flush=True)
        self.messages.append({"role": "assistant", "content": "".join(parts)})
        if finish == "interrupted":
            self.say("reply stopped")
        elif finish == "context":
            self.say("the context is full: the reply was cut; older turns make room next time")
        return finish


def _setup_readline():
    """GNU readline/libedit for input(): editing, history (persisted); None when unavailable."""
    try:
        import readline
    except ImportError:
        return None
    import atexit

    from minfer.catalog import minfer_home

    path = minfer_home() / "chat_history"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_file():
            readline.read_history_file(path)
    except OSError:
        pass
    readline.set_history_length(1000)

    def save():
        try:
            readline.write_history_file(path)
        except OSError:
            pass

    atexit.register(save)
    return readline


def _own_ctrl_c() -> None:
    """Ctrl-C must reach the REPL as KeyboardInterrupt (it stops a reply): a SIGINT that the parent
    left ignored or blocked (both survive exec: a background job of a script, some supervisors, a
    test runner) would otherwise make Ctrl-C do nothing while a reply streams."""
    import signal

    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main(args) -> int:
    from minfer.commands.run import format_timings, load_engine, sampling_from_args

    from minfer.errors import MinferError
    from minfer.limits import check_text

    if args.max_tokens < -1 or args.max_tokens == 0:   # -n 0 would answer every message with nothing
        raise MinferError(f"-n/--n-predict {args.max_tokens}: expected a number of tokens >= 1, or -1")
    if args.system is not None:   # invalid UTF-8 from argv: one line now, not a tokenizer TypeError
        check_text(args.system, "-sys/--system-prompt")
    if args.first is not None:
        check_text(args.first, "-p/--prompt")
        if not args.first.strip():   # (an unset shell variable) was dropped without a word
            raise MinferError(f"-p/--prompt is empty ({'no text' if not args.first else 'only white space'}): "
                              "give the first message, or leave -p out and type it at the prompt")
    params = sampling_from_args(args)
    eng = load_engine(args)
    interactive = sys.stdin.isatty()
    chat = Chat(eng, params, None if args.max_tokens < 0 else args.max_tokens, args.system)
    if eng.tokenizer.chat_template is None:   # e.g. the catalog's gemma-3-270m, a base model
        print(f"minfer: note: {eng.path.name} has no chat template (a base model): the conversation "
              f"is written in the {eng.tokenizer.chat_format} turn format its vocabulary suggests, "
              "which a base model was not tuned to answer; expect replies that continue the text "
              "(`minfer run --raw` continues a text on purpose)", file=sys.stderr, flush=True)
    if interactive:
        _setup_readline()
        _own_ctrl_c()
        print(f"minfer chat: {eng.path.name} on {eng.device} (context {eng.n_ctx} tokens). "
              f"{COMMANDS_HELP}.", file=sys.stderr)
    pending = [args.first] if args.first is not None else []
    while True:
        if pending:
            line = pending.pop(0)
            if interactive:
                print(f"> {line}", flush=True)
        elif interactive:
            try:
                line = input("> ")
            except KeyboardInterrupt:   # at the prompt: a fresh line, as a shell does
                print(file=sys.stderr)
                chat.say("Ctrl-D or /exit quits")
                continue
            except EOFError:
                print(file=sys.stderr)
                break
            except UnicodeDecodeError as e:   # a terminal whose stdin decodes strictly
                chat.say(f"that line is not valid UTF-8 ({e.reason} at byte {e.start}); type it again")
                continue
        else:
            # bytes, decoded here: a strict text stdin (a UTF-8 locale other than C.UTF-8) raised
            # UnicodeDecodeError on invalid UTF-8, a traceback; check_text below names the byte
            raw = sys.stdin.buffer.readline() if hasattr(sys.stdin, "buffer") else sys.stdin.readline()
            if not raw:
                break
            line = raw.decode("utf-8", "surrogateescape") if isinstance(raw, bytes) else raw
            line = line.rstrip("\n").removesuffix("\r")   # \r\n: what text-mode stdin turned into \n
        cmd = line.strip()
        if cmd in ("/exit", "/quit", "/bye"):
            break
        if cmd in ("/reset", "/clear"):   # /clear: ollama's and llama-cli's word for it
            chat.reset()
            chat.say("conversation cleared")
            continue
        if cmd in ("/help", "/?"):
            chat.say(COMMANDS_HELP)
            continue
        if not cmd:
            continue
        if re.fullmatch(r"/[A-Za-z?]+", cmd):
            # a mistyped command ("/rest", "/quti") was sent to the model as a message: the
            # conversation went on instead of being reset or ended
            chat.say(f"unknown command {cmd}: {COMMANDS_HELP}")
            continue
        try:
            check_text(line, "the message")  # invalid UTF-8 typed or piped in: one line, no traceback
        except MinferError as e:
            if not interactive:
                raise
            chat.say(f"{e}; type it again")   # a typed slip does not end the conversation
            continue
        finish = chat.turn(line)
        if interactive and finish is not None and finish != "interrupted":
            print(format_timings(eng.stats, finish), file=sys.stderr)
    return 0
