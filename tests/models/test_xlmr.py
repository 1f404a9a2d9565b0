"""XLM-RoBERTa encoders (bge-m3, multilingual-e5; bge-reranker-v2-m3) as llama.cpp's converter writes them: GGUF arch
`bert` with a SentencePiece Unigram vocab (tokenizer.ggml.model `t5`), run by minfer/models/bert.py and
minfer/tokenizer/ugm.py. Fixtures tests/data/arch/xlmr and xlmr-rank (tools/gen_xlmr_fixture.py: tiny random HF
XLMRobertaModel / XLMRobertaForSequenceClassification with a Unigram vocab trained there, converted by llama.cpp's
conversion/bert.py XLMRobertaModel).

References, none of them minfer's: transformers' last_hidden_state and logits (xlmr.npz, xlmr-rank.npz; `*_tanh_*`
with GELU's tanh form, which llama.cpp's graph computes), llama.cpp's pooled vectors, token ids, add flags and rerank
scores (tests/data/embed/goldens-xlmr.json.gz, llama-cpp-python 0.3.36).

No rule had to be added to minfer for these files: the converter turns XLM-R's quirks into what bert's graph already
reads (the position table cut by pad_token_id + 1 rows, one token type row, <s> / </s> / </s></s> as add_bos /
add_eos / add_sep true). test_each_rule_is_needed shows which of minfer's existing rules these files rely on."""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
ARCH = DATA / "arch"
GOLD = json.loads(gzip.decompress((DATA / "embed" / "goldens-xlmr.json.gz").read_bytes()))
TOL_TANH = 1e-5      # rel, vs transformers with the tanh GELU (measured <= 5.2e-7)
TOL_ERF = 1e-3       # rel, vs transformers as released (erf GELU; measured <= 3.7e-4)
TOL_LL = 2e-3        # rel, vs llama.cpp's pooled vectors (ggml's float16 GELU table; measured <= 5.3e-4)
TOL_RANK_HF = 2e-5   # abs, vs transformers' logit with the tanh GELU (measured <= 1e-6; scores 0.03-0.93)
TOL_RANK_LL = 3e-3   # abs, vs llama.cpp's scores (measured <= 1.3e-3)
_ENG: dict = {}


def engine(name: str = "xlmr"):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    if name not in _ENG:
        _ENG[name] = Engine.load(ARCH / f"{name}.gguf", ctx=128, progress=False,
                                 switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))
    return _ENG[name]


def ref():
    z = np.load(ARCH / "xlmr.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"], z[f"hidden_tanh_{i}"]) for i in range(n)]


def rank_ref():
    z = np.load(ARCH / "xlmr-rank.npz")
    n = len([k for k in z.files if k.startswith("hf_ids_")])
    return [(z[f"hf_ids_{i}"].tolist(), float(z[f"tanh_logit_{i}"][0]), float(z[f"hf_logit_{i}"][0]))
            for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng, tanh: bool = True) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), ht if tanh else he) for ids, he, ht in ref())


def rank_miss(eng, head=None) -> float:
    head = head or eng.model.rank_head
    return max(abs(float(eng._embed_one(ids, "rank", None, head)[0]) - want) for ids, want, _ in rank_ref())


def test_the_files_as_llama_cpps_converter_writes_them():
    """arch bert, vocab t5 realigned as fairseq (<s> <pad> </s> <unk> first), add_bos / add_eos / add_sep true, one
    token type, the position table cut to max_position_embeddings - (pad_token_id + 1) = 128 rows; the reranker with
    both head layers (XLM-R's classification head: dense + out_proj -> cls, cls.output)."""
    from minfer.gguf_file import GGUFFile

    for name in ("xlmr", "xlmr-rank"):
        md = GGUFFile(ARCH / f"{name}.gguf").metadata
        assert md["general.architecture"] == "bert" and md["tokenizer.ggml.model"] == "t5"
        assert md["tokenizer.ggml.tokens"][:4] == ["<s>", "<pad>", "</s>", "<unk>"]
        assert all(md[f"tokenizer.ggml.add_{k}_token"] is True for k in ("bos", "eos", "sep"))
        assert md["tokenizer.ggml.token_type_count"] == 1 and md["bert.context_length"] == 128
        assert "tokenizer.ggml.precompiled_charsmap" in md
    cfg = json.loads((ARCH / "xlmr.json").read_text())["config"]
    assert cfg["max_position_embeddings"] - cfg["pad_token_id"] - 1 == 128
    m = engine().model
    assert m.position_embd.shape == (128, 32) and m.type_row.shape == (32,) and m.rank_head is None
    head = engine("xlmr-rank").model.rank_head
    assert tuple(head.cls.shape) == (32, 32) and tuple(head.cls_out.shape) == (1, 32) and not head.mean
    assert GOLD["vocab"] == {"add_bos": True, "add_eos": True, "add_sep": True, "bos": 0, "eos": 2, "sep": 2,
                             "n_cls_out": 1, "rerank_template": False}


