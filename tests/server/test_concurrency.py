"""Several clients at once, and clients that hang up: answers stay correct and complete, and
a client that goes away stops its generation and frees the one generation slot."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import openai
import pytest
from server_helpers import metric_value

MODEL = "smollm2-135m-instruct"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9,"  # greedy continues this far past any max_tokens used here
LONG = 400  # tokens the hung-up requests ask for: far more than they get to generate


def _wait_for(cond, what, limit_s=300):
    """Poll until cond() is true; the limit only guards against a hang (no timing is asserted)."""
    deadline = time.monotonic() + limit_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"never happened: {what}")
        time.sleep(0.05)


def test_simultaneous_streams_get_the_answers_they_get_alone(client, server):
    prompts = ["Name a color.", "What is 2 + 2?", "Say hello in French.", "Name a fruit."]
    kw = dict(model=MODEL, temperature=0, max_tokens=10)
    alone = [client.chat.completions.create(messages=[{"role": "user", "content": p}], **kw) for p in prompts]
    results: list = [None] * len(prompts)
    barrier = threading.Barrier(len(prompts))

    def one(i: int) -> None:
        c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)
        barrier.wait()
        chunks = list(c.chat.completions.create(messages=[{"role": "user", "content": prompts[i]}], stream=True,
                                                stream_options={"include_usage": True}, **kw))
        results[i] = chunks

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    for ref, chunks in zip(alone, results):
        assert chunks is not None, "a client got no answer"
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == ref.choices[0].message.content
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == ref.choices[0].finish_reason
        assert chunks[-1].usage.model_dump() == ref.usage.model_dump()
    assert len({id(r) for r in results}) == len(prompts)


def test_simultaneous_mixed_requests(client, server):
    """Streaming and non-streaming, chat and completions, all at once."""
    ref_c = client.completions.create(model=MODEL, prompt=COUNTING, temperature=0, max_tokens=8)
    ref_chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                              temperature=0, max_tokens=8)
    out: dict = {}
    barrier = threading.Barrier(4)

    def run(key, fn):
        barrier.wait()
        out[key] = fn()

    c = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=600)
    jobs = {
        "c": lambda: c.completions.create(model=MODEL, prompt=COUNTING, temperature=0, max_tokens=8).choices[0].text,
        "cs": lambda: "".join(x.choices[0].text for x in c.completions.create(
            model=MODEL, prompt=COUNTING, temperature=0, max_tokens=8, stream=True)),
        "chat": lambda: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}],
                                                  temperature=0, max_tokens=8).choices[0].message.content,
        "chats": lambda: "".join(x.choices[0].delta.content or "" for x in c.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], temperature=0, max_tokens=8, stream=True)),
    }
    threads = [threading.Thread(target=run, args=kv) for kv in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    assert out == {"c": ref_c.choices[0].text, "cs": ref_c.choices[0].text,
                   "chat": ref_chat.choices[0].message.content, "chats": ref_chat.choices[0].message.content}


def _data_lines(lines, n):
    """The next n `data:` lines of an SSE line iterator (response.iter_lines(), made once)."""
    got = []
    for line in lines:
        if line.startswith("data: "):
            got.append(line)
            if len(got) == n:
                return got
    raise AssertionError(f"stream ended after {len(got)} events")


def test_disconnect_stops_generation_and_frees_the_slot(engine, make_server):
    srv = make_server(lambda: engine)  # own metrics registry: counts start at zero
    srv.wait_ready()
    metrics = lambda: httpx.get(srv.url + "/metrics", timeout=30).text  # noqa: E731
    long_body = {"model": MODEL, "prompt": COUNTING, "max_tokens": LONG, "temperature": 0, "stream": True}

    # A streams and hangs up after three tokens
    with httpx.stream("POST", srv.url + "/v1/completions", json=long_body, timeout=300) as a:
        assert a.status_code == 200
        _data_lines(a.iter_lines(), 3)
        # B queues behind A (chat: the role chunk comes before generation) and hangs up while queued
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Count to a thousand."}],
                "max_tokens": LONG, "temperature": 0, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=chat, timeout=300) as b:
            assert b.status_code == 200
            first = json.loads(_data_lines(b.iter_lines(), 1)[0][6:])
            assert first["choices"][0]["delta"]["role"] == "assistant"
    _wait_for(lambda: metric_value(metrics(), "minfer_generations_cancelled_total") == 2, "both generations cancelled")
    m = metrics()
    # A stopped long before its max_tokens; B never generated
    assert 3 <= metric_value(m, "minfer_generated_tokens_total") < LONG // 2
    assert metric_value(m, "minfer_requests_in_flight") == 0
    assert metric_value(m, "minfer_requests_queued") == 0

    # the slot is free: the next request is served, and generated exactly what it asked for
    before = metric_value(m, "minfer_generated_tokens_total")
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": COUNTING, "max_tokens": 3,
                                                      "temperature": 0}, timeout=300)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    assert metric_value(metrics(), "minfer_generated_tokens_total") == before + 3


def test_disconnect_of_a_non_streaming_request(engine, make_server):
    srv = make_server(lambda: engine)
    srv.wait_ready()
    metrics = lambda: httpx.get(srv.url + "/metrics", timeout=30).text  # noqa: E731
    body = json.dumps({"model": MODEL, "prompt": COUNTING, "max_tokens": LONG, "temperature": 0}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    # the worker took it: in flight and no longer queued
    _wait_for(lambda: (lambda m: metric_value(m, "minfer_requests_in_flight") == 1
                       and metric_value(m, "minfer_requests_queued") == 0)(metrics()), "request being generated")
    s.close()
    _wait_for(lambda: metric_value(metrics(), "minfer_generations_cancelled_total") == 1, "generation cancelled")
    assert metric_value(metrics(), "minfer_generated_tokens_total") < LONG // 2
    r = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2}, timeout=300)
    assert r.status_code == 200


class RecordingEngine:
    """The real engine, noting the prompt of each generation in the order the worker runs them;
    the generation of a prompt containing `hold_on` pauses after two tokens until `hold` is set,
    so that the test can queue requests behind it however slow or fast the machine is."""

    def __init__(self, inner, hold_on: str):
        self.inner = inner
        self.order: list[str] = []
        self.hold_on = hold_on
        self.hold = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, prompt_ids, *args, **kw):
        text = self.inner.tokenizer.decode(prompt_ids)
        self.order.append(text)
        for i, ev in enumerate(self.inner.generate(prompt_ids, *args, **kw)):
            if i == 2 and self.hold_on in text:
                assert self.hold.wait(600)
            yield ev


def test_queued_requests_are_served_in_arrival_order(engine, make_server):
    rec = RecordingEngine(engine, hold_on=COUNTING)
    srv = make_server(lambda: rec)
    srv.wait_ready()
    queued = lambda: metric_value(httpx.get(srv.url + "/metrics", timeout=30).text,  # noqa: E731
                                  "minfer_requests_queued")
    tags = ["alpha", "bravo", "charlie", "delta"]
    answers: dict = {}

    def post(tag):
        r = httpx.post(srv.url + "/v1/completions", timeout=600,
                       json={"model": MODEL, "prompt": f"Request {tag}:", "max_tokens": 2, "temperature": 0})
        answers[tag] = r.status_code

    body = {"model": MODEL, "prompt": COUNTING, "max_tokens": 6, "temperature": 0, "stream": True}
    threads = []
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=300) as a:
        lines = a.iter_lines()
        _data_lines(lines, 2)  # the worker is busy with this one, held after its second token
        for i, tag in enumerate(tags):
            t = threading.Thread(target=post, args=(tag,))
            t.start()
            threads.append(t)
            _wait_for(lambda: queued() == i + 1, f"{tag} queued")  # arrival order is fixed
        rec.hold.set()
        assert _data_lines(lines, 6)[-1] == "data: [DONE]"  # 4 more tokens, the final chunk, [DONE]
    for t in threads:
        t.join(600)
    assert answers == {t: 200 for t in tags}
    assert rec.order[0] == engine.tokenizer.decode(engine.tokenizer.encode(COUNTING))
    assert [next(t for t in tags if t in p) for p in rec.order[1:]] == tags


# ---- --parallel N: the batching worker (continuous batching over the paged KV cache) ---------

PROMPTS = ["Name a color.", "What is 2 + 2?", "Say hello in French.", "Name a fruit.", "Name a planet."]


def _complete(url, prompt, n, stream=False):
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}], "max_tokens": n,
            "temperature": 0, "stream": stream}
    if not stream:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=600)
        assert r.status_code == 200, r.text
        c = r.json()["choices"][0]
        return c["message"]["content"], c["finish_reason"]
    text, finish = "", None
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                ch = json.loads(line[6:])["choices"]
                if ch:
                    text += ch[0]["delta"].get("content") or ""
                    finish = ch[0].get("finish_reason") or finish
    return text, finish


@pytest.fixture(scope="module")
def reference_engine():
    """The model on the float32 reference path. The CPU int8 fast path (MINFER_CPU_QUANT) picks
    its kernel by the number of rows (the int8 kernel up to 16, a bf16 GEMM above), so a row's
    logits there depend on what else is in the batch and greedy near-ties can flip; the float32
    reference computes each row the same way in any batch."""
    import importlib.util
    from pathlib import Path

    # this folder's conftest by path: in a whole-suite run the bare name `conftest` can be
    # another folder's (tests/tokenizer/conftest.py)
    spec = importlib.util.spec_from_file_location("server_conftest", Path(__file__).with_name("conftest.py"))
    sc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sc)
    M, N_CTX = sc.MODEL, sc.N_CTX
    from minfer.catalog import resolve_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(str(resolve_model(M)), device="cpu", ctx=N_CTX, progress=False,
                       switches=Switches.from_env({"MINFER_CPU_QUANT": "0"}))


@pytest.mark.parametrize("held", [False, True])
def test_parallel_server_many_clients_some_hang_up_no_blocks_leak(reference_engine, make_server, monkeypatch, held):
    # held: with held decode steps (runtime/batch_engine.py), as the server runs on CUDA: events
    # one step late, cancellations while the next step is in flight
    from minfer.ops import paths
    from minfer.runtime.batch_engine import BatchEngine

    monkeypatch.setattr(BatchEngine, "async_default", held)
    paths.reset()
    engine = reference_engine
    srv = make_server(lambda: engine, parallel=4)
    srv.wait_ready()
    metrics = lambda: httpx.get(srv.url + "/metrics", timeout=30).text  # noqa: E731
    assert httpx.get(srv.url + "/health", timeout=30).json() == {"status": "ok", "slots": 4}
    meta = httpx.get(srv.url + "/v1/models", timeout=30).json()["data"][0]["meta"]
    assert meta["max_concurrent_requests"] == 4
    # each prompt alone through the same batching server: the reference
    alone = {p: _complete(srv.url, p, 8) for p in PROMPTS}
    total = metric_value(metrics(), "minfer_kv_blocks_free")
    assert total > 0 and metric_value(metrics(), "minfer_kv_blocks_used") == 0

    results: dict = {}
    n_hangups = 2
    barrier = threading.Barrier(len(PROMPTS) + n_hangups)

    def client(i):
        barrier.wait()
        p = PROMPTS[i]
        results[i] = _complete(srv.url, p, 8, stream=i % 2 == 0)

    def hang_up(i):
        body = {"model": MODEL, "prompt": COUNTING, "max_tokens": LONG, "temperature": 0, "stream": True}
        barrier.wait()
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=600) as r:
            assert r.status_code == 200
            _data_lines(r.iter_lines(), 2 + i)     # a few tokens, then the client goes away

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
    threads += [threading.Thread(target=hang_up, args=(i,)) for i in range(n_hangups)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    # 5 answered clients: the answers they got alone (among 7 requests on 4 slots: batched and queued)
    assert {PROMPTS[i]: results.get(i) for i in range(len(PROMPTS))} == alone
    _wait_for(lambda: metric_value(metrics(), "minfer_generations_cancelled_total") == n_hangups,
              "the hung-up generations cancelled")
    m = metrics()
    assert metric_value(m, "minfer_generated_tokens_total") < len(PROMPTS) * 16 + n_hangups * LONG // 4
    # no block leaks: every block is free again, no sequence running or waiting
    _wait_for(lambda: metric_value(metrics(), "minfer_sequences_running") == 0, "no sequence running")
    m = metrics()
    assert metric_value(m, "minfer_kv_blocks_used") == 0
    assert metric_value(m, "minfer_kv_blocks_free") == total
    assert metric_value(m, "minfer_sequences_waiting") == 0
    assert (paths.snapshot()["counts"].get("batch.async_chain", 0) > 0) == held   # the held steps ran, or none
    assert metric_value(m, "minfer_requests_in_flight") == 0
    assert metric_value(m, "minfer_time_to_first_token_seconds_count") >= 2 * len(PROMPTS)
    assert metric_value(m, "minfer_inter_token_seconds_count") > 0
    # the chat template's system prefix is shared: later requests found it in the prefix cache
    assert metric_value(m, "minfer_prefix_cache_hit_rate") > 0
    batch = srv.app.state.minfer.worker.batch
    batch.blocks.check()
