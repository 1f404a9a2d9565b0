"""Chat templates (Jinja, stored in GGUF as tokenizer.chat_template), rendered as HF does --
as untrusted programs, with limits.

HuggingFace transformers renders templates in an ImmutableSandboxedEnvironment with
trim_blocks=True, lstrip_blocks=True and the loop-controls extension, a `tojson` filter that
keeps non-ASCII characters (ensure_ascii=False) and takes `indent`, and the globals
`raise_exception` and `strftime_now` (transformers: utils/chat_template_utils.py,
_compile_jinja_template). Templates are written against that environment, so minfer gives
them the same one.

A template comes from a downloaded file, so it is a program nobody vetted. Jinja's sandbox
stops it from reaching Python internals, but not from running for ever or filling memory:
nested `range(100000)` loops, `(n+9)**(10**9)`, `'a'*10**9` and recursive macros each hung
or crashed minfer before (issue 15). So every render here runs under a budget
(`TemplateLimits`), enforced inside the render itself, so a server thread is never pinned:
- a deadline, checked at every loop iteration, call, attribute/item access and operator;
- a count of loop iterations: every `{% for %}` iterable is wrapped (an AST rewrite at
  compile time, `_Guard`) by a counting iterator;
- a call depth (recursive macros end in a clear error, not a RecursionError);
- sizes: every operator, filter and string method that could build a huge string, list or
  integer in one C-level step (`*`, `**`, `%`, `+`, `~`, join/center/indent/replace/format,
  `str.center`, `int.to_bytes` ...) is checked *before* it runs -- a C-level big-int power
  cannot be interrupted once started -- and the output is counted as it is produced;
- a total of the text and items all operations built, so many medium strings cannot add up.
Every failure, a limit or any exception the template raises, is one TemplateError (a
MinferError) naming the file and "chat template".

A file without a template gets its family's llama.cpp format, chosen by the turn markers of
its vocab (minfer/tokenizer/templates.py), else ChatML, the fallback llama.cpp uses
(common/chat.cpp: CHATML_TEMPLATE_SRC).
"""

from __future__ import annotations

import json
import re
import threading
import time
import types
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache, wraps
from typing import Any

from minfer.errors import MinferError
from minfer.safe_text import safe

CHATML_TEMPLATE = (
    "{%- for message in messages -%}\n"
    "  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "  {{- '<|im_start|>assistant\\n' -}}\n"
    "{%- endif -%}"
)


class TemplateError(MinferError):
    """A chat template failed to compile or render, raised on purpose, or ran past a limit."""


class TemplateLimitError(TemplateError):
    """A chat template ran past one of its TemplateLimits."""


@dataclass(frozen=True)
class TemplateLimits:
    """What one render may spend. Real templates (ChatML, Llama 3, Qwen2.5 with tools) use
    well under 1% of each: they loop over the messages and tools once."""

    seconds: float = 1.0              # wall time of one render, compile included
    iterations: int = 1_000_000       # loop iterations, all loops together
    depth: int = 64                   # nested calls (macros, recursive loops)
    min_text: int = 1 << 20           # characters any one string or the output may reach:
    text_per_input: int = 4           # ... at least min_text, else this times the input's size
    items: int = 100_000              # items in one list (Jinja's own range() cap)
    int_bits: int = 1 << 16           # bits of an integer an operator may produce
    total_factor: int = 64            # all strings/lists built, together: this times the text cap
    template_chars: int = 256 << 10   # the template source itself


DEFAULT_LIMITS = TemplateLimits()


