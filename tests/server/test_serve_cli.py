"""`minfer serve` as a user runs it: a subprocess on a loopback port, stopped with Ctrl-C."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai
import pytest
from server_helpers import wait_healthy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(*args):
    return subprocess.Popen([sys.executable, "-m", "minfer", "serve", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_serve_command_answers_an_openai_client_and_stops_on_ctrl_c():
    port = _free_port()
    proc = _serve("-m", "smollm2-135m-instruct", "--device", "cpu", "--port", str(port), "--ctx", "256",
                  "--served-name", "tiny-chat", "--api-key", "k1")
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        c = openai.OpenAI(base_url=url + "/v1", api_key="k1", max_retries=0, timeout=300)
        assert [m.id for m in c.models.list().data] == ["tiny-chat"]
        assert c.models.list().data[0].model_extra["meta"]["n_ctx"] == 256
        r = c.chat.completions.create(model="tiny-chat", messages=[{"role": "user", "content": "Hi"}],
                                      max_tokens=3, temperature=0)
        assert r.usage.completion_tokens >= 1
        assert httpx.get(url + "/v1/models", timeout=30).status_code == 401  # --api-key is on
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert f"http://127.0.0.1:{port}/v1" in out and "tiny-chat" in out


def test_serve_missing_model_is_a_clear_error():
    proc = _serve("-m", "/nonexistent/model.gguf", "--port", str(_free_port()))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "minfer: error:" in err and "/nonexistent/model.gguf" in err and "Traceback" not in err


def test_serve_port_in_use_is_a_clear_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _serve("-m", "smollm2-135m-instruct", "--port", str(port))
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


def test_serve_help_explains_the_endpoints():
    out = subprocess.run([sys.executable, "-m", "minfer", "serve", "--help"], capture_output=True, text=True,
                         check=True).stdout
    for word in ("/v1/chat/completions", "/health", "--api-key", "--max-body", "--served-name", "127.0.0.1"):
        assert word in out


def test_serve_exits_with_the_reason_when_the_model_fails_to_load(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTGGUF" + b"\0" * 64)
    proc = _serve("-m", str(bad), "--port", str(_free_port()), "--device", "cpu")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    # the file is checked before the server starts: one line naming it and what is wrong
    assert "minfer: error:" in err and "bad.gguf" in err and "not a GGUF file" in err


def test_ctrl_c_while_the_model_loads_exits_cleanly(tmp_path):
    # Ctrl-C during the background load used to abort the process ("terminate called without an
    # active exception", SIGABRT): the interpreter finalized under the loader thread in torch's C++.
    # The stand-in load never ends and always runs inside torch, as a real load mostly does.
    wrapper = tmp_path / "slow_load.py"
    wrapper.write_text(
        "import sys, torch\n"
        "from minfer.runtime import engine\n"
        "def slow_load(*a, **k):\n"
        "    x = torch.randn(1000, 1000)\n"
        "    while True:\n"
        "        x = (x @ x).tanh_()\n"
        "engine.Engine.load = staticmethod(slow_load)\n"
        "from minfer import cli\n"
        "sys.exit(cli.main(sys.argv[1:]))\n")
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(wrapper), "serve", "-m", "smollm2-135m-instruct", "--device", "cpu",
                             "--port", str(port), "--log-level", "warning"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300   # hang guard
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=30).status_code == 503:
                    break   # listening, and the model is loading
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, out)
    assert "terminate called" not in out and "minfer: server stopped (the model had not finished loading)" in out, out


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_ctrl_c_on_a_busy_server_answers_503_and_exits_at_once(parallel):
    # Ctrl-C while requests generated: uvicorn waited its 5 s graceful timeout for them, then
    # cancelled each with a CancelledError traceback on the console, and the clients got nothing
    import json
    import threading

    port = _free_port()
    proc = _serve("-m", "smollm2-135m-instruct", "--device", "cpu", "--port", str(port), "-np", parallel,
                  "--log-level", "warning")
    url = f"http://127.0.0.1:{port}"
    got: dict = {}
    try:
        wait_healthy(proc, url)
        # SmolLM2's special tokens (ids 0-2: endoftext, im_start, im_end) banned: it never ends by itself
        body = {"prompt": "word " * 50, "max_tokens": 4000, "temperature": 0,
                "logit_bias": {"0": -100, "1": -100, "2": -100}}
        started = threading.Event()

        def plain():
            r = httpx.post(url + "/v1/completions", json=body, timeout=120)
            got["plain"] = (r.status_code, r.json())

        def streamed():
            with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=120) as r:
                events = []
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        events.append(json.loads(line[6:]))
                        started.set()
                got["stream"] = events

        # the stream first, so that with -np 1 it runs and the plain request waits in the queue
        threads = [threading.Thread(target=f, daemon=True) for f in (streamed, plain)]
        threads[0].start()
        assert started.wait(300)        # tokens are flowing (hang guard)
        threads[1].start()
        time.sleep(1)                   # the plain request reaches the server (-np 2: it generates)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        for t in threads:
            t.join(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, (proc.returncode, err)
    assert "Traceback" not in err and "CancelledError" not in err, err
    status, answer = got["plain"]
    assert status == 503 and answer["error"]["code"] == "server_shutting_down", got["plain"]
    assert got["stream"][-1]["error"]["code"] == "server_shutting_down", got["stream"][-3:]
