"""Tool calls: OpenAI's `tools` / `tool_choice` through the model's own chat template, and the
model's Hermes-style calls parsed back into OpenAI `tool_calls`.

Format (Qwen2.5's chat template, which follows NousResearch's Hermes function calling): the
template lists the tools as JSON inside <tools></tools> in the system turn and asks for each
call as
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>
An assistant turn with calls is rendered from messages[i].tool_calls[j].function.{name,
arguments} with `arguments | tojson`, so arguments must reach the template as a JSON object
(transformers' convention), not as OpenAI's JSON string; tool results come back as role "tool"
messages, which the template wraps in <tool_response></tool_response>.

Only templates that write <tool_call> tags are understood; a template that renders tools in
another format (or not at all) is refused with a 400, never answered with prose -- but under
tool_choice "none", where the tools are rendered (as OpenAI keeps them visible) and the answer
is never parsed for calls (a one-token <tool_call> tag is banned: no_tool_calls).

An answer cut by max_tokens (finish_reason "length") has no tool_calls, streamed or not: its
calls may be half-written or missing, so all of its text is the content (tool_message,
tool_chunker); a block whose arguments are not a JSON object is not a call either (_as_call).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any, Callable

from minfer.server.schemas import NamedToolChoice
from minfer.server.structured import lark_json, special_or_literal

OPEN, CLOSE = "<tool_call>", "</tool_call>"


class ToolError(ValueError):
    """A request this server cannot honour: a 400 with `code`, naming the field `param`."""

    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.param, self.code = param, code


def template_supports_tools(template: str | None) -> bool:
    """True when the chat template renders `tools` and asks for Hermes-style <tool_call> tags."""
    return bool(template) and "tools" in template and OPEN in template


def template_tools(tools: list[Any]) -> list[dict]:
    """The request's tools as the template expects them (OpenAI's {"type": "function",
    "function": {name, description, parameters}}, as transformers passes them)."""
    out = []
    for t in tools:
        f = t.function
        fn: dict[str, Any] = {"name": f.name}
        if f.description is not None:
            fn["description"] = f.description
        fn["parameters"] = f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
        if f.strict is not None:
            fn["strict"] = f.strict
        out.append({"type": "function", "function": fn})
    return out


def template_messages(messages: list[Any]) -> list[dict]:
    """Request messages -> the dicts a chat template reads; earlier tool calls with their
    arguments decoded to objects (see the module docstring)."""
    out = []
    for i, m in enumerate(messages):
        for j, part in enumerate(m.content if isinstance(m.content, list) else []):
            if part.type != "text":
                raise ToolError(f"messages[{i}].content[{j}].type",
                                f"messages[{i}].content[{j}]: content parts of type {part.type!r} are not "
                                'supported (text models only: send {"type": "text", "text": ...})',
                                "unsupported_value")
        d: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role, "content": m.text()}
        if m.name:
            d["name"] = m.name
        if m.tool_call_id is not None:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            calls = []
            for j, c in enumerate(m.tool_calls):
                try:
                    args = json.loads(c.function.arguments) if c.function.arguments.strip() else {}
                except json.JSONDecodeError as e:
                    raise ToolError(f"messages[{i}].tool_calls[{j}].function.arguments",
                                    f"messages[{i}].tool_calls[{j}].function.arguments is not valid JSON "
                                    f"({e.msg}); expected the arguments object as a JSON string") from e
                calls.append({"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": args}})
            d["tool_calls"] = calls
        out.append(d)
    return out


MAX_PARALLEL_CALLS = 16   # tool calls in one constrained answer (tool_call_lark)


def choose_tools(tools: list[Any], tool_choice: Any) -> tuple[list[Any], bool]:
    """(the tools the model may call, whether it must call one) for a tool_choice."""
    if tool_choice is None or tool_choice == "auto":
        return tools, False
    if tool_choice == "none":
        return [], False
    if tool_choice == "required":
        return tools, True
    name = tool_choice.function.name
    named = [t for t in tools if t.function.name == name]
    if not named:
        raise ToolError("tool_choice", f"tool_choice names the function `{name}`, which is not among "
                        f"the tools ({', '.join(t.function.name for t in tools) or 'none'})")
    return named, True


def _call_schema(tool: Any) -> dict:
    params = tool.function.parameters if tool.function.parameters is not None else {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": tool.function.name}, "arguments": params},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_call_lark(tok: Any, tools: list[Any], parallel: bool, alternative: str | None = None) -> str:
    """A Lark grammar for one call (or several, newline-separated, when `parallel`) of one of
    `tools`, each `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` with the
    arguments valid for that function's parameters schema. `alternative`: a Lark term the
    output may be instead (a response_format's %json, for tool_choice "auto")."""
    schemas = [_call_schema(t) for t in tools]
    body = lark_json(schemas[0] if len(schemas) == 1 else {"anyOf": schemas})
    # at most MAX_PARALLEL_CALLS: unbounded, a small model under tool_choice "required" could
    # answer call after call until max_tokens
    start = f'call ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else "call"
    if alternative is not None:
        start = f"calls | answer\ncalls: {start}\nanswer: {alternative}"
    return (f"start: {start}\n"
            f'call: {special_or_literal(tok, OPEN)} "\\n" body "\\n" {special_or_literal(tok, CLOSE)}\n'
            f"body: {body}\n")


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _as_call(body: str) -> dict | None:
    """One OpenAI tool call from the JSON between the tags, or None if it is not one."""
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models write the arguments as a JSON string already
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None   # never a tool_calls entry whose arguments are not JSON: the block stays text
    if not isinstance(args, dict):
        return None       # OpenAI's arguments are a JSON object
    arguments = json.dumps(args, ensure_ascii=False)
    return {"id": new_call_id(), "type": "function", "function": {"name": obj["name"], "arguments": arguments}}


def parse_tool_calls(text: str) -> tuple[str | None, list[dict]]:
    """(content, tool_calls) of a whole answer: the text outside complete <tool_call> blocks,
    and each block that holds a {"name", "arguments"} object. A block that does not parse stays
    in the content, so nothing the model wrote is lost."""
    calls: list[dict] = []
    content: list[str] = []
    pos = 0
    while True:
        a = text.find(OPEN, pos)
        if a < 0:
            break
        b = text.find(CLOSE, a + len(OPEN))
        if b < 0:
            break
        call = _as_call(text[a + len(OPEN):b].strip())
        if call is None:
            content.append(text[pos:b + len(CLOSE)])
        else:
            content.append(text[pos:a])
            calls.append(call)
        pos = b + len(CLOSE)
    content.append(text[pos:])
    joined = "".join(content)
    if calls:
        joined = joined.strip()
    return (joined or None), calls


class ToolStreamParser:
    """Streamed text in, (content to send, completed tool calls) out.

    Text before a <tool_call> streams as content; from the opening tag on, text is held until
    the closing tag, and the call is then sent whole (one delta.tool_calls chunk). A suffix
    that could still be the start of the opening tag is held back too."""

    def __init__(self) -> None:
        self.buf = ""
        self.n_calls = 0
        self._in_call = False
        self._after_call = False  # whitespace between calls is not content

    def push(self, text: str) -> tuple[str, list[dict]]:
        self.buf += text
        content, calls = [], []
        while True:
            if self._in_call:
                b = self.buf.find(CLOSE)
                if b < 0:
                    break
                body, self.buf = self.buf[:b], self.buf[b + len(CLOSE):]
                self._in_call = False
                call = _as_call(body.strip())
                if call is None:
                    content.append(OPEN + body + CLOSE)
                else:
                    calls.append(call)
                    self._after_call = True
                continue
            a = self.buf.find(OPEN)
            if a >= 0:
                content.append(self.buf[:a])
                self.buf = self.buf[a + len(OPEN):]
                self._in_call = True
                continue
            keep = 0
            for n in range(min(len(OPEN) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(OPEN[:n]):
                    keep = n
                    break
            content.append(self.buf[:len(self.buf) - keep])
            self.buf = self.buf[len(self.buf) - keep:]
            break
        out = "".join(content)
        if (self._after_call or calls) and out.isspace():
            out = ""  # the newlines between and after calls are not an answer
        self.n_calls += len(calls)
        return out, calls

    def flush(self) -> str:
        """What is still held at the end (an unclosed call is returned as text)."""
        out = (OPEN if self._in_call else "") + self.buf
        self.buf, self._in_call = "", False
        return out


# ---- a chat request -> its prompt and its logits processors ------------------------------

class ChatPlan:
    """What the chat endpoint needs from a request with tools / response_format / logit_bias."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] = []
        self.processors: list = []
        self.parse_tools = False  # the answer may hold <tool_call> blocks to return as tool_calls


def response_schema(rf: Any) -> dict | None:
    """The JSON schema a response_format asks for (None: free text)."""
    if rf is None or rf.type == "text":
        return None
    if rf.type == "json_object":
        return {"type": "object"}
    return rf.json_schema.schema_


def plan_chat(tok: Any, req: Any, encode: Any) -> ChatPlan:
    """Render the messages (with tools when they are in play), build the grammar that
    response_format / tool_choice ask for, and the logit_bias. Raises ToolError (a 400 naming
    the field) or MinferError (a template failure)."""
    from minfer.server.prompting import chat_prompt_options, check_tool_tags_kept
    from minfer.server.structured import GrammarConstraint, GrammarError, json_schema_grammar, lark_grammar
    from minfer.tokenizer.continuation import ContinuationError

    plan = ChatPlan()
    # vLLM's add_generation_prompt, continue_final_message, add_special_tokens (prompting.py)
    extra: dict[str, Any] = chat_prompt_options(req)
    messages = template_messages(req.messages)
    supports = template_supports_tools(tok.chat_template)
    if not supports:
        for i, m in enumerate(req.messages):
            if m.tool_calls or m.role == "tool":
                field = f"messages[{i}].tool_calls" if m.tool_calls else f"messages[{i}].role"
                raise ToolError(field, f"{field}: this model's chat template does not render tool calls "
                                "or tool results (no <tool_call> format in tokenizer.chat_template)",
                                "unsupported_value")
    choice = req.tool_choice
    if not req.tools and choice not in (None, "none", "auto"):
        raise ToolError("tool_choice", "tool_choice requires tools: send the functions in `tools`")
    callable_tools: list[Any] = []
    must_call = False
    if req.tools and choice == "none":
        # OpenAI: the tools stay in the prompt, but the model may not call them: the answer is
        # plain content (never parsed), and a one-token <tool_call> tag is banned
        extra["tools"] = template_tools(req.tools)
        plan.processors.append(no_tool_calls(tok))
    elif req.tools:
        if not supports:
            raise ToolError("tools", "tools: this model's chat template does not render tools in a "
                            "format minfer parses (Hermes/Qwen <tool_call> tags); call without tools",
                            "unsupported_value")
        callable_tools, must_call = choose_tools(req.tools, choice)
        extra["tools"] = template_tools(req.tools)
        plan.parse_tools = True
        check_tool_tags_kept(tok, req)
    # encode(messages, template variables) renders and tokenizes (app.py: chat_token_ids, which
    # keeps control-token text in message content as text)
    try:
        plan.prompt_ids = encode(messages, extra)
    except ContinuationError as e:
        raise ToolError("continue_final_message", str(e)) from e

    schema = response_schema(req.response_format)
    # a named function is one call of it (as vLLM does); "required" may make several unless the
    # client sent parallel_tool_calls=false
    parallel = req.parallel_tool_calls is not False and not isinstance(choice, NamedToolChoice)
    grammar, param = None, "response_format.json_schema.schema"
    try:
        if plan.parse_tools and (must_call or schema is not None):
            param = "tools"
            alt = lark_json(schema) if (schema is not None and not must_call) else None
            grammar = lark_grammar(tool_call_lark(tok, callable_tools, parallel, alt))
        elif schema is not None:
            grammar = json_schema_grammar(schema)
        if grammar is not None:
            plan.processors.append(GrammarConstraint(tok, grammar))
    except GrammarError as e:
        code = "unsupported_value" if "nimplemented" in str(e) or "not supported" in str(e) else "invalid_value"
        # llguidance's message goes on with the whole generated grammar ("   1 | start: ..."): keep
        # what comes before it, on one line (the caret lines only point into that listing)
        kept = []
        for line in str(e).splitlines():
            if re.match(r"\s*\d+ \|", line):
                break
            if line.strip() and line.strip() != "^":
                kept.append(line.strip())
        msg = " ".join(kept)
        msg = msg[:400] + (" (...)" if len(msg) > 400 else "")
        if param == "tools":
            names = ", ".join(repr(getattr(getattr(t, "function", None), "name", "?")) for t in callable_tools)
            msg += f" (tools {names})"
        raise ToolError(param, f"{param}: {msg}", code) from e
    if req.logit_bias:
        plan.processors.insert(0, logit_bias(tok, req.logit_bias))
    plan.processors = [p for p in plan.processors if p is not None]
    return plan


def no_tool_calls(tok: Any) -> Any:
    """tool_choice "none": a logits processor banning the <tool_call> tag when the vocab has it
    as one special token (Qwen's); None when it has not (then the tag is text like any other)."""
    from minfer.server.structured import LogitBias

    ids = tok.encode(OPEN, add_bos=False, parse_special=True)
    if special_or_literal(tok, OPEN) == OPEN and len(ids) == 1:
        return LogitBias({ids[0]: float("-inf")})
    return None


def logit_bias(tok: Any, bias: dict[str, float]) -> Any:
    """OpenAI's logit_bias ({token id as a string: bias}) as a logits processor."""
    from minfer.server.structured import LogitBias

    ids = {}
    for k, v in bias.items():
        try:
            t = int(k)
        except ValueError:
            raise ToolError("logit_bias", f"logit_bias: key {k!r} is not a token id") from None
        if not 0 <= t < tok.n_vocab:
            raise ToolError("logit_bias", f"logit_bias: token id {t} is outside the vocabulary [0, {tok.n_vocab})")
        ids[t] = float(v)
    return LogitBias(ids)


def tool_message(resp: dict, text: str) -> None:
    """A non-streamed chat answer's <tool_call> blocks become message.tool_calls -- unless
    max_tokens cut the answer (finish_reason "length"): then it has no tool_calls (its calls may
    be missing or half-written) and all of its text, <tool_call> blocks included, is the content."""
    choice = resp["choices"][0]
    if choice["finish_reason"] == "length":
        return
    content, calls = parse_tool_calls(text)
    if not calls:
        return
    choice["message"] = {"role": "assistant", "content": content, "tool_calls": calls}
    if choice["finish_reason"] == "stop":
        choice["finish_reason"] = "tool_calls"


def _cut_at_open(buf: str) -> tuple[str, str]:
    """(the text before a <tool_call> that may start in `buf`, the rest): the rest is empty
    unless `buf` holds the tag or ends with a start of it."""
    a = buf.find(OPEN)
    if a >= 0:
        return buf[:a], buf[a:]
    for n in range(min(len(OPEN) - 1, len(buf)), 0, -1):
        if buf.endswith(OPEN[:n]):
            return buf[:-n], buf[-n:]
    return buf, ""


def tool_chunker(plain_chunk: Callable[..., dict]) -> Callable[..., list[dict]]:
    """Wraps a chat chunk builder for an answer that may call tools, as tool_message does a
    whole one. Text before the first <tool_call> streams as delta.content; from that tag on the
    answer is held until it ends (its logprobs still stream, in chunks of empty content), and
    then leaves as delta.tool_calls (each call whole, in one chunk: id, type, function name and
    arguments) with the text around them as delta.content and finish reason "tool_calls" -- or,
    when max_tokens cut it (finish reason "length"), all of it as delta.content and no call."""
    state = {"head": "", "held": None}   # held: the text from the first <tool_call> on (None: none yet)

    def finish(finish_reason: str) -> list[dict]:
        out, held = [], state["held"]
        if held is None or finish_reason == "length":
            rest = state["head"] + (held or "")
            if rest:
                out.append(plain_chunk((rest, [])))
            return out + [plain_chunk(None, finish_reason=finish_reason)]
        parser = ToolStreamParser()
        text, calls = parser.push(held)
        text += parser.flush()
        if text and (text.strip() or not calls):
            out.append(plain_chunk((text, [])))
        for i, call in enumerate(calls):
            c = plain_chunk(None)
            c["choices"][0]["delta"] = {"tool_calls": [{"index": i, **call}]}
            out.append(c)
        if calls and finish_reason == "stop":
            finish_reason = "tool_calls"
        return out + [plain_chunk(None, finish_reason=finish_reason)]

    def chunk(piece: Any, finish_reason: str | None = None) -> list[dict]:
        if finish_reason is not None:
            return finish(finish_reason)
        text, entries = piece
        if state["held"] is not None:
            state["held"] += text
            text = ""
        else:
            text, rest = _cut_at_open(state["head"] + text)
            state["head"] = ""
            if rest.startswith(OPEN):
                state["held"] = rest
            else:
                state["head"] = rest     # a start of the tag, or nothing
        return [plain_chunk((text, entries))] if text or entries else []

    return chunk
