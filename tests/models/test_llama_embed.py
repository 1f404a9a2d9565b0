"""llama-embed (bidirectional Llama embedding models, llama-embed-nemotron-8b: minfer/models/llama_embed.py) on the
fixture tests/data/arch/llama-embed (tools/gen_llama_embed_fixture.py: a tiny random transformers LlamaModel saved as
LlamaBidirectionalModel with is_causal false, 2 layers, 4 heads with 2 kv heads, llama3 rope scaling, converted by
llama.cpp's converter: attention.causal false, rope_freqs.weight, no pooling_type).

References, none of them minfer's: transformers' float32 last_hidden_state with is_causal False (llama-embed.npz
`hidden_<i>`; `causal_<i>` the same model run causally), llama.cpp's own pooled embeddings, normalized and not, its
per-token rows of a copy without attention.causal, and its token ids (tests/data/embed/goldens-llama-embed.json.gz)."""

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
NAME = "llama-embed"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-llama-embed.json.gz").read_bytes()))
TOL = 1e-5            # against transformers: the same formulas in float32 (measured <= 1.6e-6)
TOL_LLAMACPP = 1e-5   # against llama.cpp's vectors (F32 copy; goldens rounded to 7 digits; measured <= 2.1e-6)
_ENGINES: dict = {}


def engine(path: Path = PATH, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref(kind: str = "hidden") -> list[tuple[list[int], np.ndarray]]:
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"{kind}_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng, kind: str = "hidden") -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h in ref(kind))


def test_layout():
    m = engine().model
    c = m.cfg
    assert type(m).__name__ == "LlamaEmbedModel" and c.arch == NAME
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == (2, 64, 4, 2, 16, 96, 320)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-5)
    assert c.pooling_type == -1                                     # the converter writes none for llama-embed
    assert c.rope.style == "normal" and c.rope.theta == 500000.0 and c.rope.n_rot == 16
    assert c.rope.freq_factors is not None and len(c.rope.freq_factors) == 8 and max(c.rope.freq_factors) == 8.0
    assert all(b.attn_qkv is None and b.attn_q_b is None for b in m.blocks)
    assert len(m.qweights()) == 1 + 7 * len(m.blocks) and m.rank_head is None


def test_hidden_rows_match_transformers_bidirectional():
    """Every input (3 texts, 40 and 100 random ids): within 1e-5 of transformers' is_causal=False last_hidden_state
    (the generator checked it equal to an all-zeros 4-D mask run)."""
    assert hidden_miss(engine()) < TOL


def _causal(q, k, v, scale):
    T, H, Dh = q.shape
    rep = H // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                       scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "rope_neox", "no_rope_freqs", "no_rope", "rope_base_10000",
                                  "output_norm_weight"])
def test_each_rule_is_needed(monkeypatch, what):
    """Bidirectional attention (not causal), NORM rope pairs (llama's, on the converter's permuted q/k; not NEOX), the
    llama3 rope_freqs divisors, rope at all and with the file's base, the output_norm weight: with any one changed
    the hidden rows miss transformers' by more than 10x the tolerance."""
    import minfer.models.eurobert as eb

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "causal":
        monkeypatch.setattr(eb, "bidirectional_attention", _causal)
    elif what == "rope_neox":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, style="neox")))
    elif what == "no_rope_freqs":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, freq_factors=None)))
    elif what == "rope_base_10000":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, theta=10000.0)))
    elif what == "no_rope":
        monkeypatch.setattr(eb.ops, "rope", lambda x, positions, cfg: x)
    else:
        monkeypatch.setattr(m, "output_norm", torch.ones_like(m.output_norm))
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 10 * TOL


def test_causal_is_the_only_difference_from_the_causal_reference(monkeypatch):
    """The same forward with a causal mask gives transformers' causal rows (llama-embed.npz causal_<i>) within 1e-5:
    the bidirectional mask is the one rule that separates llama-embed from llama here."""
    import minfer.models.eurobert as eb

    eng = engine()
    assert hidden_miss(eng, "causal") > 0.1
    monkeypatch.setattr(eb, "bidirectional_attention", _causal)
    assert hidden_miss(eng, "causal") < TOL


def test_llamacpp_runs_a_file_without_the_causal_key_causally(tmp_path):
    """llama.cpp's rows of a copy without llama-embed.attention.causal (hparams.causal_attn defaults to true) are
    transformers' CAUSAL rows, not the bidirectional ones; minfer refuses such a file by name instead of choosing."""
    from models.arch_checks import assert_refused

    g = GOLDENS["fixtures"][NAME]["absent_causal_key"]
    assert g["pooling_type"] == 0
    for inp, (ids, causal), (_, bidir) in zip(g["inputs"], ref("causal"), ref()):
        assert inp["ids"] == ids
        assert rel(inp["embedding"], causal) < TOL_LLAMACPP and rel(inp["embedding"], bidir) > 0.1
    assert_refused(NAME, tmp_path, dict(drop_keys=(f"{NAME}.attention.causal",)),
                   f"{NAME}.attention.causal is absent")


