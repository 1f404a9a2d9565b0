"""A decoder reranker (Qwen3-Reranker's GGUF layout: minfer/models/qwen3.py, models/bert.py RankHead) on
tests/data/embed/qwen3-rank.gguf (tools/gen_qwen3_rank_fixture.py: the tiny qwen3 fixture with the keys and the
2-row `cls.output` llama.cpp's converter writes for a Qwen3-Reranker).

The reference is llama.cpp's own (tests/data/embed/goldens-qwen3-rank.json, the generator's `goldens` step): each
pair's token ids laid out as llama-server's format_prompt_rerank with the file's rerank template, and the RANK
pooling's two outputs from llama_get_embeddings_seq on an F32 copy of the file: the softmax over (yes, no) of the
LAST token's hidden row through cls.output. Engine.rerank, `minfer rerank` and POST /v1/rerank are checked against
it; each rule (last token, softmax) is shown to be needed."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
FILE = DATA / "embed" / "qwen3-rank.gguf"
GOLD = json.loads((DATA / "embed" / "goldens-qwen3-rank.json").read_text(encoding="utf-8"))
PAIRS = GOLD["pairs"]
SAME_Q = [p for p in PAIRS if p["query"] == PAIRS[0]["query"]]
# abs, on probabilities in (0, 1): minfer's float32 CPU reference vs llama.cpp's F32 CPU graph (measured <= 4.5e-7)
TOL = 2e-5
_ENG: dict = {}


def engine(path: Path = FILE):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    if path not in _ENG:
        _ENG[path] = Engine.load(path, progress=False,
                                 switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))
    return _ENG[path]


def miss(head=None, pooling: str = "last") -> float:
    """The largest |minfer - llama.cpp| over every pair's two outputs, the head applied to the row `pooling` takes."""
    eng = engine()
    head = head or eng.model.rank_head
    out = 0.0
    for p in PAIRS:
        got = head(eng._embed_one(p["ids"], pooling, None)).numpy()
        out = max(out, float(np.abs(got - np.asarray(p["scores"])).max()))
    return out


def test_the_file_is_a_qwen3_reranker_as_the_converter_writes_it():
    """pooling_type RANK, labels yes/no, a rerank template, cls.output = the tied lm head's rows of the two stand-in
    tokens; read as a head of 2 outputs, no dense layer, a softmax (qwen3), the template kept for the pair layout."""
    from minfer.gguf_file import GGUFFile
    from minfer.weights import load_dense

    gf = GGUFFile(FILE)
    md = gf.metadata
    assert md["qwen3.pooling_type"] == 4 and md["qwen3.classifier.output_labels"] == ["yes", "no"]
    assert md["tokenizer.chat_templates"] == ["rerank"] and md["tokenizer.chat_template.rerank"] == GOLD["template"]
    assert "output.weight" not in gf.tensors and "cls.weight" not in gf.tensors
    tokens = md["tokenizer.ggml.tokens"]
    embd, out = load_dense(gf, "token_embd.weight"), load_dense(gf, "cls.output.weight")
    assert (out == embd[[tokens.index("y"), tokens.index("n")]]).all()
    eng = engine()
    head = eng.model.rank_head
    assert type(eng.model).__name__ == "Qwen3Model" and eng.model.causal and eng.config.pooling_type == 4
    assert head.cls is None and head.cls_out_b is None and tuple(head.cls_out.shape) == (2, 64) and head.n_out == 2
    assert head.softmax and not head.mean and head.labels == ["yes", "no"]
    assert GOLD["vocab"] == {"add_bos": False, "add_eos": False, "bos": 1, "eos": 2, "n_cls_out": 2,
                             "labels": ["yes", "no"], "pooling_type": 4}


def test_pair_ids_are_llama_cpps():
    """The template filled in ({query} first, then {document}: pair 6's query holds "{document}") and tokenized with
    control texts parsed (<s> / </s> of the template and of pair 5's query and document) and nothing added."""
    from minfer.runtime.embed import pair_ids

    eng = engine()
    tok, head = eng.tokenizer, eng.model.rank_head
    for p in PAIRS:
        assert pair_ids(tok, head, p["query"], p["document"]) == p["ids"], p["document"]
    assert PAIRS[5]["ids"].count(1) == 4 and PAIRS[5]["ids"].count(2) == 3     # 3 + 2 from the template
    # without the template the vocab's plain layout (no BOS / EOS added here) is another sequence altogether
    p = PAIRS[0]
    plain = pair_ids(tok, dataclasses.replace(head, pair_meta={}), p["query"], p["document"])
    assert plain == tok.encode(p["query"] + p["document"], add_bos=False, parse_special=False) != p["ids"]


