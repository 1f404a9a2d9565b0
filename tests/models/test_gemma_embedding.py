"""gemma-embedding (EmbeddingGemma: minfer/models/gemma_embedding.py) on the fixture tests/data/arch/gemma-embedding
(tools/gen_gemma_embed_fixture.py: a tiny random transformers Gemma3TextModel with use_bidirectional_attention, 6
layers (0-4 sliding, window 8; 5 global), sentence-transformers' mean pooling and Dense 32 -> 96 -> 32, converted by
llama.cpp's converter with --sentence-transformers-dense-modules).

References, none of them minfer's: transformers' last_hidden_state (gemma-embedding.npz `hidden_<i>`), the
sentence-transformers pipeline computed from it (`st_<i>` = dense_3(dense_2(mean)), float64), llama.cpp's own pooled
embeddings and token ids (tests/data/embed/goldens-gemma-embed.json.gz). Here: the hidden rows against transformers, the
vectors against both, each rule shown needed (bidirectional, the symmetric window and its width, the two rope bases,
the Dense layers and their place after the pooling), generation refused, bad files refused by name."""

from __future__ import annotations

import gzip
import json
import os
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
NAME = "gemma-embedding"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-gemma-embed.json.gz").read_bytes()))
# float32 against transformers: measured <= 9.5e-7 (hidden rows, max abs / max |h|), <= 5.9e-7 (pipeline vectors)
TOL = 1e-5
# against llama.cpp: its CPU GELU is a float16 table (GGML_GELU_FP16), measured <= 9.0e-4 (as gemma's 2e-3 in
# tests/gpu/test_embed_gpu.py)
TOL_LL = 2e-3
_ENGINES: dict = {}


def engine(path: Path = PATH, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref() -> list[tuple[list[int], np.ndarray, np.ndarray]]:
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"], z[f"st_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


@contextmanager
def no_dense(m):
    """The model without its Dense layers (post_pool then hands the rows out as they are)."""
    d2, d3 = m.dense_2, m.dense_3
    m.dense_2 = m.dense_3 = None
    try:
        yield m
    finally:
        m.dense_2, m.dense_3 = d2, d3


def hidden_miss(eng) -> float:
    with no_dense(eng.model):
        return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h, _ in ref())


def pipeline_miss(eng) -> float:
    return max(rel(eng.embed(ids, pooling="mean", normalize=-1), st) for ids, _, st in ref())


def llamacpp_miss(eng, poolings=("mean", "cls", "last", "none", "file")) -> float:
    worst = 0.0
    for pooling in poolings:
        for inp in GOLDENS["fixtures"][NAME][pooling]["inputs"]:
            got = eng.embed(inp["ids"], pooling=None if pooling == "file" else pooling, normalize=-1)
            worst = max(worst, rel(got, inp["embedding"]))
    return worst


def test_layout():
    m = engine().model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == (6, 32, 2, 1, 16, 64, 320)
    assert m.causal is False and m.paged_kv is False and c.pooling_type == 1 and c.sliding_window == 8
    assert m.is_local == (True,) * 5 + (False,) and m.half_window == 4 and m.scale == 0.25
    assert [r.theta for r in m.layer_rope] == [1000.0] * 5 + [100000.0] and c.rope.style == "neox"
    assert tuple(m.dense_2.shape) == (96, 32) and tuple(m.dense_3.shape) == (32, 96)
    assert m.dense_2.dtype == torch.float32 and m.dense_2.device.type == "cpu"
    from minfer.gguf_file import GGUFFile

    assert f"{NAME}.attention.causal" not in GGUFFile(PATH).metadata     # llama.cpp's loader sets it, not the file


def test_hidden_rows_match_transformers():
    """Every input (2 texts, 20 and 40 random ids) within 1e-5 of transformers' last_hidden_state."""
    assert hidden_miss(engine()) < TOL


