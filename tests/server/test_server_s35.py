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