class _Budget:
    """The running account of one render (one per thread: see _active)."""

    def __init__(self, limits: TemplateLimits, input_size: int, source: str):
        self.limits = limits
        self.source = source
        self.deadline = time.monotonic() + limits.seconds
        self.text = max(limits.min_text, limits.text_per_input * input_size)
        self.total = limits.total_factor * self.text
        self.built = 0
        self.iterations = 0
        self.depth = 0

    def fail(self, what: str) -> TemplateLimitError:
        lim = self.limits
        return TemplateLimitError(
            f"{what}; chat templates are untrusted programs and a render may take at most "
            f"{lim.seconds:g} s, {lim.iterations:,} loop iterations, {lim.depth} nested calls "
            f"and {self.text:,} characters per string")

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise self.fail(f"the render ran past {self.limits.seconds:g} s")

    def check_text(self, n: int, what: str) -> None:
        if n > self.text:
            raise self.fail(f"{what} would make {n:,} characters (limit {self.text:,})")

    def charge(self, value: Any) -> Any:
        """Count what an operation built; refuse a result past the per-value caps."""
        if isinstance(value, str):
            self.check_text(len(value), "a string")
            self.built += len(value)
        elif isinstance(value, (list, tuple, dict)):
            if len(value) > self.limits.items:
                raise self.fail(f"a list of {len(value):,} items (limit {self.limits.items:,})")
            self.built += len(value)
        elif isinstance(value, int) and value.bit_length() > self.limits.int_bits:
            raise self.fail(f"an integer of {value.bit_length():,} bits (limit {self.limits.int_bits:,})")
        if self.built > self.total:
            raise self.fail(f"the template built {self.built:,} characters and items in all "
                            f"(limit {self.total:,})")
        return value


_active = threading.local()


def _budget() -> _Budget:
    b = getattr(_active, "budget", None)
    # outside render_chat (a test compiling directly): a fresh default budget for this check
    return b if b is not None else _Budget(DEFAULT_LIMITS, 0, "chat template")


def weight(x: Any, cap: int) -> int:
    """Characters of the strings plus items of the containers reachable from x, counted up to
    just past `cap` (so a list holding one huge string 10**5 times costs O(cap) to measure)."""
    total, stack, seen = 0, [x], 0
    while stack and total <= cap:
        v = stack.pop()
        seen += 1
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += len(v)
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            total += len(v)
            stack.extend(v)
        else:
            total += 8
        if seen > cap:
            break
    return total


# ---- operators, calls and filters, checked before they run -----------------------------

_WIDE_FIELD = re.compile(r"%[-+ #0]*(\*|\d{6,})|\.(\*|\d{6,})")   # printf-style widths
_BRACE_FIELD = re.compile(r"\{[^{}]*(\{|\d{6,})")                 # str.format nested or wide


def _check_binop(b: _Budget, op: str, left: Any, right: Any) -> None:
    if op == "**" and isinstance(left, int) and isinstance(right, int) and right > 1 and abs(left) > 1:
        bits = left.bit_length() * right
        if bits > b.limits.int_bits:
            raise b.fail(f"{safe(left, 20)} ** {safe(right, 20)} would make an integer of about "
                         f"{bits:,} bits (limit {b.limits.int_bits:,})")
    elif op == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                b.check_text(weight(seq, b.text) * max(n, 0), "repeating a sequence")
                if isinstance(seq, (list, tuple)) and len(seq) * n > b.limits.items:
                    raise b.fail(f"a list of {len(seq) * n:,} items (limit {b.limits.items:,})")
        if isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > b.limits.int_bits:
                raise b.fail(f"a product of {left.bit_length() + right.bit_length():,} bits "
                             f"(limit {b.limits.int_bits:,})")
    elif op == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        b.check_text(weight(left, b.text) + weight(right, b.text), "joining two sequences")
    elif op == "%" and isinstance(left, str):
        _check_format_string(b, left, "%")
        b.check_text(len(left) + weight(right, b.text), "%-formatting")


def _check_format_string(b: _Budget, fmt: str, style: str) -> None:
    pattern = _WIDE_FIELD if style == "%" else _BRACE_FIELD
    if pattern.search(fmt):
        raise b.fail(f"the format string {safe(fmt, 40)!s} asks for a width or precision that is "
                     "computed or of 6 digits or more")


