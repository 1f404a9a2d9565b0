"""bert's reranker head (pooling 'rank': minfer/models/bert.py RankHead) on tests/data/arch/bert-rank (tools/
gen_rerank_fixture.py: a tiny random HF BertForSequenceClassification, 1 label, converted by llama.cpp's converter).

References, none of them minfer's: transformers' logits in bert-rank.npz -- `llfn_logit_<i>`: the same weights
computing what llama.cpp's graph computes (classifier(h[CLS]), token types 0, tanh GELU), `hf_logit_<i>`: the model
as released (pooler dense + tanh, token types 0/1, erf GELU), which llama.cpp's file cannot reproduce because its
converter drops the pooler. llama.cpp's own scores are checked in tests/runtime/test_rerank.py."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
TOL = 2e-5      # abs, against transformers computing llama.cpp's function (measured <= 2.2e-6; scores ~0.1-1.1)
_ENG: list = []


def engine():
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    if not _ENG:
        _ENG.append(Engine.load(DATA / "bert-rank.gguf", progress=False,
                                switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})))
    return _ENG[0]


def pairs():
    z = np.load(DATA / "bert-rank.npz")
    n = len([k for k in z.files if k.startswith("hf_ids_")])
    return [(z[f"hf_ids_{i}"].tolist(), float(z[f"llfn_logit_{i}"][0]), float(z[f"hf_logit_{i}"][0])) for i in range(n)]


def miss(eng, head=None) -> float:
    head = head or eng.model.rank_head
    out = []
    for ids, want, _ in pairs():
        out.append(abs(float(eng._embed_one(ids, "rank", None, head)[0]) - want))
    return max(out)


def test_the_files_head_as_llama_cpps_converter_writes_it():
    """cls.output (1, D) + bias from HF's classifier, no `cls` (the pooler was dropped), one label, no pooling_type:
    read as a head of one output with no dense layer before it."""
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(DATA / "bert-rank.gguf")
    assert "cls.output.weight" in gf.tensors and "cls.weight" not in gf.tensors
    assert gf.metadata["bert.classifier.output_labels"] == ["LABEL_0"] and "bert.pooling_type" not in gf.metadata
    head = engine().model.rank_head
    assert head.cls is None and tuple(head.cls_out.shape) == (1, 32) and head.n_out == 1 and not head.mean
    assert head.labels == ["LABEL_0"]


def test_scores_match_transformers_computing_llama_cpps_function():
    m = miss(engine())
    print(f"max abs miss {m:.2e} (tol {TOL:.0e})")
    assert m < TOL


def test_transformers_full_model_scores_differently():
    """The released model's logits (pooler + tanh, the document as token type 1, erf GELU) are not what the file
    can give: they differ from the llama.cpp function's by far more than the tolerance (measured up to 1.06), so the
    comparison above tells the two apart."""
    assert max(abs(a - b) for _, a, b in pairs()) > 100 * TOL


@pytest.mark.parametrize("what", ["mean", "no_bias", "tanh_dense"])
def test_each_rule_is_needed(what):
    """Pooling the rows' mean instead of the [CLS] row, dropping cls.output.bias, or putting a tanh dense (the
    identity matrix) before cls.output: each misses by more than 100x the tolerance."""
    import torch

    eng = engine()
    h = eng.model.rank_head
    bad = {"mean": dataclasses.replace(h, mean=True), "no_bias": dataclasses.replace(h, cls_out_b=None),
           "tanh_dense": dataclasses.replace(h, cls=torch.eye(32), cls_b=None)}[what]
    assert miss(eng, bad) > 100 * TOL


def test_a_head_with_both_layers_is_tanh_dense_then_out():
    """cls then cls.output (build_pooling RANK: tanh(cls x + b), then cls_out x + b) on a row, against numpy."""
    import torch

    from minfer.models.bert import RankHead

    g = torch.Generator().manual_seed(0)
    w, b, o, ob = (torch.randn(s, generator=g) for s in ((4, 4), (4,), (2, 4), (2,)))
    x = torch.randn(4, generator=g)
    want = o.numpy() @ np.tanh(w.numpy() @ x.numpy() + b.numpy()) + ob.numpy()
    got = RankHead(w, b, o, ob, ["a", "b"])(x)
    assert np.abs(got.numpy() - want).max() < 1e-5 and RankHead(w, b, o, ob, ["a", "b"]).n_out == 2


def _copy(src: Path, dst: Path, extra: dict, drop: tuple = ()) -> None:
    """src with metadata keys of `extra` set (key -> (value, GGUFValueType)) and tensors `drop` left out."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

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
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bad_heads_are_refused_by_name(tmp_path):
    from gguf import GGUFValueType

    from minfer.gguf_file import GGUFFile
    from minfer.models.bert import load_rank_head

    two = tmp_path / "two-labels.gguf"
    _copy(DATA / "bert-rank.gguf", two, {"bert.classifier.output_labels": (["no", "yes"], GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"'cls.output.weight' has shape \(1, 32\), expected \(2, 32\) "
                                          r"\(bert.classifier.output_labels has 2\)"):
        load_rank_head(GGUFFile(two), 32)
    orphan = tmp_path / "orphan-bias.gguf"
    _copy(DATA / "bert-rank.gguf", orphan, {}, drop=("cls.output.weight",))
    with pytest.raises(MinferError, match=r"'cls.output.bias' without 'cls.output.weight'"):
        load_rank_head(GGUFFile(orphan), 32)
    assert load_rank_head(GGUFFile(DATA / "bert.gguf"), 64) is None       # an embedding model: no head


def test_fixture_json_names_its_measured_gap():
    meta = json.loads((DATA / "bert-rank.json").read_text())
    assert meta["class"] == "BertForSequenceClassification" and len(meta["config"]["id2label"]) == 1
    assert abs(meta["hf_vs_llama_function_max_abs"] - max(abs(a - b) for _, a, b in pairs())) < 1e-6