def test_vectors_match_the_sentence_transformers_pipeline():
    """mean pooling then dense_2 then dense_3 (no bias, Identity activation) within 1e-5 of the pipeline computed from
    transformers' rows; normalize=2 is its 4_Normalize."""
    eng = engine()
    assert pipeline_miss(eng) < TOL
    for ids, _, st in ref():
        got = eng.embed(ids)            # the file's pooling (mean), euclidean normalization
        assert rel(got, st / np.linalg.norm(st.astype(np.float64))) < TOL


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none", "file"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (F32 copy of the file; the Dense layers applied after its pooling,
    to every row for 'none') within 2e-3, raw and normalized; the goldens' ids are minfer's tokenizer's."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3, "file": 1}[pooling] and len(d["inputs"]) == 3
    assert max(len(inp["ids"]) for inp in d["inputs"]) > 2 * 8       # past the window
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        p = None if pooling == "file" else pooling
        want = np.asarray(inp["embedding"], dtype=np.float64)
        assert rel(eng.embed(inp["text"], pooling=p, normalize=-1), want) < TOL_LL, (pooling, inp["text"])
        unit = want / np.linalg.norm(want, axis=-1, keepdims=True)
        assert rel(eng.embed(inp["text"], pooling=p), unit) < TOL_LL, (pooling, inp["text"])


def _causal(q, k, v, scale, half=None):
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    pos = torch.arange(T)
    mask = pos[None, :] <= pos[:, None]
    if half is not None:              # transformers' causal sliding window of 8: i - 8 < j <= i
        mask &= pos[None, :] > pos[:, None] - 8
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                         attn_mask=mask, scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "no_window", "window_not_halved", "causal_window", "rope_bases_swapped",
                                  "scale_1_over_sqrt_D"])
def test_each_attention_rule_is_needed(monkeypatch, what):
    """Bidirectional attention, the symmetric window |i - j| <= 8 / 2 on the sliding layers, each layer kind's rope
    base, q * 1/sqrt(head_dim): with any one changed the hidden rows miss transformers' by more than 100x the
    tolerance (measured: causal 1.23, no window 1.81, window |i - j| <= 8 1.24, transformers' causal window 1.23, rope
    bases swapped 0.62, q * 1/sqrt(D) 0.47)."""
    import minfer.models.gemma_embedding as ge
    from dataclasses import replace

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "causal":
        monkeypatch.setattr(ge, "bidirectional_attention", _causal)
        monkeypatch.setattr(ge, "window_attention", _causal)
    elif what == "no_window":
        monkeypatch.setattr(m, "is_local", (False,) * 6)
    elif what == "window_not_halved":
        monkeypatch.setattr(m, "half_window", 8)
    elif what == "causal_window":
        monkeypatch.setattr(ge, "window_attention", lambda q, k, v, s, h: _causal(q, k, v, s, h))
    elif what == "rope_bases_swapped":
        r = m.layer_rope
        monkeypatch.setattr(m, "layer_rope", [replace(x, theta=1e5 if x.theta == 1e3 else 1e3) for x in r])
    else:
        monkeypatch.setattr(m, "scale", 32 ** -0.5)
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 100 * TOL


@pytest.mark.parametrize("what", ["no_dense", "dense_2_only", "dense_swapped"])
def test_the_dense_layers_are_needed(monkeypatch, what):
    """Without the Dense layers, or with W_3^T W_2^T in their place (the same shapes, the other order), the vectors
    miss the pipeline's by more than 100x TOL and llama.cpp's by more than 50x its tolerance (measured: none 1.3 / 1.33,
    swapped 1.81 / 1.72); with dense_2 only they have 96 values, not 32."""
    eng = engine()
    m = eng.model
    assert pipeline_miss(eng) < TOL and llamacpp_miss(eng, ("mean", "none")) < TOL_LL
    if what == "no_dense":
        monkeypatch.setattr(m, "dense_2", None)
        monkeypatch.setattr(m, "dense_3", None)
    elif what == "dense_2_only":
        monkeypatch.setattr(m, "dense_3", None)
        assert len(eng.embed(ref()[0][0], pooling="mean")) == 96
        return
    else:
        d2, d3 = m.dense_2, m.dense_3
        monkeypatch.setattr(m, "dense_2", d3.T.contiguous())
        monkeypatch.setattr(m, "dense_3", d2.T.contiguous())
    miss, miss_ll = pipeline_miss(eng), llamacpp_miss(eng, ("mean", "cls", "none"))
    print(f"{what}: pipeline {miss:.3g}, llama.cpp {miss_ll:.3g}")
    assert miss > 100 * TOL and miss_ll > 50 * TOL_LL


