"""eurobert (EuroBERT encoders, embeddings only: minfer/models/eurobert.py) on the fixture tests/data/arch/eurobert
(tools/gen_eurobert_fixture.py: a tiny random transformers EuroBertModel, 2 layers, 4 heads with 2 kv heads, converted
by llama.cpp's converter, its file pooling MEAN from a sentence-transformers Pooling module).

References, none of them minfer's: transformers' float32 last_hidden_state (eurobert.npz `hidden_<i>`: after the final
norm, the row llama.cpp pools), llama.cpp's own pooled embeddings, normalized and not, and its token ids
(tests/data/embed/goldens-eurobert.json.gz). Here: the hidden rows against transformers, each rule shown needed, the
vectors against llama.cpp for every pooling, the tokenizer against llama.cpp, generation refused, bad files refused by
name."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
NAME = "eurobert"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-eurobert.json.gz").read_bytes()))
TOL = 1e-5            # against transformers: the same formulas in float32 (measured <= 2.7e-6)
TOL_LLAMACPP = 1e-5   # against llama.cpp's vectors on an F32 copy: no table-driven op here (measured <= 2.4e-6)
_ENGINES: dict = {}


def engine(path: Path = PATH, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref() -> list[tuple[list[int], np.ndarray]]:
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h in ref())


def test_layout():
    m = engine().model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == (2, 64, 4, 2, 16, 96, 320)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-5)
    assert c.pooling_type == 1                                      # MEAN, from the Pooling module
    assert c.rope.style == "neox" and c.rope.theta == 250000.0 and c.rope.n_rot == 16
    assert all(b.attn_qkv is None and b.attn_q_b is None for b in m.blocks)
    assert len(m.qweights()) == 1 + 7 * len(m.blocks) and m.rank_head is None


def test_hidden_rows_match_transformers():
    """Every input (3 texts, 40 and 100 random ids): within 1e-5 of transformers' last_hidden_state."""
    assert hidden_miss(engine()) < TOL


def _causal(q, k, v, scale):
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                       scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


def _gqa_tiled(q, k, v, scale):     # q head h reading kv head h % Hkv instead of h // (H / Hkv)
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat(1, rep, 1), v.repeat(1, rep, 1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "rope_normal", "no_rope", "rope_base_10000", "gqa_tiled",
                                  "output_norm_weight", "gate_up_swapped"])
def test_each_rule_is_needed(monkeypatch, what):
    """Bidirectional attention (not causal), NEOX rope pairs (not llama's NORM adjacent pairs), rope at all and with
    the file's base, kv head h // (H / Hkv) for q head h (not h % Hkv), the output_norm weight, silu on W_gate (not on
    W_up): with any one changed the hidden rows miss transformers' by more than 10x the tolerance."""
    import minfer.models.eurobert as eb

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "causal":
        monkeypatch.setattr(eb, "bidirectional_attention", _causal)
    elif what == "gqa_tiled":
        monkeypatch.setattr(eb, "bidirectional_attention", _gqa_tiled)
    elif what == "rope_normal":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, style="normal")))
    elif what == "rope_base_10000":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, theta=10000.0)))
    elif what == "no_rope":
        monkeypatch.setattr(eb.ops, "rope", lambda x, positions, cfg: x)
    elif what == "output_norm_weight":
        monkeypatch.setattr(m, "output_norm", torch.ones_like(m.output_norm))
    else:
        for b in m.blocks:
            g, u = b.ffn_gate, b.ffn_up
            monkeypatch.setattr(b, "ffn_gate", u)
            monkeypatch.setattr(b, "ffn_up", g)
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 10 * TOL


def test_causal_would_change_every_row_but_the_last():
    """A bidirectional encoder's first row depends on the tokens after it: changing only the last token of an input
    moves row 0 of minfer's (as of transformers') hidden states."""
    eng = engine()
    ids, h = ref()[3]
    other = ids[:-2] + [ids[-2] % 300 + 7, ids[-1]]
    a = np.asarray(eng.embed(ids, pooling="none", normalize=-1))
    b = np.asarray(eng.embed(other, pooling="none", normalize=-1))
    assert rel(a, h) < TOL and np.abs(a[0] - b[0]).max() > 1e-3


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none", "file"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (an F32 copy of the file) for each pooling and the file's own
    (pooling=None: MEAN), not normalized (normalize=-1) and L2-normalized (the default, llama-cpp-python's
    normalize=True), within 1e-5. The goldens' ids are what minfer's tokenizer gives the texts."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3, "file": 1}[pooling]
    assert len(d["inputs"]) == 2
    p = None if pooling == "file" else pooling
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        assert rel(eng.embed(inp["text"], pooling=p, normalize=-1), inp["embedding"]) < TOL_LLAMACPP
        assert rel(eng.embed(inp["text"], pooling=p), inp["embedding_normalized"]) < TOL_LLAMACPP
        assert rel(eng.embed(inp["ids"], pooling=p, normalize=-1), inp["embedding"]) < TOL_LLAMACPP


