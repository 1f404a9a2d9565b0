"""Loading (/health 503 then 200), a failed load, bearer auth, internal failures, /metrics."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
from server_helpers import metric_value

GOOD_CHAT = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "Hi"}],
             "max_tokens": 2, "temperature": 0}


def _error(r, status, code):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["code"] == code and err["message"] and err["type"]
    return err


def test_health_is_503_while_loading_then_200(engine, make_server):
    gate, entered = threading.Event(), threading.Event()

    def slow_factory():  # loading holds until the test has seen the 503s
        entered.set()
        assert gate.wait(600)
        return engine

    srv = make_server(slow_factory)
    assert entered.wait(60)
    _error(httpx.get(srv.url + "/health", timeout=30), 503, "model_loading")
    # work sent while loading: 503 too, not a hang
    _error(httpx.post(srv.url + "/v1/chat/completions", json=GOOD_CHAT, timeout=30), 503, "model_loading")
    models = httpx.get(srv.url + "/v1/models", timeout=30).json()
    assert models["data"][0]["meta"]["loaded"] is False
    gate.set()
    srv.wait_ready()
    r = httpx.get(srv.url + "/health", timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "ok" and r.json()["slots"] >= 1
    assert httpx.post(srv.url + "/v1/chat/completions", json=GOOD_CHAT, timeout=300).status_code == 200


def test_failed_load_is_reported(make_server):
    seen = []

    def broken_factory():
        raise RuntimeError("weights.bin: checksum mismatch")

    srv = make_server(broken_factory, on_load_failed=seen.append)
    for _ in range(600):
        if seen:
            break
        threading.Event().wait(0.05)
    assert len(seen) == 1 and "checksum mismatch" in str(seen[0])
    err = _error(httpx.get(srv.url + "/health", timeout=30), 503, "model_load_failed")
    assert "checksum mismatch" in err["message"]
    _error(httpx.post(srv.url + "/v1/completions", json={"prompt": "x"}, timeout=30), 503, "model_load_failed")


@pytest.fixture(scope="module")
def auth_server(engine, make_server):
    srv = make_server(lambda: engine, api_key="s3cret-key")
    srv.wait_ready()
    return srv


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"},
                                     {"Authorization": "Basic s3cret-key"}, {"Authorization": "Bearer s3cret-keyX"}])
def test_auth_rejects_without_the_key(auth_server, headers):
    for method, path in (("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                         ("GET", "/v1/models"), ("GET", "/metrics")):
        r = httpx.request(method, auth_server.url + path, json=GOOD_CHAT, headers=headers, timeout=30)
        err = _error(r, 401, "invalid_api_key")
        assert "s3cret" not in err["message"]


def test_auth_accepts_the_key_and_health_stays_open(auth_server):
    assert httpx.get(auth_server.url + "/health", timeout=30).json()["status"] == "ok"
    good = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="s3cret-key", max_retries=0, timeout=300)
    r = good.chat.completions.create(**GOOD_CHAT)
    assert r.choices[0].finish_reason in ("stop", "length")
    bad = openai.OpenAI(base_url=auth_server.url + "/v1", api_key="nope", max_retries=0, timeout=300)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(**GOOD_CHAT)
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"


class FailingEngine:
    """The real engine, except that generation raises when the prompt contains BOOM (after
    yielding one token when it contains BOOM-LATE, i.e. mid-stream)."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt_ids, params, max_new_tokens, stop=(), **kw):
        text = self.inner.tokenizer.decode(prompt_ids)
        if "BOOM" in text:
            if "BOOM-LATE" in text:
                yield from self._one(prompt_ids, params, stop)
            raise RuntimeError("injected failure in the engine")
        yield from self.inner.generate(prompt_ids, params, max_new_tokens, stop, **kw)

    def _one(self, prompt_ids, params, stop):
        for ev in self.inner.generate(prompt_ids, params, 1, stop):
            ev.finish_reason = None
            yield ev


def test_internal_failure_is_a_500_and_the_server_keeps_serving(engine, make_server):
    srv = make_server(lambda: FailingEngine(engine))
    srv.wait_ready()
    url = srv.url + "/v1/completions"
    for _ in range(2):
        err = _error(httpx.post(url, json={"prompt": "BOOM", "max_tokens": 4}, timeout=300), 500, "internal_error")
        assert err["type"] == "server_error" and "injected failure" in err["message"]
        ok = httpx.post(url, json={"prompt": "The sky is", "max_tokens": 3, "temperature": 0}, timeout=300)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1
    # mid-stream: the status is already 200, so the error comes as an event, then [DONE]
    with httpx.stream("POST", url, json={"prompt": "BOOM-LATE", "max_tokens": 4, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert lines[-1] == "data: [DONE]"
    assert any('"error"' in ln and "injected failure" in ln for ln in lines)
    ok = httpx.post(url, json={"prompt": "The sky is", "max_tokens": 3, "temperature": 0}, timeout=300)
    assert ok.status_code == 200
    assert httpx.get(srv.url + "/health", timeout=30).status_code == 200


def test_metrics_count_requests_and_tokens(engine, make_server):
    srv = make_server(lambda: engine)  # its own registry: counts start at zero
    srv.wait_ready()
    text = lambda: httpx.get(srv.url + "/metrics", timeout=30).text  # noqa: E731
    before = text()
    assert metric_value(before, "minfer_requests_total", {"endpoint": "/v1/completions", "status": "200"}) == 0
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
    r1 = client.completions.create(model="smollm2-135m-instruct", prompt="Once upon a time", max_tokens=4,
                                   temperature=0)
    r2 = client.chat.completions.create(messages=[{"role": "user", "content": "Hello"}],
                                        model="smollm2-135m-instruct", max_tokens=3, temperature=0)
    httpx.post(srv.url + "/v1/completions", json={"prompt": "x", "n": 3}, timeout=30)  # a 400
    after = text()
    assert metric_value(after, "minfer_requests_total", {"endpoint": "/v1/completions", "status": "200"}) == 1
    assert metric_value(after, "minfer_requests_total", {"endpoint": "/v1/chat/completions", "status": "200"}) == 1
    assert metric_value(after, "minfer_requests_total", {"endpoint": "/v1/completions", "status": "400"}) == 1
    assert metric_value(after, "minfer_prompt_tokens_total") == r1.usage.prompt_tokens + r2.usage.prompt_tokens
    assert metric_value(after, "minfer_generated_tokens_total") == (r1.usage.completion_tokens
                                                                    + r2.usage.completion_tokens)
    assert metric_value(after, "minfer_requests_in_flight") == 0
    assert metric_value(after, "minfer_prompt_tokens_per_second_count") == 2
    # a histogram sample needs two tokens (a time between them); r1 made 4
    assert metric_value(after, "minfer_generation_tokens_per_second_count") >= 1
    assert metric_value(after, "minfer_generation_tokens_per_second_sum") > 0
    # /metrics itself is counted, as scrapes are requests too
    assert metric_value(after, "minfer_requests_total", {"endpoint": "/metrics", "status": "200"}) == 1