def test_without_dense_tensors_the_file_gives_the_pooled_rows(tmp_path):
    """A file converted without --sentence-transformers-dense-modules (no dense tensors, no keys) embeds the pooled
    output_norm rows, as llama.cpp's build_dense_out does nothing then."""
    from models.test_arch_vs_transformers import rewrite

    keys = tuple(f"{NAME}.dense_{a}_feat_{b}" for a in (2, 3) for b in ("in", "out"))
    path = rewrite(PATH, tmp_path / "plain.gguf", drop_tensors=("dense_2.weight", "dense_3.weight"), drop_keys=keys)
    eng = engine(path)
    assert eng.model.dense_2 is None and eng.model.dense_3 is None
    for ids, h, _ in ref():
        assert rel(eng.embed(ids, pooling="mean", normalize=-1), h.astype(np.float64).mean(0)) < TOL


def test_tokenizer_matches_llama_cpp():
    """llama.cpp's ids (add_special on, parse_special on and off; neither) of texts with accents, CJK, emoji,
    special-token texts, odd spaces; the transformers reference's texts have llama.cpp's ids."""
    tok = engine().tokenizer
    rows = GOLDENS["tokens"][NAME]
    assert len(rows) >= 7
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    texts = json.loads((DATA / "arch" / f"{NAME}.json").read_text())["texts"]
    for (ids, _, _), t, r in zip(ref(), texts, rows):
        assert r["text"] == t and ids == r["special"]


def test_generation_is_refused_and_one_forward():
    """Engine.logits / generate refused with the encoders' one-line message naming gemma-embedding; an input goes
    through one forward whatever the prefill chunk; a step not at position 0 is refused."""
    from minfer.models.base import Step

    eng = engine()
    msg = r"gemma-embedding is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([5, 50, 7])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([5, 50, 7], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    chunked = engine(MINFER_PREFILL_CHUNK=3)
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL
    with pytest.raises(MinferError, match="one forward from position 0"):
        eng.model.forward(torch.tensor([5, 6]), Step.at(3, 2, "cpu"), eng.cache, eng.ctx)


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=(f"{NAME}.dense_2_feat_out",)), f"'dense_2.weight' without the metadata key '{NAME}.dense_2_feat_out'"),
    (dict(drop_tensors=("dense_2.weight",), add_tensors={"dense_2.weight": np.zeros((64, 32))}),
     r"'dense_2.weight' has shape \(64, 32\), expected \(96, 32\)"),
    (dict(drop_tensors=("dense_2.weight",), drop_keys=(f"{NAME}.dense_2_feat_out",)),
     "'dense_3.weight' takes 96 values, but the pooled row has 32"),
    (dict(drop_tensors=("blk.5.attn_k_norm.weight",)), "blk.5.attn_k_norm.weight"),
    (dict(drop_tensors=("blk.0.post_ffw_norm.weight",)), "blk.0.post_ffw_norm.weight"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, match)


@pytest.mark.parametrize("key,value,vtype,match", [
    (f"{NAME}.dense_2_feat_in", 16, "UINT32", f"'{NAME}.dense_2_feat_in' is 16, expected the embedding_length 32"),
    (f"{NAME}.dense_3_feat_out", 16, "UINT32", f"'{NAME}.dense_3_feat_out' is 16, expected the embedding_length 32"),
    (f"{NAME}.attention.causal", True, "BOOL", f"{NAME}.attention.causal is True"),
    (f"{NAME}.final_logit_softcapping", 30.0, "FLOAT32", f"'{NAME}.final_logit_softcapping'"),
])
def test_bad_hyper_parameters_are_refused_by_name(tmp_path, key, value, vtype, match):
    import gguf

    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, dict(set_keys={key: (value, getattr(gguf.GGUFValueType, vtype))}), match)


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: an encoder's matrices all int8 (no int4 check), normalized vectors within
    cosine 0.999 of the pipeline's (measured >= 0.99944)."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    eng = Engine.load(PATH, ctx=128, progress=False, switches=Switches(cpu_quant=True))
    assert eng.cpu_quant_report["int8_only"] is True
    for ids, _, st in ref():
        got = np.asarray(eng.embed(ids), dtype=np.float64)
        want = st.astype(np.float64)
        assert float(got @ want) / np.linalg.norm(want) > 0.999
