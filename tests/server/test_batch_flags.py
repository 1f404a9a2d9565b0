"""`minfer serve --token-budget N` reaches the batch engine, and /v1/models says what it is (the
serving benchmark records it beside its numbers, for A/B runs of the budget)."""

from __future__ import annotations

import logging

import httpx

SERVED = "smollm2-135m-instruct"   # conftest.SERVED: the name make_server serves

PROMPT = " ".join(f"word{i}" for i in range(40))   # past 24 tokens: prefilled in several chunks


def _greedy(url: str) -> dict:
    r = httpx.post(url + "/v1/completions", json={"model": SERVED, "prompt": PROMPT, "max_tokens": 4,
                                                   "temperature": 0}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def _meta(url: str) -> dict:
    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["meta"]


def test_token_budget_reaches_the_batch_engine(engine, make_server):
    small = make_server(lambda: engine, parallel=2, token_budget=24)
    small.wait_ready()
    assert small.app.state.minfer.worker.batch.scheduler.token_budget == 24
    assert _meta(small.url)["token_budget"] == 24
    chunked = _greedy(small.url)
    assert chunked["usage"]["prompt_tokens"] > 24 and chunked["usage"]["completion_tokens"] == 4
    small.stop()

    default = make_server(lambda: engine, parallel=2)
    default.wait_ready()
    assert _meta(default.url)["token_budget"] == 512     # the CPU's default, as --help says
    # the budget changes how the prompt is cut into steps, not the greedy answer
    assert _greedy(default.url)["choices"][0]["text"] == chunked["choices"][0]["text"]
    default.stop()


def test_one_request_at_a_time_has_no_token_budget(server):
    assert "token_budget" not in _meta(server.url)


def test_serve_bench_launches_the_server_with_the_budget_and_records_it(tmp_path):
    import json
    import socket

    from minfer.bench import serve_bench

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "serve.json"
    assert serve_bench.main(["--launch", "-m", SERVED, "--device", "cpu", "--url", f"http://127.0.0.1:{port}",
                             "--ctx", "256", "--parallel", "2", "--token-budget", "32", "--clients", "2",
                             "--requests", "2", "--prompt-lens", "40", "--max-tokens", "2", "--vocab", "1000",
                             "--out", str(out)]) == 0
    rec = json.loads(out.read_text())
    # the flag as given, and the budget the launched server reports using
    assert rec["server"]["token_budget_flag"] == 32 and rec["server"]["token_budget"] == 32, rec["server"]
    assert rec["server"]["slots"] == 2 and rec["server"]["n_ctx"] == 256, rec["server"]
    assert rec["levels"][0]["failed"] == 0 and rec["levels"][0]["output_tokens"] == 4, rec["levels"]


def test_serve_bench_refuses_server_flags_without_launch(capsys):
    import pytest

    from minfer.bench import serve_bench

    # they were ignored: a run "with --token-budget 64" against a server that had another budget
    with pytest.raises(SystemExit) as e:
        serve_bench.main(["--url", "http://127.0.0.1:9", "--token-budget", "64"])
    assert e.value.code == 2 and "add --launch" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        serve_bench.main(["--launch", "--token-budget", "64"])
    assert e.value.code == 2 and "give -m" in capsys.readouterr().err


def test_serve_bench_odd_arguments_are_refused_before_measuring(capsys, server):
    import socket

    import pytest

    from minfer.bench import serve_bench

    for argv, expect in ((["--clients", "0"], "--clients: '0': expected comma-separated integers >= 1"),
                         (["--prompt-lens", "128,,512"], "--prompt-lens: '128,,512'"),
                         (["--max-tokens", "0"], "--max-tokens 0: expected 1 or more"),
                         # launched: checked against --ctx before the server starts
                         (["--launch", "-m", "x", "--ctx", "256", "--prompt-lens", "200", "--max-tokens", "64"],
                          "needs a context of 263 but the server's is 256")):
        with pytest.raises(SystemExit) as e:
            serve_bench.main(argv)
        assert e.value.code == 2 and expect in capsys.readouterr().err, argv
    # a running server's context (512 here) read from /v1/models: was a table of refused or cut answers
    with pytest.raises(SystemExit) as e:
        serve_bench.main(["--url", server.url, "--served-name", SERVED, "--clients", "1", "--prompt-lens", "500",
                          "--max-tokens", "20"])
    assert "needs a context of 519 but the server's is 512" in str(e.value.code), e.value.code
    # nothing listening: an error after a short wait, not 15 silent minutes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SystemExit) as e:
        serve_bench._wait_ready(f"http://127.0.0.1:{port}", None, unreachable_s=0.5)
    assert "nothing answers at" in str(e.value.code) and "--launch" in str(e.value.code)


def test_serve_bench_says_why_requests_failed(capsys, server, tmp_path):
    import json

    from minfer.bench import serve_bench

    out = tmp_path / "r.json"
    # ids drawn from [100, 60000): past the 49152-token vocabulary of the served model
    assert serve_bench.main(["--url", server.url, "--served-name", SERVED, "--clients", "1", "--requests", "2",
                             "--prompt-lens", "200", "--max-tokens", "1", "--vocab", "60000", "--out", str(out)]) == 0
    level = json.loads(out.read_text())["levels"][0]
    assert level["failed"] >= 1 and level["first_error"]["status"] == 400, level
    assert "outside the vocabulary" in level["first_error"]["error"], level
    assert "failed, the first with 400" in capsys.readouterr().err


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "minfer.server" and r.levelno == logging.WARNING]


def test_a_budget_below_the_slots_from_memory_is_raised_with_a_warning(engine, make_server, caplog):
    # -np 0: the slots come from the engine (4 on the CPU), after `minfer serve` checked its flags;
    # the engine takes at least one token per slot, and the log says so
    caplog.set_level(logging.WARNING, logger="minfer.server")
    srv = make_server(lambda: engine, parallel=0, token_budget=2)
    srv.wait_ready()
    assert _meta(srv.url)["token_budget"] == 4 and _meta(srv.url)["max_concurrent_requests"] == 4
    msgs = _warnings(caplog)
    assert any("--token-budget 2 is below the 4 sequences" in m for m in msgs), msgs
    srv.stop()


def test_serve_bench_at_a_url_sends_the_name_the_server_serves(server, tmp_path):
    import json

    from minfer.bench import serve_bench

    out = tmp_path / "r.json"
    # no --served-name: it was 'bench', and every request to a `minfer serve -m MODEL` was a 404
    assert serve_bench.main(["--url", server.url, "--clients", "1", "--requests", "1", "--prompt-lens", "8",
                             "--max-tokens", "2", "--vocab", "1000", "--out", str(out)]) == 0
    level = json.loads(out.read_text())["levels"][0]
    assert level["failed"] == 0 and level["output_tokens"] == 2, level


def test_a_pool_under_one_context_made_after_the_load_warns(engine, make_server, caplog):
    # the CLI refuses such a --kv-memory up front; the CUDA default pool is sized after the load,
    # where only the log can say it: here a pool of 17 blocks (16 usable: 256 positions) for 512
    caplog.set_level(logging.WARNING, logger="minfer.server")
    cfg = engine.config
    per_block = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * 4 * 16   # K and V, float32, 16 positions
    srv = make_server(lambda: engine, parallel=2, kv_memory=17 * per_block)
    srv.wait_ready()
    msgs = _warnings(caplog)
    assert any("holds 256 positions, less than one full context (512 tokens)" in m for m in msgs), msgs
    srv.stop()
