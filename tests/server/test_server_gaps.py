"""What OpenAI clients and browser UIs expect around the completions themselves:
GET /v1/models/{id}, served-name aliases, CORS (off by default), a JSON body read whatever its
Content-Type, completions logprobs of partial UTF-8 tokens as "bytes:\\x..", and a 400
`unsupported_value` naming each OpenAI field this server does not implement."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import httpx
import openai
import pytest
from server_helpers import wait_healthy

MODEL = "smollm2-135m-instruct"
ORIGIN = "http://chat-ui.example:3000"
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def alias_server(engine, make_server):
    srv = make_server(lambda: engine, aliases=["gpt-4o-mini", "org/tiny"], cors_origins=[ORIGIN], api_key="k1")
    srv.wait_ready(headers={"Authorization": "Bearer k1"})
    return srv


def test_models_retrieve(client):
    m = client.models.retrieve(MODEL)
    assert m.id == MODEL and m.object == "model" and m.owned_by == "minfer"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found"


def test_aliases_are_accepted_names(alias_server):
    c = openai.OpenAI(base_url=alias_server.url + "/v1", api_key="k1", max_retries=0, timeout=120)
    for name in ("gpt-4o-mini", "org/tiny"):  # a name with a slash, as some clients hard-code
        assert c.models.retrieve(name).id == MODEL
        r = c.chat.completions.create(model=name, messages=MSG, max_tokens=1, temperature=0)
        assert r.model == MODEL and r.usage.completion_tokens == 1
    assert c.models.list().data[0].model_extra["meta"]["aliases"] == ["gpt-4o-mini", "org/tiny"]
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=1)


def test_cors_preflight_and_headers(alias_server, server):
    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST",
           "Access-Control-Request-Headers": "authorization, content-type"}
    # the preflight carries no API key and must still pass
    r = httpx.options(alias_server.url + "/v1/chat/completions", headers=pre, timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    r = httpx.get(alias_server.url + "/v1/models", headers={"Origin": ORIGIN, "Authorization": "Bearer k1"},
                  timeout=30)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    # another origin, and the server started without --cors: no CORS headers
    r = httpx.options(alias_server.url + "/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"},
                      timeout=30)
    assert "access-control-allow-origin" not in r.headers
    r = httpx.options(server.url + "/v1/chat/completions", headers=pre, timeout=30)
    assert "access-control-allow-origin" not in r.headers


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", None])
def test_a_json_body_is_read_whatever_the_content_type(server, content_type):
    body = json.dumps({"model": MODEL, "messages": MSG, "max_tokens": 1, "temperature": 0}).encode()
    headers = {"content-type": content_type} if content_type else {}
    # httpx adds no Content-Type for raw bytes unless told to
    r = httpx.post(server.url + "/v1/chat/completions", content=body, headers=headers, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1


def _partial_utf8_token(tok) -> int:
    """A token whose bytes are the start of a multi-byte character and not valid UTF-8 alone."""
    for i in range(tok.n_vocab):
        b = tok.piece_bytes(i)
        if len(b) == 1 and b[0] >= 0xC2:
            return i
    raise AssertionError("no single-byte partial token in the vocab")


def test_completion_logprobs_of_a_partial_character_use_bytes(client, engine):
    tid = _partial_utf8_token(engine.tokenizer)
    raw = engine.tokenizer.piece_bytes(tid)
    r = client.completions.create(model=MODEL, prompt="Caf", max_tokens=1, temperature=0, logprobs=2,
                                  logit_bias={str(tid): 100})
    lp = r.choices[0].logprobs
    assert lp.tokens == ["bytes:" + "".join(f"\\x{b:02x}" for b in raw)]
    assert "\ufffd" not in "".join(lp.tokens) and all("\ufffd" not in k for k in lp.top_logprobs[0])
    chat = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=1, temperature=0, logprobs=True,
                                          logit_bias={str(tid): 100})
    assert chat.choices[0].logprobs.content[0].bytes == list(raw)


@pytest.mark.parametrize("field, value", [
    ("audio", {"voice": "alloy", "format": "wav"}), ("modalities", ["text", "audio"]),
    ("prediction", {"type": "content", "content": "x"}), ("functions", [{"name": "f", "parameters": {}}]),
    ("function_call", "auto"), ("web_search_options", {}), ("reasoning_effort", "high"), ("verbosity", "low"),
])
def test_unsupported_chat_fields_are_400s_naming_the_field(server, field, value):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": MSG, "max_tokens": 1, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "unsupported_value" and err["param"] == field and field in err["message"]


@pytest.mark.parametrize("field, value", [("best_of", 3), ("suffix", "}")])
def test_unsupported_completion_fields_are_400s(server, field, value):
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 1, field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_bookkeeping_fields_and_off_values_are_accepted(client):
    r = client.chat.completions.create(model=MODEL, messages=MSG, max_tokens=1, user="u1", store=False,
                                       metadata={"k": "v"}, modalities=["text"], service_tier="auto",
                                       extra_body={"audio": None, "best_of": 1})
    assert r.usage.completion_tokens == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_alias_and_cors_flags():
    """`minfer serve --alias ... --cors ...` as a user starts it."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minfer", "serve", "-m", MODEL, "--device", "cpu", "--port",
                             str(port), "--ctx", "128", "--alias", "gpt-3.5-turbo", "--alias", "local",
                             "--cors", ORIGIN], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url)
        c = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        assert c.models.retrieve("gpt-3.5-turbo").id == MODEL
        assert c.models.retrieve("local").id == MODEL
        r = httpx.options(url + "/v1/chat/completions", timeout=30,
                          headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
        assert r.headers["access-control-allow-origin"] == ORIGIN
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)


