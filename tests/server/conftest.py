"""Fixtures for the server tests: the real small model, and real servers on loopback ports.

Every server runs uvicorn in a background thread on a free 127.0.0.1 port and is driven over
real HTTP (the official `openai` client, or httpx). The engine is loaded once per session and
shared by the apps the tests build (each app has its own worker thread and metrics registry);
tests run one after another, so two apps never generate at the same time.
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest
import uvicorn

MODEL = "smollm2-135m-instruct"
N_CTX = 512  # small: a prompt past the context is cheap to build, and memory stays low
SERVED = MODEL


class LiveServer:
    """uvicorn serving `app` in a thread on a free loopback port."""

    def __init__(self, app) -> None:
        self.app = app
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 60  # hang guard, not a timing assertion
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)

    def wait_ready(self, headers=None) -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            r = httpx.get(self.url + "/health", headers=headers, timeout=30)
            if r.status_code == 200:
                return
            time.sleep(0.1)
        raise RuntimeError("server never became ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


@pytest.fixture(scope="session")
def engine():
    from minfer.catalog import resolve_model
    from minfer.runtime.engine import Engine

    return Engine.load(str(resolve_model(MODEL)), device="cpu", ctx=N_CTX)


@pytest.fixture(scope="session")
def params_cls():
    from minfer.runtime.sampling import SamplingParams

    return SamplingParams


@pytest.fixture(scope="session")
def make_server(params_cls):
    """make_server(engine_factory, **create_app kwargs) -> a started LiveServer (stopped at the end)."""
    from minfer.server import create_app

    started = []

    def make(factory, **kw):
        kw.setdefault("served_name", SERVED)
        srv = LiveServer(create_app(factory, sampling_params_cls=params_cls, **kw))
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


@pytest.fixture(scope="session")
def server(engine, make_server):
    """The main server: the real model, a 1 MiB body limit, no auth."""
    srv = make_server(lambda: engine, max_body=1 << 20)
    srv.wait_ready()
    return srv


@pytest.fixture()
def client(server):
    import openai

    # max_retries=0: a retried request would hide errors and double-count metrics
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