def test_hidden_rows_match_transformers():
    """5 texts (Latin, accents, CJK, Cyrillic, full-width) and 40 / 100 random ids: within TOL_TANH of transformers
    with the tanh GELU, TOL_ERF as released; the two references more than 10 x TOL_TANH apart."""
    eng = engine()
    assert hidden_miss(eng, tanh=True) < TOL_TANH
    assert hidden_miss(eng, tanh=False) < TOL_ERF
    assert max(rel(he, ht) for _, he, ht in ref()) > 10 * TOL_TANH


def test_pooled_vectors_match_llama_cpp():
    """llama.cpp's vectors (mean, cls, last, none) of each text, and its token ids of them."""
    eng = engine()
    worst = 0.0
    for pooling, rows in GOLD["embed"].items():
        for r in rows:
            assert eng.tokenizer.encode(r["text"]) == r["ids"], r["text"]
            got = eng.embed(r["text"], pooling=pooling, normalize=-1)
            worst = max(worst, rel(got, r["embedding"]))
    print(f"max rel miss vs llama.cpp {worst:.2e} (tol {TOL_LL:.0e})")
    assert worst < TOL_LL


def test_token_ids_match_llama_cpp():
    """Every text, add_special on / off x parse_special on / off; and transformers' ids of the reference's texts are
    llama.cpp's (so the hidden-row comparison runs what llama.cpp would run)."""
    tok = engine().tokenizer
    assert len(GOLD["tokens"]) >= 15
    for r in GOLD["tokens"]:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
        assert tok.encode(t, add_bos=False, parse_special=True) == r["plain_parsed"], t
    texts = json.loads((ARCH / "xlmr.json").read_text(encoding="utf-8"))["texts"]
    by_text = {r["text"]: r["special"] for r in GOLD["tokens"]}
    for (ids, _, _), t in zip(ref(), texts):
        assert ids == by_text[t], t


def test_rerank_matches_llama_cpp_and_transformers():
    """Each pair laid out as llama-server (<s> q </s></s> d </s>) scored within TOL_RANK_LL of llama.cpp; on
    transformers' own pair encoding within TOL_RANK_HF of its logit (tanh GELU; XLM-R's head is llama.cpp's tanh(cls x)
    -> cls.output, so as released only the GELU differs)."""
    from minfer.runtime.embed import pair_ids

    eng = engine("xlmr-rank")
    worst = 0.0
    for p in GOLD["pairs"]:
        assert pair_ids(eng.tokenizer, eng.model.rank_head, p["query"], p["document"]) == p["ids"]
        worst = max(worst, abs(eng.rerank(p["query"], [p["document"]]).scores[0] - p["scores"][0]))
    assert worst < TOL_RANK_LL
    assert rank_miss(eng) < TOL_RANK_HF
    # transformers' pair encoding is llama-server's layout where the texts hold no special-token text
    for (ids, _, _), p in list(zip(rank_ref(), GOLD["pairs"]))[:-1]:
        assert ids == p["ids"]
    assert max(abs(a - b) for _, a, b in rank_ref()) < 100 * TOL_RANK_HF     # erf vs tanh: small but there
    r = eng.rerank(GOLD["pairs"][0]["query"], [p["document"] for p in GOLD["pairs"][:5]])
    assert [i for i, _ in r.ranking] == sorted(range(5), key=lambda i: -GOLD["pairs"][i]["scores"][0])


