"""Session 19's audit of the server as a hostile client and an operator sees it: what /metrics
and the log say, beyond the answers themselves."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
from server_helpers import metric_value, wait_healthy

CHAT = "/v1/chat/completions"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _chat_counts(url: str) -> dict[str, float]:
    """{status: count} of the chat endpoint's request counter."""
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=30).text):
        for s in fam.samples:
            if s.name == "minfer_requests_total" and s.labels.get("endpoint") == CHAT:
                out[s.labels["status"]] = s.value
    return out


def test_a_client_gone_before_its_body_ended_is_not_a_server_error(engine, make_server):
    # a client that sends half a body and hangs up was counted as a 500: an alert on the 5xx rate
    # fired for a client's network, not for the server
    srv = make_server(lambda: engine)
    srv.wait_ready()
    before = _chat_counts(srv.url)
    with socket.create_connection(("127.0.0.1", srv.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 1000\r\n\r\n{\"messages\":")
    deadline = time.monotonic() + 60   # hang guard: the server counts the request once it ends
    while sum(_chat_counts(srv.url).values()) == sum(before.values()):
        assert time.monotonic() < deadline, "the request was never counted"
        time.sleep(0.05)
    after = _chat_counts(srv.url)
    assert after.get("500", 0) == before.get("500", 0), after
    assert after.get("499", 0) == before.get("499", 0) + 1, after
    # and the server still answers
    r = httpx.post(srv.url + CHAT, json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2},
                   timeout=300)
    assert r.status_code == 200, r.text


def test_a_server_error_before_any_answer_is_still_a_500(engine, make_server):
    from minfer.server.metrics import ServerMetrics
    from minfer.server.middleware import MetricsMiddleware

    import asyncio

    async def broken(scope, receive, send):
        raise RuntimeError("boom")

    metrics = ServerMetrics()
    mw = MetricsMiddleware(broken, metrics)

    async def call():
        try:
            await mw({"type": "http", "path": CHAT}, None, None)
        except RuntimeError:
            pass

    asyncio.run(call())
    text = metrics.render().decode()
    assert metric_value(text, "minfer_requests_total", {"endpoint": CHAT, "status": "500"}) == 1


def test_one_request_at_a_time_reports_inter_token_gaps_and_its_slot(engine, make_server):
    # the CPU's default server (-np 1) left minfer_inter_token_seconds empty and minfer_slots at 0
    # while /health said 1: a dashboard showed no inter-token latency at all
    srv = make_server(lambda: engine)
    srv.wait_ready()
    r = httpx.post(srv.url + CHAT, json={"messages": [{"role": "user", "content": "Count to ten"}],
                                         "max_tokens": 5, "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    n = r.json()["usage"]["completion_tokens"]
    assert n >= 2
    text = httpx.get(srv.url + "/metrics", timeout=30).text
    assert metric_value(text, "minfer_inter_token_seconds_count") == n - 1
    assert metric_value(text, "minfer_slots") == httpx.get(srv.url + "/health", timeout=30).json()["slots"] == 1


def test_serve_log_has_no_loading_bar_when_stderr_is_not_a_terminal(tmp_path):
    # `minfer serve ... 2> server.log` kept every redraw of the tqdm loading bar ("\r" and all)
    from helpers_cli import write_tiny_model

    model = write_tiny_model(tmp_path)
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minfer", "serve", "-m", model, "--device", "cpu",
                             "--port", str(port), "--ctx", "64"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}")
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "model ready" in err
    assert "\r" not in err and "layer/s" not in err, err


def test_other_servers_answer_changing_extensions_are_400s_naming_what_to_send(server):
    # llama.cpp's server's and vLLM's fields were accepted and ignored: `grammar` gave an
    # unconstrained answer, `mirostat` plain sampling, with no word said
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
    cases = [("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, "grammar", 'root ::= "a"', "grammar"),
             (CHAT, chat, "ignore_eos", True, "ignore_eos"),
             (CHAT, chat, "mirostat", 2, "mirostat"),
             (CHAT, chat, "n_probs", 3, "logprobs"),
             (CHAT, chat, "json_schema", '{"type": "object"}', "schema object")]
    for path, body, field, value, named in cases:
        r = httpx.post(server.url + path, json={**body, field: value}, timeout=300)
        assert r.status_code == 400, (field, r.text)
        err = r.json()["error"]
        assert err["code"] == "unsupported_value" and err["param"] == field, err
        assert named in err["message"], err
    # their "off" values, and bookkeeping extensions, change nothing and pass
    for extra in ({"repeat_penalty": 1.0}, {"n_predict": -1}, {"mirostat": 0}, {"ignore_eos": False},
                  {"grammar": ""}, {"cache_prompt": True}, {"typical_p": 1.0}):
        r = httpx.post(server.url + CHAT, json={**chat, **extra}, timeout=300)
        assert r.status_code == 200, (extra, r.text)


def test_other_servers_names_of_fields_minfer_has_give_the_openai_fields_answer(server):
    # a client written for llama-server (n_predict, repeat_penalty, json_schema) or vLLM (guided_json)
    # gets what the OpenAI names give: the same text at temperature 0, not a 400 or an ignored field
    msgs = [{"role": "user", "content": "Give a JSON object"}]
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    rf = {"type": "json_schema", "json_schema": {"name": "response", "schema": schema}}
    pairs = [("/v1/completions", {"prompt": "Hi", "n_predict": 3}, {"prompt": "Hi", "max_tokens": 3}),
             (CHAT, {"messages": msgs, "max_tokens": 6, "repeat_penalty": 1.5},
              {"messages": msgs, "max_tokens": 6, "repetition_penalty": 1.5}),
             (CHAT, {"messages": msgs, "max_tokens": 12, "json_schema": schema},
              {"messages": msgs, "max_tokens": 12, "response_format": rf}),
             (CHAT, {"messages": msgs, "max_tokens": 12, "guided_json": schema},
              {"messages": msgs, "max_tokens": 12, "response_format": rf})]
    for path, theirs, ours in pairs:
        got = [httpx.post(server.url + path, json={**b, "temperature": 0}, timeout=300) for b in (theirs, ours)]
        assert [r.status_code for r in got] == [200, 200], [r.text for r in got]
        a, b = (r.json() for r in got)
        text = (lambda j: j["choices"][0].get("text") or j["choices"][0]["message"]["content"])
        assert text(a) == text(b) and a["usage"] == b["usage"], (theirs, a, b)
    assert got[0].json()["choices"][0]["message"]["content"].startswith("{")      # constrained to JSON
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "n_predict": 3}, timeout=300)
    assert r.json()["usage"]["completion_tokens"] <= 3
    # both names, different values: one 400 naming both
    for body in ({"prompt": "Hi", "n_predict": 3, "max_tokens": 4},
                 {"prompt": "Hi", "repeat_penalty": 1.2, "repetition_penalty": 1.3},
                 {"prompt": "Hi", "json_schema": schema, "response_format": {"type": "json_object"}}):
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=300)
        assert r.status_code == 400, (body, r.text)
        names = [k for k in body if k != "prompt"]
        assert all(n in r.json()["error"]["message"] for n in names[:1]), r.text


