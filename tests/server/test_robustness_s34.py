"""Session 34's robustness audit of the server as a demanding client hits it: each test is the
regression test of one fix (each failed on the tree before its fix)."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def server(engine, make_server):
    srv = make_server(lambda: engine)
    srv.wait_ready()
    return srv


@pytest.mark.parametrize("path, body", [
    (CHAT, {"messages": MESSAGES, "stream": None, "n": None, "logprobs": None}),
    (COMPLETIONS, {"prompt": "Say hi", "stream": None, "n": None, "echo": None, "logprobs": None}),
])
def test_null_is_the_default_for_nullable_openai_fields(server, path, body):
    # OpenAI's reference types stream, n, logprobs and echo "... or null"; a client that sends
    # every field (null for not set) got a 400 "Input should be a valid boolean"
    r = httpx.post(server.url + path, json={**body, "max_tokens": 2, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["choices"][0]["logprobs"] is None and out["usage"]["completion_tokens"] == 2
