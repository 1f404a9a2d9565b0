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


@pytest.mark.parametrize("path, body, field", [
    (COMPLETIONS, {"prompt": "Say hi", "max_completion_tokens": 2}, "max_completion_tokens"),
    (COMPLETIONS, {"prompt": "Say hi", "top_logprobs": 2}, "top_logprobs"),
    (COMPLETIONS, {"prompt": "Say hi", "messages": MESSAGES}, "messages"),
    (CHAT, {"messages": MESSAGES, "echo": True}, "echo"),
    (CHAT, {"messages": MESSAGES, "prompt": "Say hello"}, "prompt"),
])
def test_the_other_endpoints_fields_are_not_silently_ignored(server, path, body, field):
    # max_completion_tokens on /v1/completions generated max_tokens tokens (or the whole context),
    # top_logprobs there gave no logprobs, echo on chat echoed nothing: each answered 200
    r = httpx.post(server.url + path, json={"max_tokens": 3, **body}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unsupported_value"


@pytest.mark.parametrize("path, body", [
    (COMPLETIONS, {"prompt": "Say hi", "max_completion_tokens": None, "top_logprobs": 0, "messages": None}),
    (CHAT, {"messages": MESSAGES, "echo": False, "prompt": None}),
])
def test_the_other_endpoints_fields_pass_with_values_that_change_nothing(server, path, body):
    r = httpx.post(server.url + path, json={"max_tokens": 2, **body}, timeout=60)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("parallel, slots", [(4, 4), (0, None)])
def test_models_during_the_load_describe_the_batching_asked_for(make_server, parallel, slots):
    # while the model loaded, a server started with --parallel 4 said max_concurrent_requests 1
    # and "one request generates at a time" in GET /v1/models (a client sizing its concurrency
    # from it sent one request at a time)
    import threading

    release = threading.Event()

    def slow_factory():
        release.wait(60)
        raise RuntimeError("the test is over")

    srv = make_server(slow_factory, parallel=parallel)
    try:
        meta = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["meta"]
        assert meta["loaded"] is False
        assert meta["max_concurrent_requests"] == slots
        assert meta["scheduling"].startswith("requests run together")
    finally:
        release.set()


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_a_body_that_is_not_utf8_is_an_invalid_json_error(server, path):
    # a byte that is not UTF-8 in the body answered FastAPI's "There was an error parsing the
    # body" with code null, where any other unreadable body says invalid_json and why
    r = httpx.post(server.url + path, content=b'{"messages": [{"role": "user", "content": "\xff"}]}', timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and err["type"] == "invalid_request_error"
    assert "not valid JSON" in err["message"] and "utf-8" in err["message"]


@pytest.mark.parametrize("path, body", [
    (CHAT, {"messages": MESSAGES}),
    (COMPLETIONS, {"prompt": "Say hi"}),
])
def test_a_schema_no_output_can_match_is_a_400_naming_it(server, path, body):
    # {"$ref": "#"} (a value that is only itself) compiled, then failed at the first step: a 500
    # internal_error carrying llguidance's parser state and grammar (~40 lines)
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}
    r = httpx.post(server.url + path, json={**body, "max_tokens": 4, "response_format": rf}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "response_format.json_schema.schema" and err["code"] == "invalid_value"
    assert "\n" not in err["message"] and "no output can match" in err["message"]
    # the server goes on serving
    ok = httpx.post(server.url + path, json={**body, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text


def test_a_prompt_past_a_small_kv_pool_is_a_400_context_length_exceeded(engine, make_server):
    # a batch KV pool under one context (the CUDA default pool is sized after the load; the
    # server warns) refused a prompt between its size and the context inside the worker: a 500
    # "generation failed: MinferError" for what is the client's too-long prompt
    cfg = engine.config
    per_block = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 * 16   # K and V, float32, 16 positions
    srv = make_server(lambda: engine, parallel=2, kv_memory=17 * per_block)   # 256 positions of 512
    srv.wait_ready()
    r = httpx.post(srv.url + COMPLETIONS, json={"prompt": "word " * 300, "max_tokens": 2}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert "256" in err["message"] and "--kv-memory" in err["message"]
    ok = httpx.post(srv.url + COMPLETIONS, json={"prompt": "word " * 200, "max_tokens": 2}, timeout=60)
    assert ok.status_code == 200, ok.text
    srv.stop()


@pytest.mark.parametrize("field, value", [
    ("chat_template_kwargs", {"enable_thinking": False}), ("chat_template", "{{ messages }}"),
    ("include_stop_str_in_output", True), ("prompt_logprobs", 1),
])   # (continue_final_message is read since: tests/server/test_server_vllm_fields.py)
def test_vllm_and_llama_server_prompt_switches_are_not_silently_ignored(server, field, value):
    # each changes the prompt or the answer on vLLM / llama-server; here each was ignored and
    # answered 200 (a Qwen3 client's enable_thinking false got the thinking answer)
    r = httpx.post(server.url + CHAT, json={"messages": MESSAGES, "max_tokens": 2, field: value}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["code"] == "unsupported_value"
    off = {"chat_template_kwargs": {}, "chat_template": None, "prompt_logprobs": 0}.get(field, False)
    r = httpx.post(server.url + CHAT, json={"messages": MESSAGES, "max_tokens": 2, field: off}, timeout=60)
    assert r.status_code == 200, r.text