# Filters written in Python whose cost grows faster than their input (measured on the loaded
# dev box: striptags on 1 MB of 100,000 tags 40 s -- markupsafe cuts one tag at a time, copying
# the rest; wordwrap and urlize on 1 MB ~2 s). One such call cannot be interrupted by the
# deadline, so its input is bounded before it runs.
SLOW_FILTER_CHARS = 256 << 10
STRIPTAGS_WORK = 50_000_000  # characters x tags


def _check_slow(b: _Budget, name: str, value: Any) -> None:
    if not isinstance(value, str):
        return
    if name == "striptags":
        work = len(value) * (value.count("<") + 1)
        if work > STRIPTAGS_WORK:
            raise b.fail(f"striptags on {len(value):,} characters with {value.count('<'):,} tags "
                         f"(its cost grows with their product; limit {STRIPTAGS_WORK:,})")
    elif len(value) > SLOW_FILTER_CHARS:
        raise b.fail(f"the {name} filter on {len(value):,} characters (limit {SLOW_FILTER_CHARS:,})")


def _check_str_method(b: _Budget, obj: Any, args: tuple, kwargs: dict) -> None:
    """Methods of str/int/list called from the template that could build a huge value."""
    owner, name = obj.__self__, obj.__name__
    values = list(args) + list(kwargs.values())
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) > b.text:
            raise b.fail(f"{type(owner).__name__}.{name}() called with {safe(v, 20)}")
    if isinstance(owner, str):
        if name == "striptags":  # a Markup method
            _check_slow(b, name, owner)
        elif name == "replace" and len(args) >= 2:
            old, new = str(args[0]), str(args[1])
            hits = owner.count(old) if old else len(owner) + 1
            b.check_text(len(owner) + hits * max(len(new) - len(old), 0), "str.replace()")
        elif name == "join" and args:
            items = args[0]
            n = len(items) if isinstance(items, (list, tuple, str)) else b.limits.items
            b.check_text(weight(items, b.text) + n * len(owner), "str.join()")
        elif name == "expandtabs":
            size = int(values[0]) if values else 8
            b.check_text(len(owner) + owner.count("\t") * size, "str.expandtabs()")


