"""Session 35's server fixes, each test the regression test of one (each failed on the tree
before its fix, but where a test says otherwise):
1. vLLM's chat extensions add_generation_prompt false (read: the prompt has no assistant
   generation prompt) and skip_special_tokens false (control tokens' text stays in the answer);
2. tool_choice "none" keeps the tools in the prompt, and the answer is never a call;
3. an answer cut by max_tokens inside (or right after) a tool call has finish_reason "length",
   no tool_calls, and its text as content, streamed and not;
4. a body that is not JSON is told by the decoder's exception types, not by the shape of the
   HTTPException FastAPI raises."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import run_direct

from minfer.tokenizer.chat_template import chat_token_ids

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
QWEN = "qwen2.5-coder-0.5b-instruct"
PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
          "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city",
                                           "parameters": PARAMS}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(engine, make_server):
    srv = make_server(lambda: engine)
    srv.wait_ready()
    return srv


@pytest.fixture(scope="module")
def qwen_engine():
    from minfer.catalog import resolve_model
    from minfer.runtime.engine import Engine

    return Engine.load(str(resolve_model(QWEN)), device="cpu", ctx=1024)


@pytest.fixture(scope="module")
def qwen(qwen_engine, make_server):
    srv = make_server(lambda: qwen_engine, served_name=QWEN)
    srv.wait_ready()
    return srv


def post(srv, body, path=CHAT):
    r = httpx.post(srv.url + path, json=body, timeout=600)
    assert r.status_code == 200, r.text
    return r.json()


def stream(srv, body, path=CHAT):
    """(content, tool_calls deltas, finish_reason) of a streamed answer."""
    content, calls, finish = "", [], None
    with httpx.stream("POST", srv.url + path, json={**body, "stream": True}, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            delta = choice.get("delta") or {}
            content += delta.get("content") or ""
            calls += delta.get("tool_calls") or []
            finish = choice["finish_reason"] or finish
    return content, calls, finish


# ---- 1. vLLM's add_generation_prompt and skip_special_tokens ------------------------------

def test_add_generation_prompt_false_renders_without_the_assistant_prompt(server, engine, params_cls):
    # it was accepted and ignored: the prompt always ended with the assistant's "<|im_start|>assistant\n"
    messages = [{"role": "user", "content": "Write the word hello"}]
    ids = chat_token_ids(engine.tokenizer, messages, add_generation_prompt=False)
    with_prompt = chat_token_ids(engine.tokenizer, messages)
    assert len(ids) < len(with_prompt) and with_prompt[:len(ids)] == ids
    body = {"messages": messages, "max_tokens": 8, "temperature": 0, "add_generation_prompt": False}
    out = post(server, body)
    assert out["usage"]["prompt_tokens"] == len(ids)
    ref, n, finish = run_direct(engine, params_cls, ids, 8, temperature=0.0)
    assert out["choices"][0]["message"]["content"] == ref and out["usage"]["completion_tokens"] == n
    assert stream(server, body)[0] == ref
    # true (vLLM's default) and null are the default: with the generation prompt
    for value in (True, None):
        got = post(server, {**body, "add_generation_prompt": value})
        assert got["usage"]["prompt_tokens"] == len(with_prompt)


@pytest.mark.parametrize("value", ["false", 0])
def test_add_generation_prompt_is_a_boolean(server, value):
    # (any value was ignored before)
    r = httpx.post(server.url + CHAT, json={"messages": ASK, "max_tokens": 2, "add_generation_prompt": value},
                   timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "add_generation_prompt", r.text


@pytest.mark.parametrize("path, body", [
    (CHAT, {"messages": [{"role": "user", "content": "Say hi"}]}),
    (COMPLETIONS, {"prompt": "Say hi"}),
])
def test_skip_special_tokens_false_keeps_control_tokens_text(server, path, body):
    # (passed before too: minfer's answers always kept control tokens' text, vLLM's false; the
    # field is now read and documented, and this pins that false keeps them, streamed and not)
    forced = {**body, "max_tokens": 3, "temperature": 0, "logit_bias": {"1": 100}, "skip_special_tokens": False}
    out = post(server, forced, path)
    choice = out["choices"][0]
    text = choice["message"]["content"] if path == CHAT else choice["text"]
    assert text == "<|im_start|>" * 3 and choice["finish_reason"] == "length"
    if path == CHAT:
        assert stream(server, forced)[0] == text
    # null (minfer's default) answers as false; true drops the control tokens' text
    # (tests/server/test_server_vllm_fields.py)
    same = post(server, {**forced, "skip_special_tokens": None}, path)["choices"][0]
    assert (same["message"]["content"] if path == CHAT else same["text"]) == text
    dropped = post(server, {**forced, "skip_special_tokens": True}, path)["choices"][0]
    assert (dropped["message"]["content"] if path == CHAT else dropped["text"]) == ""


# ---- 2. tool_choice "none" -----------------------------------------------------------------

def test_tool_choice_none_keeps_the_tools_in_the_prompt(qwen, qwen_engine, params_cls):
    # the tools were dropped from the prompt (OpenAI: they stay visible, only calls are off)
    tok = qwen_engine.tokenizer
    tools_ids = chat_token_ids(tok, ASK, tools=[dict(t) for t in TOOLS])
    plain_ids = chat_token_ids(tok, ASK)
    assert len(tools_ids) > len(plain_ids)
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 12, "temperature": 0}
    out = post(qwen, body)
    assert out["usage"]["prompt_tokens"] == len(tools_ids)
    msg = out["choices"][0]["message"]
    assert "tool_calls" not in msg and out["choices"][0]["finish_reason"] in ("stop", "length")
    ref, _, _ = run_direct(qwen_engine, params_cls, tools_ids, 12, temperature=0.0)
    assert "<tool_call>" not in ref     # (else the ban below would change this answer)
    assert msg["content"] == ref


def test_tool_choice_none_never_calls(qwen):
    # the model pushed hard towards the <tool_call> token (id 151657, one special token):
    # under "none" it is banned, and no answer is parsed for calls
    tag = 151657
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": "none", "max_tokens": 6, "temperature": 0,
            "logit_bias": {str(tag): 100}}
    out = post(qwen, body)
    choice = out["choices"][0]
    assert "tool_calls" not in choice["message"] and choice["finish_reason"] != "tool_calls"
    assert "<tool_call>" not in choice["message"]["content"]
    content, calls, finish = stream(qwen, body)
    assert not calls and finish != "tool_calls" and "<tool_call>" not in content
    # "auto" with the same push does call (or write the tag): the ban is "none"'s alone
    auto = post(qwen, {**body, "tool_choice": "auto", "max_tokens": 40})["choices"][0]
    assert auto["message"].get("tool_calls") or "<tool_call>" in (auto["message"]["content"] or "")


# ---- 3. max_tokens inside a tool call ------------------------------------------------------

def test_a_cut_tool_call_is_content_with_finish_length(qwen):
    # a named tool_choice is one call, then the end: n tokens; n - 1 cuts right after
    # "</tool_call>" (the call complete, the answer not), n // 2 inside the call. Before, the
    # first answered tool_calls with finish_reason "length"
    body = {"messages": ASK, "tools": TOOLS, "tool_choice": NAMED, "temperature": 0}
    whole = post(qwen, {**body, "max_tokens": 80})
    assert whole["choices"][0]["finish_reason"] == "tool_calls"
    n = whole["usage"]["completion_tokens"]
    for max_tokens in (n - 1, n // 2):
        out = post(qwen, {**body, "max_tokens": max_tokens})
        choice = out["choices"][0]
        assert choice["finish_reason"] == "length", max_tokens
        assert "tool_calls" not in choice["message"], choice
        text = choice["message"]["content"]
        assert text.startswith("<tool_call>")
        assert text.rstrip().endswith("</tool_call>") == (max_tokens == n - 1)
        content, calls, finish = stream(qwen, {**body, "max_tokens": max_tokens})
        assert (content, calls, finish) == (text, [], "length")


def test_tool_chunker_and_tool_message_agree_at_a_cut():
    """Without a model: complete calls and a half-written one, cut by max_tokens: no call comes
    back, the whole text is the content; at a stop the complete calls are calls."""
    from minfer.server.tools import tool_chunker, tool_message

    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    text = "Checking.\n" + call + "\n" + call + '\n<tool_call>\n{"name": "get_weather", "argu'

    def plain(piece, finish_reason=None):
        return {"choices": [{"delta": {"content": piece[0]} if piece else {}, "finish_reason": finish_reason}]}

    for finish in ("length", "stop"):
        for step in (1, 5, len(text)):
            chunk = tool_chunker(plain)
            out = [c for i in range(0, len(text), step) for c in chunk((text[i:i + step], []))]
            out += chunk(None, finish_reason=finish)
            deltas = [c["choices"][0]["delta"] for c in out]
            calls = [tc for d in deltas for tc in d.get("tool_calls", [])]
            content = "".join(d.get("content") or "" for d in deltas)
            resp = {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": finish}]}
            tool_message(resp, text)
            if finish == "length":
                assert content == text and not calls and out[-1]["choices"][0]["finish_reason"] == "length"
                assert resp["choices"][0] == {"message": {"role": "assistant", "content": text},
                                              "finish_reason": "length"}
            else:
                assert [c["index"] for c in calls] == [0, 1]
                assert [c["function"]["name"] for c in calls] == ["get_weather"] * 2
                assert out[-1]["choices"][0]["finish_reason"] == "tool_calls"
                assert len(resp["choices"][0]["message"]["tool_calls"]) == 2


def test_a_call_whose_arguments_are_not_json_is_not_a_tool_call():
    # arguments written as a JSON string were passed on as they were: '{"city": "Par' became
    # a tool_calls entry whose arguments no client can parse
    from minfer.server.tools import parse_tool_calls

    bad = '<tool_call>\n{"name": "f", "arguments": "{\\"city\\": \\"Par"}\n</tool_call>'
    assert parse_tool_calls(bad) == (bad, [])
    listed = '<tool_call>\n{"name": "f", "arguments": [1, 2]}\n</tool_call>'
    assert parse_tool_calls(listed) == (listed, [])
    good = '<tool_call>\n{"name": "f", "arguments": "{\\"city\\": \\"Paris\\"}"}\n</tool_call>'
    content, (call,) = parse_tool_calls(good)
    assert content is None and json.loads(call["function"]["arguments"]) == {"city": "Paris"}


# ---- 4. a body that is not JSON ------------------------------------------------------------

def test_another_400_is_not_called_invalid_json(engine, make_server):
    # any HTTPException(400) raised from another error was answered "the body is not valid JSON"
    from fastapi import HTTPException

    srv = make_server(lambda: engine)
    srv.wait_ready()

    @srv.app.post("/v1/probe")
    async def probe() -> None:
        try:
            raise ValueError("inner")
        except ValueError as e:
            raise HTTPException(400, "the probe refuses") from e

    r = httpx.post(srv.url + "/v1/probe", json={}, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] != "invalid_json" and "not valid JSON" not in err["message"], err
    assert "the probe refuses" in err["message"]


@pytest.mark.parametrize("body, why", [
    (b"[" * 100_000, "nested too deeply"),
    (b'{"messages": [}', "line 1 column 15"),
    (b'{"prompt": "\xff"}', "utf-8"),
])
@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_body_that_is_not_json_names_why(server, path, body, why):
    r = httpx.post(server.url + path, content=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
    assert "not valid JSON" in err["message"] and why in err["message"], err
    assert httpx.get(server.url + "/health", timeout=30).status_code == 200