def test_a_temperature_too_small_for_float32_is_greedy_not_a_500(server):
    # 1e-300 divided the logits into inf: a 500 "generation failed: ... NaN probabilities" for a
    # value the request schema accepts; a temperature this close to 0 is greedy (vLLM's rule)
    for t in (1e-300, 1e-40, 5e-324):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "temperature": t},
                       timeout=300)
        assert r.status_code == 200, (t, r.text)
        assert r.json()["usage"]["completion_tokens"] == 2
    from minfer.limits import effective_temperature
    from minfer.server.app import _sampling_params
    from minfer.server.schemas import CompletionRequest
    from minfer.runtime.sampling import SamplingParams

    assert _sampling_params(CompletionRequest(prompt="x", temperature=1e-300), SamplingParams).greedy
    assert _sampling_params(CompletionRequest(prompt="x", temperature=0.5), SamplingParams).temperature == 0.5
    assert effective_temperature(float("nan")) != effective_temperature(float("nan"))  # left to be refused
    assert effective_temperature(-1.0) == -1.0


def test_a_repetition_penalty_below_float32_is_a_400_not_a_500(server):
    # 1e-300 passed the schema (> 0), then divided the logits into inf: 500 "generation failed"
    for rp in (1e-300, 1e-40):
        r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi hi hi", "max_tokens": 2,
                                                              "repetition_penalty": rp}, timeout=300)
        assert r.status_code == 400, (rp, r.text)
        assert r.json()["error"]["param"] == "repetition_penalty"
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi hi hi", "max_tokens": 2,
                                                          "repetition_penalty": 1e-6}, timeout=300)
    assert r.status_code == 200, r.text