def _pre(b: _Budget, name: str, args: tuple, kwargs: dict) -> None:
    """Checks of the built-in filters that can multiply their input (jinja2/filters.py)."""
    def arg(i, key, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    value = arg(0, "value")
    if name == "center":
        b.check_text(max(_int(b, arg(1, "width", 80)), weight(value, b.text)), "the center filter")
    elif name == "indent":
        width = arg(1, "width", 4)
        per_line = len(width) if isinstance(width, str) else _int(b, width)
        lines = str(value).count("\n") + 1 if isinstance(value, str) else 1
        b.check_text(weight(value, b.text) + lines * per_line, "the indent filter")
    elif name == "join":
        sep = str(arg(1, "d", ""))
        n = len(value) if hasattr(value, "__len__") else b.limits.items
        b.check_text(weight(value, b.text) + n * len(sep), "the join filter")
    elif name == "replace" and isinstance(value, str):
        old, new = str(arg(1, "old", "")), str(arg(2, "new", ""))
        hits = value.count(old) if old else len(value) + 1
        b.check_text(len(value) + hits * max(len(new) - len(old), 0), "the replace filter")
    elif name == "format" and isinstance(value, str):
        _check_format_string(b, value, "%")
        b.check_text(len(value) + weight(list(args[1:]) + list(kwargs.values()), b.text), "the format filter")
    elif name in ("striptags", "wordwrap", "urlize"):
        _check_slow(b, name, value)
    elif name in ("batch", "slice"):
        _int(b, arg(1, "linecount" if name == "batch" else "slices", 1), b.limits.items)
    elif name in ("tojson", "pprint", "string", "list", "wordwrap", "truncate", "e", "escape"):
        indent = kwargs.get("indent", args[2] if name == "tojson" and len(args) > 2 else 0)
        b.check_text(weight(value, b.text) * (1 + min(_int(b, indent or 0), 64)), f"the {name} filter")


def _int(b: _Budget, v: Any, cap: int | None = None) -> int:
    cap = b.text if cap is None else cap
    if isinstance(v, int) and abs(v) > cap:
        raise b.fail(f"a size argument of {safe(v, 20)} (limit {cap:,})")
    return v if isinstance(v, int) else 0


def _guard_filter(name: str, f):
    @wraps(f)  # keeps jinja_pass_arg, so Jinja still passes the context/environment first
    def guarded(*args, **kwargs):
        b = _budget()
        b.tick()
        user_args = args[1:] if getattr(f, "jinja_pass_arg", None) is not None else args
        _pre(b, name, user_args, kwargs)
        return b.charge(f(*args, **kwargs))

    return guarded


def _checked_range(*args):
    b = _budget()
    if not all(isinstance(a, int) for a in args):
        raise TypeError("range() takes integers")
    r = range(*args)
    if len(r) > b.limits.items:
        raise b.fail(f"range() of {len(r):,} numbers (limit {b.limits.items:,})")
    return r


def _lipsum(n=5, html=True, min=20, max=100):
    from jinja2.utils import generate_lorem_ipsum

    b = _budget()
    if not all(isinstance(v, int) and 0 <= v <= 1000 for v in (n, min, max)):
        raise b.fail("lipsum() asked for more than 1000 paragraphs or words")
    return generate_lorem_ipsum(n, html, min, max)


def _raise_exception(message):
    raise TemplateError(f"the chat template raised an error: {safe(message, 300)}")


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # HF's filter: json.dumps with ensure_ascii=False; the result is not HTML-escaped
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


# ---- the environment -------------------------------------------------------------------

def _make_env():
    from jinja2 import nodes
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class Guard(NodeTransformer):
        """Every loop's iterable goes through environment.minfer_loop (counted), every `~`
        through environment.minfer_concat (sized). Environment attributes cannot be
        rebound by a template, unlike a global name."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = nodes.Call(nodes.EnvironmentAttribute("minfer_loop"), [node.iter], [],
                                   None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            node = self.generic_visit(node)
            return nodes.Call(nodes.EnvironmentAttribute("minfer_concat"), list(node.nodes), [],
                              None, None, lineno=node.lineno)

    class LimitedEnvironment(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"+", "*", "**", "%", "/", "//", "-"})

        def _parse(self, source, name, filename):
            return Guard().visit(super()._parse(source, name, filename))

        def call(*a, **kwargs):  # (self, context, obj, *args): no names a template could clash with
            self, context, obj, *args = a
            b = _budget()
            b.tick()
            # methods of str/int/list/dict and of their subclasses (Markup's are Python methods)
            if isinstance(obj, (types.BuiltinMethodType, types.MethodType)) \
                    and isinstance(obj.__self__, (str, int, list, dict)):
                _check_str_method(b, obj, tuple(args), kwargs)
            b.depth += 1
            try:
                if b.depth > b.limits.depth:
                    raise b.fail(f"calls nested {b.depth} deep (a recursive macro?)")
                return b.charge(ImmutableSandboxedEnvironment.call(self, context, obj, *args, **kwargs))
            finally:
                b.depth -= 1

        def call_binop(self, context, operator, left, right):
            b = _budget()
            b.tick()
            _check_binop(b, operator, left, right)
            return b.charge(super().call_binop(context, operator, left, right))

        def getattr(self, obj, attribute):
            _budget().tick()
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            _budget().tick()
            return super().getitem(obj, argument)

        def wrap_str_format(self, value):
            wrapper = super().wrap_str_format(value)
            if wrapper is not None:
                b = _budget()
                _check_format_string(b, value.__self__, "{")

                @wraps(wrapper)
                def checked(*args, **kwargs):
                    b.check_text(len(value.__self__) + weight([args, kwargs], b.text), "str.format()")
                    return b.charge(wrapper(*args, **kwargs))

                return checked
            return None

        def minfer_loop(self, iterable):
            b = _budget()
            for item in iterable:
                b.iterations += 1
                if b.iterations > b.limits.iterations:
                    raise b.fail(f"loops ran past {b.limits.iterations:,} iterations")
                b.tick()
                yield item

        def minfer_concat(self, *parts):
            b = _budget()
            b.check_text(sum(weight(p, b.text) for p in parts), "the ~ operator")
            return b.charge("".join(_finalize(p) for p in parts))

    def _finalize(value):
        """Each {{ value }} (and ~ operand) becomes a string: sized before str() runs."""
        if isinstance(value, str):
            return value
        b = _budget()
        b.check_text(weight(value, b.text) * 2, "printing a value")
        if isinstance(value, int) and value.bit_length() > b.limits.int_bits:
            raise b.fail("printing a huge integer")
        return b.charge(str(value))

    env = LimitedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols],
                             finalize=_finalize)
    env.filters["tojson"] = _tojson
    for name in list(env.filters):
        env.filters[name] = _guard_filter(name, env.filters[name])
    env.globals["range"] = _checked_range
    env.globals["lipsum"] = _lipsum
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV_LOCK = threading.Lock()
_ENV: list = []


def _environment():
    with _ENV_LOCK:
        if not _ENV:
            _ENV.append(_make_env())
        return _ENV[0]


@lru_cache(maxsize=16)
def _compile(template: str):
    return _environment().from_string(template)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", source: str = "chat template",
                limits: TemplateLimits = DEFAULT_LIMITS, **extra) -> str:
    """Render `messages` ([{'role': ..., 'content': ...}, ...]) with a Jinja chat template.

    `extra` is passed to the template as further variables (e.g. tools=[...]), as HF's
    apply_chat_template passes its kwargs. Any failure, a limit included, is a TemplateError
    (a MinferError) of one line naming `source` and "chat template".
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise MinferError(f"{source}: messages must be a list of dicts with 'role' and "
                          "'content'")
    if len(template) > limits.template_chars:
        raise TemplateError(f"{source}: the chat template has {len(template):,} characters, "
                            f"more than the {limits.template_chars:,} minfer accepts")
    variables = dict(messages=messages, add_generation_prompt=add_generation_prompt,
                     bos_token=bos_token, eos_token=eos_token, **extra)
    budget = _Budget(limits, weight(variables, 1 << 40), source)
    previous = getattr(_active, "budget", None)
    _active.budget = budget
    stage = "compile"
    try:
        tmpl = _compile(template)
        stage = "render"
        out, n = [], 0
        for piece in tmpl.generate(**variables):
            n += len(piece)
            budget.check_text(n, "the output")
            budget.tick()
            out.append(piece)
        return "".join(out)
    except TemplateLimitError as e:
        raise TemplateLimitError(f"{source}: chat template stopped: {e}") from None
    except TemplateError as e:
        raise TemplateError(f"{source}: {e}") from None
    except Exception as e:  # noqa: BLE001 -- an untrusted program: any failure is its failure
        what = "does not compile" if stage == "compile" else "rendering failed"
        raise TemplateError(f"{source}: chat template {what}: {type(e).__name__}: "
                            f"{safe(e, 300)}") from None
    finally:
        _active.budget = previous


# ---- chat -> token ids, with the client's content kept as text ---------------------------

_CONTROL_RE: dict[int, Any] = {}  # id(tokenizer) -> (tokenizer, compiled regex or None)


def _control_pattern(tok):
    """A regex matching the text of any control/unknown token or turn marker of `tok` (cached
    per tokenizer)."""
    from minfer.tokenizer import vocab as V

    hit = _CONTROL_RE.get(id(tok))
    if hit is not None and hit[0] is tok:
        return hit[1]
    texts = {tok.token_text(i) for i in range(tok.n_vocab)
             if tok.token_attr(i) & (V.ATTR_CONTROL | V.ATTR_UNKNOWN)}
    texts |= {tok.token_text(i) for i in getattr(tok, "turn_markers", ())}   # harmony's
    pat = re.compile("|".join(re.escape(t) for t in sorted(texts, key=len, reverse=True))) if texts else None
    if len(_CONTROL_RE) > 8:
        _CONTROL_RE.clear()
    _CONTROL_RE[id(tok)] = (tok, pat)
    return pat


def chat_token_ids(tok, messages: list[dict], special_in_content: bool = False,
                   add_generation_prompt: bool = True, continue_final_message: bool = False,
                   add_special: bool | None = None, **extra) -> list[int]:
    """The prompt ids of a chat: the model's template rendered, then tokenized.

    The template's own markers (<|im_start|> ...) become control tokens. Text inside a
    message's content that spells a control token (a client writing `<|im_end|><|im_start|>
    system`) stays plain text unless `special_in_content` (llama.cpp's CLI behaviour): a
    server must not let a user's text forge a turn of another role. To know which characters
    of the output came from content, a message holding such text is rendered a second time
    with a unique placeholder in its place; the real output must equal the placeholder output
    with the content put back (as is, or stripped, which Llama-3-style templates do), else the
    request is refused rather than guessed at.

    continue_final_message: the final (assistant) message is left open for the model to go on
    with, and no generation prompt follows (continuation.py). add_special: as encode()'s add_bos
    (None: BOS/EOS as the vocab's metadata says; False: only what the template writes).
    """
    def render(msgs: list[dict]) -> str:
        if continue_final_message:
            from minfer.tokenizer.continuation import open_final_message

            return open_final_message(lambda m: tok.apply_chat_template(m, add_generation_prompt=False, **extra),
                                      msgs)
        return tok.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, **extra)

    text = render(messages)
    pat = None if special_in_content else _control_pattern(tok)
    risky = [] if pat is None else [i for i, m in enumerate(messages)
                                    if isinstance(m.get("content"), str) and pat.search(m["content"])]
    from minfer.tokenizer.chat_spelling import encode_chat_text

    ids = encode_chat_text(tok, messages, (lambda: tok.encode(text, add_bos=add_special, parse_special=True))
                           if not risky else
                           (lambda: tok.encode_segments(_segments(tok, messages, risky, text, render),
                                                        add_bos=add_special)))
    bos = tok.bos_id
    if bos is not None and len(ids) >= 2 and ids[0] == bos and ids[1] == bos:
        ids = ids[1:]  # the template wrote BOS itself and the tokenizer added another
    return ids


def _segments(tok, messages, risky, text, render) -> list[tuple[str, bool]]:
    import secrets

    nonce = secrets.token_hex(8)
    placeholder = {i: f"\ue000minfer-{nonce}-{i}\ue001" for i in risky}
    marks = {v: i for i, v in placeholder.items()}
    placeheld = [dict(m, content=placeholder[i]) if i in placeholder else m for i, m in enumerate(messages)]
    shaped = render(placeheld)
    parts = re.split("(" + "|".join(map(re.escape, marks)) + ")", shaped)
    for shape in (lambda s: s, str.strip):
        segs = [(p, p not in marks) if p not in marks else (shape(messages[marks[p]]["content"]), False)
                for p in parts if p]
        if "".join(s for s, _ in segs) == text:
            return segs
    i = risky[0]
    raise MinferError(f"messages[{i}].content contains the text of a control token (e.g. "
                      f"'{safe(_first_control(tok, messages[i]['content']), 40)}') and the chat template "
                      "changes message content, so minfer cannot keep that text as plain text; "
                      "remove it, or start the server with --special-in-content")


def _first_control(tok, content: str) -> str:
    m = _control_pattern(tok).search(content)
    return m.group() if m else ""