def test_scores_match_llama_cpp_and_are_probabilities():
    """Engine.rerank's score (element 0, llama-server's relevance_score) and Engine.embed's pooling 'rank' (the
    file's pooling: both outputs) within TOL of llama.cpp's; yes + no = 1."""
    eng = engine()
    worst = 0.0
    for p in PAIRS:
        r = eng.rerank(p["query"], [p["document"]])
        assert r.n_tokens == [len(p["ids"])]
        v = eng.embed(p["ids"], normalize=-1)           # the file's pooling_type: rank
        assert len(v) == 2 and abs(sum(v) - 1.0) < 1e-6 and all(0.0 < x < 1.0 for x in v)
        worst = max(worst, abs(r.scores[0] - p["scores"][0]), *(abs(a - b) for a, b in zip(v, p["scores"])))
    print(f"max abs miss vs llama.cpp {worst:.2e} (tol {TOL:.0e})")
    assert worst < TOL
    assert all(abs(sum(p["scores"]) - 1.0) < 1e-6 for p in PAIRS)


@pytest.mark.parametrize("what", ["no_softmax", "first_token", "mean"])
def test_each_rule_is_needed(what):
    """The raw logits (no softmax), the first token's row (an encoder's rule) or the rows' mean: each misses
    llama.cpp by more than 100x the tolerance. The first row is the template's <s>, the same for every pair."""
    h = engine().model.rank_head
    if what == "no_softmax":
        m = miss(dataclasses.replace(h, softmax=False))
    elif what == "first_token":
        m = miss(pooling="cls")
        rows = {tuple(h(engine()._embed_one(p["ids"], "cls", None)).tolist()) for p in PAIRS}
        assert len(rows) == 1
    else:
        m = miss(pooling="mean")
    assert m > 100 * TOL, (what, m)
    assert miss() < TOL


def test_rerank_orders_the_documents_as_llama_cpp():
    eng = engine()
    docs = [p["document"] for p in SAME_Q]
    want = [p["scores"][0] for p in SAME_Q]
    r = eng.rerank(SAME_Q[0]["query"], docs)
    assert all(abs(a - b) < TOL for a, b in zip(r.scores, want))
    order = sorted(range(len(want)), key=lambda i: -want[i])
    gaps = [want[order[i]] - want[order[i + 1]] for i in range(len(order) - 1)]
    assert min(gaps) > 10 * TOL                      # llama.cpp's scores are far enough apart to order
    assert [i for i, _ in r.ranking] == order and [s for _, s in r.ranking] == [r.scores[i] for i in order]
    r2 = eng.rerank(SAME_Q[0]["query"], docs, top_n=2)
    assert r2.ranking == r.ranking[:2] and r2.scores == r.scores


def test_cli_rerank(capsys, monkeypatch):
    from minfer.cli import main

    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    docs = [p["document"] for p in SAME_Q]
    assert main(["rerank", "-m", str(FILE), "--device", "cpu", "--query", SAME_Q[0]["query"], *docs]) == 0
    lines = [ln.split("\t") for ln in capsys.readouterr().out.splitlines()]
    assert [int(x[1]) for x in lines] == sorted(range(len(docs)), key=lambda i: -SAME_Q[i]["scores"][0])
    assert all(abs(float(s) - SAME_Q[int(i)]["scores"][0]) < TOL and d == docs[int(i)] for s, i, d in lines)


@pytest.mark.parametrize("parallel", [None, 2], ids=["one-at-a-time", "np2"])
def test_server_rerank_route(parallel):
    """POST /v1/rerank (and the /rerank alias) on this file, one request at a time and with the batch engine:
    llama.cpp's scores, its order, the pairs' tokens as usage; /v1/embeddings points at /v1/rerank."""
    from fastapi.testclient import TestClient

    from minfer.server import create_app

    eng = engine()
    app = create_app(lambda: eng, served_name="qwen3-rank", parallel=parallel)
    docs = [p["document"] for p in SAME_Q]
    with TestClient(app) as c:
        deadline = time.monotonic() + 300     # hang guard, not a timing assertion
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model never loaded"
            time.sleep(0.05)
        r = c.post("/v1/rerank", json={"model": "qwen3-rank", "query": SAME_Q[0]["query"], "documents": docs,
                                       "return_documents": True})
        assert r.status_code == 200, r.text
        a = r.json()
        n = sum(len(p["ids"]) for p in SAME_Q)
        assert a["usage"] == {"prompt_tokens": n, "total_tokens": n} and a["model"] == "qwen3-rank"
        assert [x["index"] for x in a["results"]] == sorted(range(len(docs)), key=lambda i: -SAME_Q[i]["scores"][0])
        for x in a["results"]:
            assert abs(x["relevance_score"] - SAME_Q[x["index"]]["scores"][0]) < TOL
            assert x["document"] == {"text": docs[x["index"]]}
        b = c.post("/rerank", json={"query": SAME_Q[0]["query"], "documents": docs[:2], "top_n": 1})
        best = max((0, 1), key=lambda i: SAME_Q[i]["scores"][0])
        assert b.status_code == 200 and [x["index"] for x in b.json()["results"]] == [best]
        e = c.post("/v1/embeddings", json={"input": "hello"})   # the file pools with 'rank': pointed at rerank
        assert e.status_code == 400 and "POST /v1/rerank" in e.json()["error"]["message"], e.text


