"""POST /v1/embeddings (minfer/server/embed_routes.py) through the official `openai` client and raw HTTP.

The reference is llama.cpp's own embeddings of the same files (tests/data/embed/goldens.json, from
tools/gen_embed_goldens.py; see tests/runtime/test_embed.py): qwen3-embed.gguf carries pooling_type
last and appends its EOS, as Qwen3-Embedding's files; qwen3.gguf (a chat model's file) names no pooling.
Both workers: one request at a time, and -np 2 (the embedding between the batch's steps)."""

from __future__ import annotations

import base64
import gzip
import json
import os
import struct
from pathlib import Path

import httpx
import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
GOLD = json.loads(gzip.decompress((DATA / "embed" / "goldens.json.gz").read_bytes()))["fixtures"]


def _engine(path: Path):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(path, ctx=64, progress=False,
                       switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))


@pytest.fixture(scope="module", params=[None, 2], ids=["one-at-a-time", "np2"])
def embed_server(request, make_server):
    eng = _engine(DATA / "embed" / "qwen3-embed.gguf")
    srv = make_server(lambda: eng, served_name="qwen3-embed", parallel=request.param)
    srv.wait_ready()
    return srv


def unit(v) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    return v / np.linalg.norm(v)


def rel(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_openai_client_gets_llama_cpps_vectors(embed_server):
    """The official client (it asks for base64 and decodes it) on a list of texts: llama.cpp's vectors,
    unit length, in order, with the token counts llama.cpp's tokenizer gives (EOS appended)."""
    import openai

    c = openai.OpenAI(base_url=embed_server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    ins = GOLD["qwen3-embed"]["file"]["inputs"]
    r = c.embeddings.create(model="qwen3-embed", input=[i["text"] for i in ins])
    assert [d.index for d in r.data] == [0, 1]
    for d, inp in zip(r.data, ins):
        assert len(d.embedding) == 64
        assert rel(d.embedding, unit(inp["embedding"])) < 2e-5
    n = sum(len(i["ids"]) for i in ins)
    assert r.usage.prompt_tokens == n and r.usage.total_tokens == n
    assert r.model == "qwen3-embed"


def post(srv, body, status=200):
    r = httpx.post(srv.url + "/v1/embeddings", json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def test_float_base64_ids_dimensions_and_normalize(embed_server):
    inp = GOLD["qwen3-embed"]["file"]["inputs"][1]
    raw = np.asarray(inp["embedding"], dtype=np.float64)
    a = post(embed_server, {"input": inp["text"]})
    assert a["object"] == "list" and a["data"][0]["object"] == "embedding"
    assert rel(a["data"][0]["embedding"], unit(raw)) < 2e-5
    b = post(embed_server, {"input": inp["text"], "encoding_format": "base64"})
    blob = base64.b64decode(b["data"][0]["embedding"])
    assert len(blob) == 4 * 64
    assert np.array_equal(np.array(struct.unpack("<64f", blob)), np.float32(a["data"][0]["embedding"]))
    c = post(embed_server, {"input": inp["ids"]})            # one list of token ids
    assert rel(c["data"][0]["embedding"], unit(raw)) < 2e-5
    d = post(embed_server, {"input": [inp["ids"], inp["ids"][:3]], "dimensions": 8})
    assert len(d["data"]) == 2 and len(d["data"][0]["embedding"]) == 8
    assert rel(d["data"][0]["embedding"], unit(raw[:8])) < 2e-5
    e = post(embed_server, {"input": inp["text"], "normalize": False})
    assert rel(e["data"][0]["embedding"], raw) < 2e-5
    f = post(embed_server, {"input": inp["text"], "embd_normalize": 1})
    assert rel(f["data"][0]["embedding"], raw / np.abs(raw).sum()) < 2e-5


def test_bad_requests_are_400s_naming_the_field(embed_server):
    for body, frag in [({"input": []}, "input: expected a string"),
                       ({"input": [[]]}, "input: expected a string"),
                       ({"input": [1, True]}, "input: expected a string"),
                       ({"input": "x", "encoding_format": "int8"}, "encoding_format: expected 'float' or 'base64'"),
                       ({"input": "x", "dimensions": 65}, r"dimensions: expected an integer in 1..64"),
                       ({"input": "x", "normalize": 1}, "normalize: expected true or false"),
                       ({"input": "x", "normalize": True, "embd_normalize": 2}, "give one"),
                       ({"input": "x", "embd_normalize": -2}, "embd_normalize: expected an integer >= -1"),
                       ({"input": "x", "truncate_prompt_tokens": 3}, "truncate_prompt_tokens: not a field"),
                       ({"input": [5, 999]}, r"token id 999 is outside the vocabulary \[0, 320\)"),
                       ({"input": ["ok", [5] * 70]}, "input\\[1\\] has 70 tokens, more than this model's context"),
                       ({"input": ["x"] * 2049}, "more than the 2048")]:
        r = httpx.post(embed_server.url + "/v1/embeddings", json=body, timeout=60)
        assert r.status_code == 400, (body, r.text)
        import re

        assert re.search(frag, r.json()["error"]["message"]), (frag, r.text)
    r = httpx.post(embed_server.url + "/v1/embeddings", json={"input": "x", "model": "other"}, timeout=60)
    assert r.status_code == 404


def test_generation_still_works_beside_embeddings(embed_server):
    """A completion after an embedding on the same server answers as before (the engine's cache reused
    from position 0 by either)."""
    body = {"prompt": "the cat", "max_tokens": 4, "temperature": 0}
    before = httpx.post(embed_server.url + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
    post(embed_server, {"input": "the cat sat"})
    after = httpx.post(embed_server.url + "/v1/completions", json=body, timeout=300).json()["choices"][0]["text"]
    assert before == after


def test_a_chat_models_file_needs_pooling(make_server):
    """qwen3.gguf names no pooling: 400 saying to start with --pooling; with pooling='mean', llama.cpp's vectors."""
    eng = _engine(DATA / "arch" / "qwen3.gguf")
    srv = make_server(lambda: eng, served_name="qwen3")
    srv.wait_ready()
    r = httpx.post(srv.url + "/v1/embeddings", json={"input": "Hello world"}, timeout=60)
    assert r.status_code == 400 and "start the server with --pooling" in r.json()["error"]["message"]
    srv2 = make_server(lambda: eng, served_name="qwen3", pooling="mean")
    srv2.wait_ready()
    inp = GOLD["qwen3"]["mean"]["inputs"][0]
    out = post(srv2, {"input": inp["ids"]})
    assert rel(out["data"][0]["embedding"], unit(inp["embedding"])) < 2e-5


def test_minfer_serve_pooling_flag():
    """`minfer serve --pooling mean` on a chat model's file: /v1/embeddings answers, with the float32 reference
    llama.cpp's mean-pooled unit vector (the flag reaches the route)."""
    import signal
    import socket
    import subprocess
    import sys

    from server_helpers import wait_healthy

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "minfer", "serve", "-m", str(DATA / "arch" / "qwen3.gguf"),
                             "--device", "cpu", "--port", str(port), "--ctx", "64", "--pooling", "mean"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", "MINFER_CPU_QUANT": "0"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        inp = GOLD["qwen3"]["mean"]["inputs"][1]
        r = httpx.post(url + "/v1/embeddings", json={"input": inp["text"]}, timeout=120)
        assert r.status_code == 200, r.text
        assert rel(r.json()["data"][0]["embedding"], unit(inp["embedding"])) < 2e-5
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=120)
    assert proc.returncode == 0


def test_a_bert_encoder_is_served(make_server):
    """bert-mean (an encoder: tools/gen_bert_fixture.py) one request at a time: /v1/embeddings answers with
    llama.cpp's vectors of the file's mean pooling (its GELU reads a float16 table: within 2e-3); a completion or
    a chat completion is a 400 naming what the model is; the batch engine refuses it by name."""
    from minfer.errors import MinferError
    from minfer.runtime.batch_engine import BatchEngine

    eng = _engine(DATA / "arch" / "bert-mean.gguf")
    srv = make_server(lambda: eng, served_name="bert-mean")
    srv.wait_ready()
    ins = GOLD["bert-mean"]["file"]["inputs"]
    out = post(srv, {"input": [i["text"] for i in ins]})
    for d, inp in zip(out["data"], ins):
        assert rel(d["embedding"], unit(inp["embedding"])) < 2e-3
    assert out["usage"]["prompt_tokens"] == sum(len(i["ids"]) for i in ins)
    for route, body in (("completions", {"prompt": "hi", "max_tokens": 2}),
                        ("chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})):
        r = httpx.post(srv.url + "/v1/" + route, json=body, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["message"] == (
            "this model (bert) is an encoder: it only embeds and generates nothing; use POST /v1/embeddings"), r.text
    with pytest.raises(MinferError, match="architecture 'bert' cannot run in the batch engine: it is an encoder"):
        BatchEngine.from_engine(eng)