def test_a_non_text_content_part_is_unsupported_and_named(server):
    parts = [{"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": "x"}}]
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,
                   json={"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 1})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "unsupported_value" and err["param"] == "messages[0].content[1].type"
    r = httpx.post(server.url + "/v1/chat/completions", timeout=30,  # a text part without text stays invalid
                   json={"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text"}]}],
                         "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["code"] != "unsupported_value"


def test_completions_take_a_response_format_and_refuse_tools(client, server):
    import jsonschema

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"],
              "additionalProperties": False}
    r = client.completions.create(model=MODEL, prompt="A JSON object with a person's name:", max_tokens=40,
                                  temperature=0, extra_body={"response_format": {
                                      "type": "json_schema", "json_schema": {"name": "p", "schema": schema}}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].text), schema)
    r = httpx.post(server.url + "/v1/completions", timeout=30,
                   json={"model": MODEL, "prompt": "x", "max_tokens": 1, "tools": [{"type": "function"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


@pytest.mark.parametrize("path", ["/v1/models", "/models", f"/v1/models/{MODEL}", "/metrics", "/health"])
def test_head_is_answered_like_get(server, path):
    # monitors and load balancers probe with HEAD; the model list answered 405
    g = httpx.get(server.url + path, timeout=30)
    h = httpx.head(server.url + path, timeout=30)
    assert g.status_code == 200 and h.status_code == 200, (path, h.status_code)
    assert h.content == b"" and h.headers["content-type"] == g.headers["content-type"]


@pytest.mark.parametrize("endpoint, body", [("/v1/chat/completions", {"messages": MSG}),
                                            ("/v1/completions", {"prompt": "x"})])
def test_stream_options_without_stream_is_a_400(server, endpoint, body):
    # OpenAI (and vLLM) refuse it; accepted, the client waited for a usage chunk that a
    # non-streamed answer never sends
    for extra in ({}, {"stream": False}):
        r = httpx.post(server.url + endpoint, timeout=30,
                       json={"model": MODEL, "max_tokens": 1, "stream_options": {"include_usage": True}, **body, **extra})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "stream_options" and "only allowed when stream is true" in err["message"], err
    r = httpx.post(server.url + endpoint, timeout=30, json={"model": MODEL, "max_tokens": 1, "stream_options": None, **body})
    assert r.status_code == 200, r.text