def test_poolings_are_told_apart():
    """The goldens of each pooling differ (so the test above checks the rule, not one shared vector): cls is the
    first row, last the last row, mean their average, of llama.cpp's per-token rows."""
    g = GOLDENS["fixtures"][NAME]
    rows = np.asarray(g["none"]["inputs"][1]["embedding"], dtype=np.float64)
    assert rel(g["cls"]["inputs"][1]["embedding"], rows[0]) < 1e-6
    assert rel(g["last"]["inputs"][1]["embedding"], rows[-1]) < 1e-6
    assert rel(g["mean"]["inputs"][1]["embedding"], rows.mean(0)) < 1e-5
    assert min(rel(g[a]["inputs"][1]["embedding"], g[b]["inputs"][1]["embedding"])
               for a, b in (("cls", "last"), ("cls", "mean"), ("mean", "last"))) > 0.05


def test_tokenizer_matches_llama_cpp():
    """llama.cpp's ids of the byte-level BPE the converter writes (tokenizer.ggml.add_bos_token and add_eos_token
    true, from the HF post-processor <s> ... </s>): add_special with parse_special on and off, and neither; the
    transformers reference's ids of its texts too."""
    tok = engine().tokenizer
    rows = GOLDENS["tokens"][NAME]
    assert len(rows) >= 10
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    texts = json.loads((DATA / "arch" / f"{NAME}.json").read_text())["texts"]
    for (ids, _), t, r in zip(ref(), texts, rows):
        assert r["text"] == t and ids == r["special"]


def test_generation_is_refused_and_one_forward(capsys, monkeypatch):
    from minfer.cli import main

    eng = engine()
    msg = r"eurobert is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([1, 50, 2])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([1, 50, 2], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    chunked = engine(MINFER_PREFILL_CHUNK=3)      # an encoder's input is one forward whatever the prefill chunk
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL
    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    assert main(["run", "-m", str(PATH), "--device", "cpu", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"minfer: error: {PATH}: eurobert is an encoder (bidirectional attention, no lm "
                                "head): it only embeds; use `minfer embed`, Engine.embed or the server's /v1/embeddings"]


def test_fused_qkv_is_read(tmp_path):
    """create_tensor_qkv also takes a fused attn_qkv (rows q, k, v: build_qkv): the same weights fused give the same
    hidden rows."""
    import gguf
    from gguf.quants import dequantize

    from models.test_arch_vs_transformers import rewrite

    r = gguf.GGUFReader(str(PATH))
    t = {x.name: dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)]) for x in r.tensors}
    drop, add = [], {}
    for i in range(2):
        names = [f"blk.{i}.attn_{p}.weight" for p in "qkv"]
        drop += names
        add[f"blk.{i}.attn_qkv.weight"] = np.concatenate([t[n] for n in names], 0).astype(np.float32)
    p = rewrite(PATH, tmp_path / "fused.gguf", drop_tensors=tuple(drop), add_tensors=add)
    eng = engine(p)
    assert all(b.attn_qkv is not None and b.attn_q is None for b in eng.model.blocks)
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("eurobert.attention.layer_norm_rms_epsilon",)), "eurobert.attention.layer_norm_rms_epsilon"),
    (dict(drop_keys=("eurobert.attention.causal",)), "eurobert.attention.causal is absent"),
    (dict(add_tensors={"blk.1.attn_output.bias": np.zeros(64)}), "tensor 'blk.1.attn_output.bias' is not part of a "
                                                                 "eurobert model"),
    (dict(add_tensors={"blk.0.ffn_up.bias": np.zeros(96)}), "tensor 'blk.0.ffn_up.bias' is not part"),
    (dict(add_tensors={"output.weight": np.zeros((320, 64))}), "tensor 'output.weight' is not part"),
    (dict(add_tensors={"cls.output.weight": np.zeros((1, 64))}), "tensor 'cls.output.weight' is not part"),
    (dict(drop_tensors=("output_norm.weight",)), "output_norm.weight"),
    (dict(drop_tensors=("blk.1.ffn_gate.weight",)), "blk.1.ffn_gate.weight"),
    (dict(drop_tensors=("blk.0.attn_k.weight",), add_tensors={"blk.0.attn_k.weight": np.zeros((64, 64))}),
     "blk.0.attn_k.weight"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, match)


def test_bad_hyper_parameters_are_refused_by_name(tmp_path):
    import gguf

    from models.arch_checks import assert_refused

    U = gguf.GGUFValueType.UINT32
    assert_refused(NAME, tmp_path, dict(set_keys={"eurobert.attention.head_count_kv": (3, U)}),
                   "'eurobert.attention.head_count_kv' = 3: expected a divisor of head_count")   # config.py
    assert_refused(NAME, tmp_path, dict(set_keys={"eurobert.attention.value_length": (8, U)}),
                   "eurobert.attention.value_length 8 != key_length 16")
    assert_refused(NAME, tmp_path, dict(set_keys={"eurobert.attention.key_length": (8, U)}),
                   "eurobert needs head_count")
    assert_refused(NAME, tmp_path, dict(set_keys={"eurobert.attention.key_length": (8, U)}), "got 4 x 8 != 64")


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: mean vectors within cosine 0.999 of transformers'."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    eng = Engine.load(PATH, ctx=128, progress=False, switches=Switches(cpu_quant=True))
    for ids, h in ref()[3:]:
        got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
        want = h.astype(np.float64).mean(0)
        assert float(got @ want) / np.linalg.norm(want) > 0.999
