"""POST /v1/rerank (and llama-server's aliases /rerank, /v1/reranking, /reranking: minfer/server/embed_routes.py)
on tests/data/arch/bert-rank.gguf, a tiny cross-encoder converted by llama.cpp's converter.

The reference is llama.cpp's own (tests/data/embed/goldens-rank.json, tools/gen_rerank_fixture.py): each pair's
score (llama-server's relevance_score: the RANK pooling's first output) and token count (its usage counts the
tokens of every pair, format_response_rerank). The answer's shape is llama-server's Jina-style one."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
GOLD = json.loads((DATA / "embed" / "goldens-rank.json").read_text(encoding="utf-8"))
PAIRS = [p for p in GOLD["pairs"] if p["query"] == GOLD["pairs"][0]["query"]]
QUERY, DOCS = PAIRS[0]["query"], [p["document"] for p in PAIRS]
TOL = 3e-3     # minfer vs llama.cpp's scores: ggml's float16 GELU table (measured <= 9.2e-4, tests/runtime/test_rerank.py)


def _engine(name: str):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(DATA / "arch" / f"{name}.gguf", progress=False,
                       switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))


@pytest.fixture(scope="module")
def rank_server(make_server):
    eng = _engine("bert-rank")
    srv = make_server(lambda: eng, served_name="bert-rank")
    srv.wait_ready()
    return srv


def post(srv, body, status=200, path="/v1/rerank"):
    r = httpx.post(srv.url + path, json=body, timeout=300)
    assert r.status_code == status, r.text
    return r.json()


def test_scores_order_and_usage_are_llama_cpps(rank_server):
    a = post(rank_server, {"model": "bert-rank", "query": QUERY, "documents": DOCS})
    assert set(a) == {"model", "object", "usage", "results"} and a["model"] == "bert-rank" and a["object"] == "list"
    n = sum(len(p["ids"]) for p in PAIRS)
    assert a["usage"] == {"prompt_tokens": n, "total_tokens": n}
    order = sorted(range(len(PAIRS)), key=lambda i: -PAIRS[i]["scores"][0])
    assert [r["index"] for r in a["results"]] == order
    for r in a["results"]:
        assert set(r) == {"index", "relevance_score"}
        assert abs(r["relevance_score"] - PAIRS[r["index"]]["scores"][0]) < TOL
    scores = [r["relevance_score"] for r in a["results"]]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("path", ["/rerank", "/v1/reranking", "/reranking"])
def test_llama_servers_aliases(rank_server, path):
    a = post(rank_server, {"query": QUERY, "documents": DOCS[:2]}, path=path)
    b = post(rank_server, {"query": QUERY, "documents": DOCS[:2]})
    assert a == b and len(a["results"]) == 2


def test_top_n_and_return_documents(rank_server):
    full = post(rank_server, {"query": QUERY, "documents": DOCS})
    a = post(rank_server, {"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": True})
    assert [r["index"] for r in a["results"]] == [r["index"] for r in full["results"][:2]]
    assert all(r["document"] == {"text": DOCS[r["index"]]} for r in a["results"])
    assert a["usage"] == full["usage"]          # every pair was scored: all their tokens count
    b = post(rank_server, {"query": QUERY, "documents": DOCS, "top_n": 100, "return_documents": False})
    assert b == full


@pytest.mark.parametrize("body, param, match", [
    ({"query": QUERY, "documents": []}, "documents", "documents: expected a non-empty list of strings"),
    ({"query": QUERY, "documents": "a text"}, "documents", "documents: expected a non-empty list of strings"),
    ({"query": QUERY, "documents": ["a", 3]}, "documents", r"documents\[1\]: expected a string, got int"),
    ({"documents": ["a"]}, "query", r"query: expected a string \(it is required\)"),
    ({"query": ["q"], "documents": ["a"]}, "query", "query: expected a string"),
    ({"query": QUERY, "documents": ["a"], "top_n": 0}, "top_n", "top_n: expected an integer >= 1"),
    ({"query": QUERY, "documents": ["a"], "top_n": True}, "top_n", "top_n: expected an integer >= 1"),
    ({"query": QUERY, "documents": ["a"], "return_documents": "yes"}, "return_documents", "expected true or false"),
    ({"query": QUERY, "documents": ["a"], "texts": ["a"]}, "texts", "texts: not a field of this request"),
    ({"query": QUERY, "documents": ["the cat sat on the mat " * 12]}, "documents",
     r"documents\[0\]: the query and this document are \d+ tokens, more than this model's context of 64"),
])
def test_bad_requests_are_400_naming_the_field(rank_server, body, param, match):
    import re

    e = post(rank_server, body, status=400)["error"]
    assert e["param"] == param and re.search(match, e["message"]), e


def test_unknown_model_and_embeddings_on_a_reranker(rank_server):
    e = post(rank_server, {"model": "other", "query": QUERY, "documents": ["a"]}, status=404)["error"]
    assert "other" in e["message"]
    # /v1/embeddings on this file: it names no pooling, so the server asks for --pooling
    e = post(rank_server, {"input": "hello"}, status=400, path="/v1/embeddings")["error"]
    assert "pooling" in e["message"]


def test_404_lists_the_rerank_route(rank_server):
    r = httpx.post(rank_server.url + "/v1/nowhere", json={}, timeout=60)
    assert r.status_code == 404 and "POST /v1/rerank" in r.json()["error"]["message"]


def test_a_model_without_a_classifier_head_is_a_400(make_server):
    eng = _engine("bert")
    srv = make_server(lambda: eng, served_name="bert")
    srv.wait_ready()
    e = post(srv, {"query": "q", "documents": ["a"]}, status=400)["error"]
    assert e["param"] == "model" and "this server does not rerank" in e["message"]
    assert "this model is not a reranker" in e["message"]
