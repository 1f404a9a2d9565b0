"""Raw HTTP with bad input: every case answers 4xx with OpenAI's error object, and the server
keeps serving (each test ends by checking that a good request still works)."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
GOOD_CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}],
             "max_tokens": 2, "temperature": 0}


def post(server, path, **kw):
    return httpx.post(server.url + path, timeout=300, **kw)


def assert_error(r, status, code=None):
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if code is not None:
        assert err["code"] == code, err
    return err


def assert_still_serving(server):
    r = post(server, CHAT, json=GOOD_CHAT)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    assert httpx.get(server.url + "/health", timeout=30).json() == {"status": "ok"}


@pytest.mark.parametrize("body", [b"{not json", b"", b'{"messages": [', b"\xff\xfe\x00", b"[1, 2, 3]", b"null"])
def test_malformed_json(server, body):
    r = post(server, CHAT, content=body, headers={"content-type": "application/json"})
    err = assert_error(r, 400)
    assert err["type"] == "invalid_request_error"


def test_malformed_json_names_the_problem(server):
    err = assert_error(post(server, CHAT, content=b"{not json", headers={"content-type": "application/json"}),
                       400, "invalid_json")
    assert "JSON" in err["message"]
    assert_still_serving(server)


@pytest.mark.parametrize("path,body,param", [
    (CHAT, {"model": "smollm2-135m-instruct"}, "messages"),
    (CHAT, {"messages": [{"content": "no role"}]}, "messages.0.role"),
    (COMPL, {"model": "smollm2-135m-instruct", "max_tokens": 3}, "prompt"),
])
def test_missing_fields(server, path, body, param):
    err = assert_error(post(server, path, json=body), 400, "missing_required_parameter")
    assert err["param"] == param and param in err["message"]


@pytest.mark.parametrize("path,patch", [
    (CHAT, {"messages": "hello"}),
    (CHAT, {"messages": []}),
    (CHAT, {"messages": [{"role": "wizard", "content": "hi"}]}),
    (CHAT, {"messages": [{"role": "user", "content": 42}]}),
    (CHAT, {"max_tokens": "many"}),
    (CHAT, {"temperature": "hot"}),
    (CHAT, {"temperature": 7.5}),
    (CHAT, {"top_p": 0}),
    (CHAT, {"stop": 5}),
    (CHAT, {"stop": ["a"] * 40}),
    (CHAT, {"seed": "abc"}),
    (CHAT, {"stream": {"yes": 1}}),
    (CHAT, {"logprobs": True, "top_logprobs": 99}),
    (CHAT, {"top_logprobs": 2}),  # without logprobs: rejected as OpenAI does
    (COMPL, {"prompt": 12}),
    (COMPL, {"prompt": ["two", "prompts"]}),
    (COMPL, {"prompt": "x", "logprobs": -1}),
])
def test_wrong_types_and_values(server, path, patch):
    body = dict(GOOD_CHAT) if path == CHAT else {"model": "smollm2-135m-instruct", "prompt": "Hi", "max_tokens": 2}
    body.update(patch)
    err = assert_error(post(server, path, json=body), 400)
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
@pytest.mark.parametrize("value", [-1, 0, -100000])
def test_non_positive_max_tokens(server, field, value):
    body = dict(GOOD_CHAT, **{field: value})
    err = assert_error(post(server, CHAT, json=body), 400)
    assert err["param"] == field


def test_prompt_longer_than_the_context(server, engine):
    long = "hello world " * 600  # > 512 tokens (the test server's --ctx)
    assert len(engine.tokenizer.encode(long)) > engine.n_ctx
    err = assert_error(post(server, COMPL, json={"prompt": long, "max_tokens": 2}), 400, "context_length_exceeded")
    assert str(engine.n_ctx) in err["message"]
    assert_error(post(server, CHAT, json=dict(GOOD_CHAT, messages=[{"role": "user", "content": long}])),
                 400, "context_length_exceeded")
    # and streamed: the error comes as a status before any event
    assert_error(post(server, COMPL, json={"prompt": long, "max_tokens": 2, "stream": True}),
                 400, "context_length_exceeded")
    assert_still_serving(server)


def test_token_ids_outside_the_vocab(server, engine):
    n_vocab = engine.tokenizer.n_vocab
    for ids in ([1, n_vocab], [-5]):
        assert_error(post(server, COMPL, json={"prompt": ids, "max_tokens": 2}), 400)


def test_unknown_model(server):
    err = assert_error(post(server, CHAT, json=dict(GOOD_CHAT, model="gpt-17")), 404, "model_not_found")
    assert "gpt-17" in err["message"] and err["param"] == "model"
    assert_error(post(server, COMPL, json={"model": "nope", "prompt": "x"}), 404, "model_not_found")


def test_oversized_body(server):
    # the test server allows 1 MiB; declared by Content-Length
    big = b'{"prompt": "' + b"a" * (2 << 20) + b'"}'
    err = assert_error(post(server, COMPL, content=big, headers={"content-type": "application/json"}),
                       413, "request_too_large")
    assert str(1 << 20) in err["message"]
    assert_still_serving(server)


def test_oversized_chunked_body(server):
    # no Content-Length (chunked transfer): counted as it arrives
    def chunks():
        yield b'{"prompt": "'
        for _ in range(40):
            yield b"a" * 65536
        yield b'"}'

    r = post(server, COMPL, content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert_error(r, 413, "request_too_large")
    assert_still_serving(server)


@pytest.mark.parametrize("n", [2, 5, 0])
def test_n_other_than_one(server, n):
    err = assert_error(post(server, CHAT, json=dict(GOOD_CHAT, n=n)), 400, "unsupported_value")
    assert err["param"] == "n"


def test_unknown_path_and_wrong_method(server):
    assert_error(httpx.get(server.url + "/v1/nothing-here", timeout=30), 404)
    assert_error(httpx.get(server.url + CHAT, timeout=30), 405)
    assert_still_serving(server)


def test_unsupported_content_part(server):
    body = dict(GOOD_CHAT, messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}])
    assert_error(post(server, CHAT, json=body), 400)
    ok = dict(GOOD_CHAT, messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}])
    assert post(server, CHAT, json=ok).status_code == 200