def test_a_qwen3_file_without_the_head_refuses_rank():
    """tests/data/arch/qwen3.gguf (a chat model's file) and qwen3-embed.gguf (an embedding model's: pooling last)
    have no cls.output: pooling 'rank', Engine.rerank and the server's /v1/rerank refuse them by name."""
    from fastapi.testclient import TestClient

    from minfer.server import create_app

    for path, pt in ((DATA / "arch" / "qwen3.gguf", "absent"), (DATA / "embed" / "qwen3-embed.gguf", "last")):
        eng = engine(path)
        assert eng.model.rank_head is None
        msg = (r"pooling 'rank' is not supported: this model is not a reranker \(no classifier tensors cls / "
               rf"cls.output in the file, and qwen3.pooling_type is {pt}\)")
        with pytest.raises(MinferError, match=msg):
            eng.rerank("q", ["a"])
        with pytest.raises(MinferError, match=msg):
            eng.embed("hello", pooling="rank")
    with TestClient(create_app(lambda: engine(DATA / "arch" / "qwen3.gguf"), served_name="qwen3")) as c:
        deadline = time.monotonic() + 300
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline, "the model never loaded"
            time.sleep(0.05)
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["a"]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "model"
        assert "this model is not a reranker" in r.json()["error"]["message"]


def _copy(dst: Path, extra: dict, add: dict | None = None, drop: tuple = (), src: Path = FILE) -> Path:
    """src (the fixture) with keys `extra` set (key -> (value, GGUFValueType)), tensors `add` added (name ->
    float32 array) and `drop` left out."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter

    r = GGUFReader(str(src))
    w = GGUFWriter(str(dst), r.fields["general.architecture"].contents())
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in extra:
            continue
        vtype = f.types[0]
        w.add_key_value(key, f.contents(), vtype, sub_type=f.types[1] if vtype == GGUFValueType.ARRAY else None)
    for key, (val, vtype) in extra.items():
        w.add_key_value(key, val, vtype, sub_type=GGUFValueType.STRING if vtype == GGUFValueType.ARRAY else None)
    for t in r.tensors:
        if t.name not in drop:
            w.add_tensor(t.name, t.data, raw_shape=[int(d) for d in reversed(t.shape)], raw_dtype=t.tensor_type)
    for name, x in (add or {}).items():
        w.add_tensor(name, x.astype(np.float32), raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_bad_heads_are_refused_by_name(tmp_path):
    """cls.output's rows against the labels, a `cls` dense layer (qwen3's loader has none), an orphan bias; a
    cls.output.bias with its matrix is read and added (build_pooling's cls_out_b) before the softmax."""
    import torch
    from gguf import GGUFValueType

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model

    three = _copy(tmp_path / "three.gguf", {"qwen3.classifier.output_labels": (["a", "b", "c"], GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"three.gguf: tensor 'cls.output.weight' has shape \(2, 64\), "
                                          r"expected \(3, 64\) \(qwen3.classifier.output_labels has 3\)"):
        load_model(GGUFFile(three), progress=False)
    dense = _copy(tmp_path / "dense.gguf", {}, add={"cls.weight": np.eye(64)})
    with pytest.raises(MinferError, match=r"dense.gguf: tensor 'cls.weight': qwen3's reranker head is the output "
                                          r"layer 'cls.output.weight' only"):
        load_model(GGUFFile(dense), progress=False)
    orphan = _copy(tmp_path / "orphan.gguf", {}, add={"cls.output.bias": np.zeros(2)}, drop=("cls.output.weight",))
    with pytest.raises(MinferError, match=r"orphan.gguf: tensor 'cls.output.bias' without 'cls.output.weight'"):
        load_model(GGUFFile(orphan), progress=False)
    biased = _copy(tmp_path / "biased.gguf", {}, add={"cls.output.bias": np.array([1.0, -1.0])})
    head = load_model(GGUFFile(biased), progress=False).rank_head
    x = torch.randn(64, generator=torch.Generator().manual_seed(0))
    want = torch.softmax(head.cls_out @ x + torch.tensor([1.0, -1.0]), -1)
    assert torch.allclose(head(x), want, atol=1e-6) and abs(float(head(x).sum()) - 1.0) < 1e-6


def test_qwen3vl_inherits_the_head_and_its_softmax(tmp_path):
    """Qwen3-VL-Reranker's text model (arch qwen3vl, models/qwen3vl.py: Qwen3Model's loader) reads cls.output the
    same way, and build_pooling's softmax names QWEN3VL too; a bert head never gets one."""
    from gguf import GGUFValueType

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.weights import load_dense

    src = DATA / "arch" / "qwen3vl.gguf"
    rows = load_dense(GGUFFile(src), "token_embd.weight")[[91, 80]].float().numpy()
    vl = _copy(tmp_path / "vl.gguf", {"qwen3vl.classifier.output_labels": (["yes", "no"], GGUFValueType.ARRAY)},
               add={"cls.output.weight": rows}, src=src)
    m = load_model(GGUFFile(vl), progress=False)
    assert type(m).__name__ == "Qwen3VLModel" and m.rank_head.softmax and m.rank_head.n_out == 2
    assert load_model(GGUFFile(src), progress=False).rank_head is None
    assert not load_model(GGUFFile(DATA / "arch" / "bert-rank.gguf"), progress=False).rank_head.softmax
