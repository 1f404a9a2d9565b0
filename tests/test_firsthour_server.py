"""A new user's first requests to `minfer serve`, with mistakes: numbers and booleans sent as the
wrong JSON type are 400s naming the field (pydantic's lax mode used to turn "5" into 5 and true
into 1, so the request silently became another one). The tiny synthetic model serves them."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.runtime.engine import Engine
    from minfer.server import create_app

    path = write_synth(tmp_path_factory.mktemp("fh") / "tiny.gguf", get_preset("tiny"), "q8_0",
                       progress=False).path
    app = create_app(lambda: Engine.load(str(path), device="cpu", ctx=64), served_name="tiny")
    with TestClient(app) as c:
        deadline = time.monotonic() + 300   # hang guard, not a timing assertion
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the tiny model never loaded"
            time.sleep(0.05)
        yield c


def chat(**kw):
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, **kw}


def compl(**kw):
    return {"prompt": "hi", "max_tokens": 2, "temperature": 0, **kw}


def bad(client, path, body, field, what):
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and err["type"] == "invalid_request_error", err
    assert field in err["message"] and what in err["message"], err
    assert "Value error" not in err["message"], err   # pydantic's prefix is not for clients


@pytest.mark.parametrize("field,value,what", [
    ("max_tokens", "5", "string"), ("max_tokens", True, "boolean"),
    ("max_completion_tokens", "3", "string"), ("temperature", "0.5", "string"),
    ("temperature", False, "boolean"), ("top_p", "1", "string"), ("top_k", True, "boolean"),
    ("seed", "42", "string"), ("n", "1", "string"), ("presence_penalty", "0", "string"),
    ("stream", "yes", "boolean"), ("stream", 1, "boolean"), ("logprobs", "true", "boolean"),
])
def test_chat_fields_of_the_wrong_json_type_are_400s(client, field, value, what):
    bad(client, CHAT, chat(**{field: value}), field, what)


@pytest.mark.parametrize("field,value,what", [
    ("max_tokens", "2", "string"), ("echo", "false", "boolean"), ("logprobs", True, "boolean"),
    ("stream", "true", "boolean"),
])
def test_completion_fields_of_the_wrong_json_type_are_400s(client, field, value, what):
    bad(client, COMPL, compl(**{field: value}), field, what)


def test_token_id_prompts_take_integers_only(client):
    r = client.post(COMPL, json=compl(prompt=[1, True, 3]))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    assert client.post(COMPL, json=compl(prompt=[1, 2, 3])).status_code == 200


def test_right_types_still_work(client):
    # an integer for a float field and an integral float for an integer field stay accepted
    r = client.post(CHAT, json=chat(temperature=0, top_p=1, max_tokens=2.0, seed=7, stream=False))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2


def _tokens(client, seed):
    body = compl(prompt="hi", max_tokens=12, temperature=1.5, top_k=0, top_p=1, min_p=0, seed=seed, logprobs=0)
    r = client.post(COMPL, json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["logprobs"]["tokens"]


def test_seed_minus_one_is_a_random_seed_as_in_llama_cpp_server(client):
    assert _tokens(client, 7) == _tokens(client, 7)          # a seed repeats
    # -1 was the literal seed -1, so every "random" request gave the same text; 12 tokens drawn
    # at temperature 1.5 from the tiny model's ~400-token vocab: equal by chance ~never
    runs = [_tokens(client, -1) for _ in range(3)]
    assert len({tuple(t) for t in runs}) > 1, runs


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/", 404), ("POST", "/v1/audio/speech", 404), ("POST", "/v1/responses", 404),
    ("GET", "/v1/chat/completions", 405),
])
def test_a_wrong_endpoint_lists_the_right_ones(client, method, path, status):
    # a browser at the root, or a client asking for an API this server lacks, only got "Not Found"
    r = client.request(method, path, json={})
    assert r.status_code == status, r.text
    msg = r.json()["error"]["message"]
    assert msg.startswith(f"{method} {path}: ") and "POST /v1/chat/completions, POST /v1/completions" in msg, msg
    assert "POST /v1/embeddings" in msg, msg



@pytest.mark.parametrize("role", ["user", "system", "developer", "tool"])
def test_a_message_without_content_is_a_400_naming_it(client, role):
    # a null user message was rendered as an empty turn, and the model answered nothing in particular
    msgs = [{"role": "user", "content": "hi"}, {"role": role, "content": None}]
    bad(client, CHAT, chat(messages=msgs), "messages.1", f"a {role} message needs content")
    bad(client, CHAT, chat(messages=[{"role": role}]), "messages.0", "needs content")
    bad(client, CHAT, chat(messages=[{"role": role, "content": []}]), "messages.0", "content is an empty list")


def test_an_assistant_turn_may_have_no_content(client):
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None},
            {"role": "user", "content": "again"}]
    assert client.post(CHAT, json=chat(messages=msgs)).status_code == 200


def test_top_logprobs_without_logprobs_names_the_field(client):
    bad(client, CHAT, chat(top_logprobs=2), "top_logprobs", "requires logprobs to be true")
    # logprobs itself wrong: that field is named, not a second complaint about top_logprobs
    r = client.post(CHAT, json=chat(logprobs="yes", top_logprobs=2))
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "logprobs" and "top_logprobs" not in err["message"], err
    assert client.post(CHAT, json=chat(logprobs=True, top_logprobs=2)).status_code == 200


@pytest.mark.parametrize("path", [CHAT, COMPL])
def test_an_empty_body_says_it_is_empty(client, path):
    r = client.post(path, content=b"")
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["message"] == "invalid request: the body is empty: expected a JSON object with the request's fields"
    assert err["code"] == "missing_required_parameter", err


def test_metrics_label_model_lookups_by_their_route(client):
    import re

    def count(endpoint, status):
        m = re.search(r'minfer_requests_total\{endpoint="%s",status="%d"\} ([0-9.]+)' % (re.escape(endpoint), status),
                      client.get("/metrics").text)
        return float(m.group(1)) if m else 0.0

    before = {k: count(*k) for k in (("/v1/models/{id}", 200), ("/v1/models/{id}", 404), ("other", 404))}
    # GET /v1/models/{id} was counted as endpoint="other", with the scanners' random paths
    assert client.get("/v1/models/tiny").status_code == 200
    assert client.get("/v1/models/gpt-4").status_code == 404
    assert client.get("/no/such/path").status_code == 404
    assert {k: count(*k) - v for k, v in before.items()} == {
        ("/v1/models/{id}", 200): 1, ("/v1/models/{id}", 404): 1, ("other", 404): 1}


def test_health_answers_head_as_monitors_send_it(client):
    r = client.head("/health")     # was 405 Method Not Allowed
    assert r.status_code == 200 and r.content == b"", (r.status_code, r.content)
    assert client.get("/health").json()["status"] == "ok"