@pytest.mark.parametrize("what", ["positions_offset", "no_token_type", "no_bos", "no_eos", "no_charsmap",
                                  "pair_no_sep", "head_no_tanh_dense"])
def test_each_rule_is_needed(monkeypatch, what):
    """The rules these files rely on, each changed in turn: positions numbered from pad_token_id + 1 as HF's raw table
    would be (the converter already cut those rows), no token type row, no BOS (UGM's default without the file's
    add_bos_token), no EOS, the precompiled charsmap skipped, the pair without add_sep's second </s>, the reranker
    without its tanh dense (cls): each makes the hidden rows, ids or scores miss."""
    from minfer import ops
    from minfer.runtime.embed import pair_ids

    if what in ("positions_offset", "no_token_type"):
        eng = engine()
        m = eng.model
        assert hidden_miss(eng) < TOL_TANH
        if what == "positions_offset":
            monkeypatch.setattr(m, "input_rows", lambda tokens, step: ops.embedding(tokens, m.token_embd).float()
                                + ops.embedding(step.positions + 2, m.position_embd).float() + m.type_row)
        else:
            monkeypatch.setattr(m, "type_row", None)
        assert hidden_miss(eng) > 1e3 * TOL_TANH
    elif what in ("no_bos", "no_eos", "no_charsmap"):
        tok = engine().tokenizer
        attr, obj = {"no_bos": ("add_bos", tok), "no_eos": ("add_eos", tok),
                     "no_charsmap": ("charsmap", tok._model)}[what]
        monkeypatch.setattr(obj, attr, False if attr.startswith("add") else None)
        rows = GOLD["tokens"]
        assert any(tok.encode(r["text"], parse_special=False) != r["special"] for r in rows)
    elif what == "pair_no_sep":
        eng = engine("xlmr-rank")
        head = eng.model.rank_head
        bad = dataclasses.replace(head, pair_meta={**head.pair_meta, "tokenizer.ggml.add_sep_token": False})
        p = GOLD["pairs"][0]
        assert pair_ids(eng.tokenizer, bad, p["query"], p["document"]) != p["ids"]
    else:
        eng = engine("xlmr-rank")
        h = eng.model.rank_head
        assert rank_miss(eng, dataclasses.replace(h, cls=None, cls_b=None)) > 100 * TOL_RANK_HF


def test_cli_embed_and_rerank(capsys, monkeypatch):
    """`minfer embed --pooling mean` (the file names no pooling) prints llama.cpp's unit vector (float32; on the
    default int8 path cosine > 0.9995); `minfer rerank` prints the documents by llama.cpp's scores."""
    from minfer.cli import main

    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    r = GOLD["embed"]["mean"][2]
    assert main(["embed", "-m", str(ARCH / "xlmr.gguf"), "--device", "cpu", "--pooling", "mean", r["text"]]) == 0
    got = np.asarray(json.loads(capsys.readouterr().out.strip()), dtype=np.float64)
    want = np.asarray(r["embedding"], dtype=np.float64)
    assert rel(got, want / np.linalg.norm(want)) < TOL_LL
    monkeypatch.setenv("MINFER_CPU_QUANT", "1")      # the CPU's default int8 path (measured cosine >= 0.99991)
    assert main(["embed", "-m", str(ARCH / "xlmr.gguf"), "--device", "cpu", "--pooling", "mean", r["text"]]) == 0
    got = np.asarray(json.loads(capsys.readouterr().out.strip()), dtype=np.float64)
    assert float(got @ want) / np.linalg.norm(want) > 0.9995
    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    ps = GOLD["pairs"][:5]
    docs = [p["document"] for p in ps]
    assert main(["rerank", "-m", str(ARCH / "xlmr-rank.gguf"), "--device", "cpu", "-q", ps[0]["query"], *docs]) == 0
    lines = [ln.split("\t") for ln in capsys.readouterr().out.splitlines()]
    assert [int(x[1]) for x in lines] == sorted(range(5), key=lambda i: -ps[i]["scores"][0])
    assert all(abs(float(s) - ps[int(i)]["scores"][0]) < TOL_RANK_LL and d == docs[int(i)] for s, i, d in lines)