def test_rows_depend_on_later_tokens():
    eng = engine()
    ids, h = ref()[3]
    other = ids[:-2] + [ids[-2] % 300 + 7, ids[-1]]
    a = np.asarray(eng.embed(ids, pooling="none", normalize=-1))
    b = np.asarray(eng.embed(other, pooling="none", normalize=-1))
    assert rel(a, h) < TOL and np.abs(a[0] - b[0]).max() > 1e-3


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (an F32 copy of the file) for each pooling, not normalized
    (normalize=-1) and L2-normalized (the default), within 1e-5; ids are minfer's tokenizer's as llama.cpp's."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3}[pooling]
    assert len(d["inputs"]) == 2
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        assert rel(eng.embed(inp["text"], pooling=pooling, normalize=-1), inp["embedding"]) < TOL_LLAMACPP
        assert rel(eng.embed(inp["text"], pooling=pooling), inp["embedding_normalized"]) < TOL_LLAMACPP
        assert rel(eng.embed(inp["ids"], pooling=pooling, normalize=-1), inp["embedding"]) < TOL_LLAMACPP


def test_the_files_pooling():
    """The file has no pooling_type: llama.cpp then pools NONE (its `file` vectors are its per-token rows); minfer
    asks the caller to name a pooling rather than guess (runtime/embed.py pooling_of)."""
    g = GOLDENS["fixtures"][NAME]
    assert g["file"]["pooling_type"] == 0
    for a, b in zip(g["file"]["inputs"], g["none"]["inputs"]):
        assert a["embedding"] == b["embedding"]
    with pytest.raises(MinferError, match="the file names no pooling"):
        engine().embed("Hello world")


def test_poolings_are_told_apart():
    g = GOLDENS["fixtures"][NAME]
    rows = np.asarray(g["none"]["inputs"][1]["embedding"], dtype=np.float64)
    assert rel(g["cls"]["inputs"][1]["embedding"], rows[0]) < 1e-6
    assert rel(g["last"]["inputs"][1]["embedding"], rows[-1]) < 1e-6
    assert rel(g["mean"]["inputs"][1]["embedding"], rows.mean(0)) < 1e-5
    assert min(rel(g[a]["inputs"][1]["embedding"], g[b]["inputs"][1]["embedding"])
               for a, b in (("cls", "last"), ("cls", "mean"), ("mean", "last"))) > 0.05


def test_tokenizer_matches_llama_cpp():
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


def test_generation_is_refused_and_one_forward():
    eng = engine()
    msg = r"llama-embed is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([1, 50, 2])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([1, 50, 2], max_new_tokens=2))
    chunked = engine(MINFER_PREFILL_CHUNK=3)      # the whole input is one forward whatever the prefill chunk
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL


def test_fused_qkv_and_an_unused_lm_head_are_read(tmp_path):
    """create_tensor_qkv also takes a fused attn_qkv (rows q, k, v); llama's loader takes an optional output.weight
    that the embed graph never reads: the same hidden rows either way."""
    import gguf
    from gguf.quants import dequantize

    from models.test_arch_vs_transformers import rewrite

    r = gguf.GGUFReader(str(PATH))
    t = {x.name: dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)]) for x in r.tensors}
    drop, add = [], {"output.weight": np.ones((320, 64), dtype=np.float32)}
    for i in range(2):
        names = [f"blk.{i}.attn_{p}.weight" for p in "qkv"]
        drop += names
        add[f"blk.{i}.attn_qkv.weight"] = np.concatenate([t[n] for n in names], 0).astype(np.float32)
    p = rewrite(PATH, tmp_path / "fused.gguf", drop_tensors=tuple(drop), add_tensors=add)
    eng = engine(p)
    assert all(b.attn_qkv is not None and b.attn_q is None for b in eng.model.blocks)
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("llama-embed.attention.layer_norm_rms_epsilon",)), "llama-embed.attention.layer_norm_rms_epsilon"),
    (dict(add_tensors={"blk.1.attn_output.bias": np.zeros(64)}), "tensor 'blk.1.attn_output.bias' is not run"),
    (dict(add_tensors={"blk.0.ffn_up.bias": np.zeros(96)}), "tensor 'blk.0.ffn_up.bias' is not run"),
    (dict(add_tensors={"blk.0.ffn_gate_inp.weight": np.zeros((4, 64))}), "tensor 'blk.0.ffn_gate_inp.weight'"),
    (dict(drop_tensors=("output_norm.weight",)), "output_norm.weight"),
    (dict(drop_tensors=("blk.1.ffn_gate.weight",)), "blk.1.ffn_gate.weight"),
    (dict(drop_tensors=("rope_freqs.weight",), add_tensors={"rope_freqs.weight": np.ones(4)}), "rope_freqs.weight"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, match)


def test_bad_hyper_parameters_are_refused_by_name(tmp_path):
    import gguf

    from models.arch_checks import assert_refused

    U, B = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.BOOL
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.attention.causal": (True, B)}),
                   "llama-embed.attention.causal is True")
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.rope.dimension_count": (8, U)}),
                   "'rope_freqs.weight' has 8 values, expected n_rot/2 = 4")                        # config.py
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.rope.dimension_count": (8, U)},
                                        drop_tensors=("rope_freqs.weight",)), "8 != head size 16")
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.attention.value_length": (8, U)}),
                   "llama-embed.attention.value_length 8 != key_length 16")
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.attention.key_length": (8, U),
                                                  "llama-embed.attention.value_length": (8, U),
                                                  "llama-embed.rope.dimension_count": (8, U)},
                                        drop_tensors=("rope_freqs.weight",)), "got 4 x 8 != 64")
    assert_refused(NAME, tmp_path, dict(set_keys={"llama-embed.attention.head_count_kv": (3, U)}),
                   "'llama-embed.attention.head_count_kv' = 3: expected a divisor of head_count")


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
