"""nomic-bert (Nomic BERT encoders, embeddings only: minfer/models/nomic_bert.py) on the fixture tests/data/arch/nomic-bert
(tools/gen_bert2_fixture.py: a tiny random transformers NomicBertModel, written as the released nomic-embed checkpoints
are and converted by llama.cpp's converter).

References, none of them minfer's: transformers' last_hidden_state (nomic-bert.npz `hidden_<i>`; SiLU is the same
formula in llama.cpp and HF, so `hidden_ll_<i>` is the same array), llama.cpp's own pooled embeddings and token ids
(tests/data/embed/goldens-bert2.json.gz). Here: the hidden rows against transformers, each rule shown needed, the vectors
against llama.cpp, generation refused, bad files refused by name, the tokenizer against llama.cpp."""

from __future__ import annotations

import gzip
import json
import os
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
NAME = "nomic-bert"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-bert2.json.gz").read_bytes()))
# float32 against float32: transformers measured <= 1.8e-6 (max abs / max |h|), llama.cpp's vectors <= 1.3e-6
TOL = 1e-5
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
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_{i}"], z[f"hidden_ll_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h, _ in ref())


def test_layout():
    m = engine().model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.context_length) == \
        (2, 32, 2, 2, 16, 64, 2048)
    assert (c.rope.style, c.rope.theta, c.rope.n_rot) == ("neox", 1000.0, 16)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-12) and c.pooling_type == -1
    assert m.type_row.shape == (32,) and m.position_embd is None
    assert all(b.attn_qkv is not None and b.attn_q is None for b in m.blocks)       # the converter's fused Wqkv
    assert len(m.qweights()) == 1 + 5 * len(m.blocks)      # qkv, output, up, gate, down


def test_hidden_rows_match_transformers():
    """Every input (3 texts, 40 and 100 random ids) within 1e-5 of transformers (measured <= 1.8e-6)."""
    for ids, h, h_ll in ref():
        assert np.array_equal(h, h_ll)      # nothing approximated differently in llama.cpp's graph
    assert hidden_miss(engine()) < TOL


def _causal(q, k, v, scale):
    T, H, Dh = q.shape
    o = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                         is_causal=True, scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "no_rope", "rope_normal", "rope_base_10000", "no_token_type",
                                  "gate_up_swapped", "gelu", "no_embd_norm_bias"])
def test_each_rule_is_needed(monkeypatch, what):
    """Bidirectional attention, rope (NEOX pairs, the file's base 1000), token type 0's row, silu on ffn_gate (not
    ffn_up), SiLU itself and the embedding norm's bias: with any one changed the hidden rows miss transformers' by
    more than 100x the tolerance (measured: causal 1.27, no rope 0.94, normal pairs 0.94, base 10000 0.78, no type
    row 1.67, gate/up swapped 1.41, GELU 0.28, no norm bias 0.78)."""
    import minfer.models.nomic_bert as nb
    from minfer.ops import reference

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "causal":
        monkeypatch.setattr(nb, "bidirectional_attention", _causal)
    elif what == "no_rope":
        monkeypatch.setattr(nb.ops, "rope", lambda x, positions, cfg: x)
    elif what in ("rope_normal", "rope_base_10000"):
        from dataclasses import replace

        r = m.cfg.rope
        r = replace(r, style="normal") if what == "rope_normal" else replace(r, theta=10000.0)
        monkeypatch.setattr(nb.ops, "rope", lambda x, positions, cfg: reference.rope(x, positions, r))
    elif what == "no_token_type":
        monkeypatch.setattr(m, "type_row", None)
    elif what == "gate_up_swapped":
        for b in m.blocks:
            g, u = b.ffn_gate, b.ffn_up
            monkeypatch.setattr(b, "ffn_gate", u)
            monkeypatch.setattr(b, "ffn_up", g)
    elif what == "gelu":
        monkeypatch.setattr(nb, "F", types.SimpleNamespace(silu=torch.nn.functional.gelu,
                                                           scaled_dot_product_attention=torch.nn.functional
                                                           .scaled_dot_product_attention))
    else:
        monkeypatch.setattr(m, "embd_norm_b", torch.zeros_like(m.embd_norm_b))
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 100 * TOL


def test_fused_and_separate_qkv_agree(tmp_path):
    """llama.cpp takes attn_q / attn_k / attn_v too (create_tensor_qkv): the fused matrix's rows split q, k, v in that
    order (build_qkv) give the same rows from a file written that way."""
    import gguf

    from models.test_arch_vs_transformers import rewrite

    r = gguf.GGUFReader(str(PATH))
    add, drop = {}, []
    for t in r.tensors:
        if t.name.endswith("attn_qkv.weight"):
            w = np.asarray(t.data).astype(np.float32).reshape(96, 32)
            p = t.name[:-len("attn_qkv.weight")]
            add.update({p + "attn_q.weight": w[:32], p + "attn_k.weight": w[32:64], p + "attn_v.weight": w[64:]})
            drop.append(t.name)
    path = rewrite(PATH, tmp_path / "sep.gguf", drop_tensors=tuple(drop), add_tensors=add)
    eng = engine(path)
    assert all(b.attn_qkv is None and b.attn_q is not None for b in eng.model.blocks)
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (goldens-bert2.json.gz, F32 copy of the file) within 1e-5 (measured
    <= 1.3e-6); the goldens' ids are what minfer's tokenizer gives the texts."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3}[pooling] and len(d["inputs"]) == 2
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        got = eng.embed(inp["text"], pooling=pooling, normalize=-1)
        assert rel(got, inp["embedding"]) < TOL, (pooling, inp["text"])


def test_the_files_pooling_is_read(tmp_path):
    """nomic-embed's files carry nomic-bert.pooling_type 1 (mean: the converter reads sentence-transformers'
    1_Pooling): with the key set, Engine.embed without a pooling gives llama.cpp's mean vectors."""
    import gguf

    from models.test_arch_vs_transformers import rewrite

    path = rewrite(PATH, tmp_path / "mean.gguf", set_keys={"nomic-bert.pooling_type": (1, gguf.GGUFValueType.UINT32)})
    eng = engine(path)
    assert eng.config.pooling_type == 1
    for inp in GOLDENS["fixtures"][NAME]["mean"]["inputs"]:
        assert rel(eng.embed(inp["text"], normalize=-1), inp["embedding"]) < TOL
    with pytest.raises(MinferError, match=r"nomic-bert\.pooling_type is absent"):
        engine().embed("hi")


def test_tokenizer_matches_llama_cpp():
    """llama.cpp's ids (add_special: [CLS] ... [SEP]; parse_special on and off; neither) of texts with accents, CJK,
    emoji, special-token texts, odd spaces; and the transformers reference's ids of its texts are llama.cpp's."""
    tok = engine().tokenizer
    rows = GOLDENS["tokens"][NAME]
    assert len(rows) >= 10
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
    texts = json.loads((DATA / "arch" / f"{NAME}.json").read_text())["texts"]
    for (ids, _, _), t, r in zip(ref(), texts, rows):
        assert r["text"] == t and ids == r["special"]


def test_generation_is_refused_and_one_forward(capsys, monkeypatch):
    """Engine.logits / generate and `minfer run` refused with bert's one-line message naming nomic-bert; an input goes
    through one forward whatever the prefill chunk; a step not at position 0 is refused."""
    from minfer.cli import main
    from minfer.models.base import Step

    eng = engine()
    msg = r"nomic-bert is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([2, 50, 3])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([2, 50, 3], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    chunked = engine(MINFER_PREFILL_CHUNK=3)
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL
    with pytest.raises(MinferError, match="one forward from position 0"):
        eng.model.forward(torch.tensor([5, 6]), Step.at(3, 2, "cpu"), eng.cache, eng.ctx)
    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    assert main(["run", "-m", str(PATH), "--device", "cpu", "hi"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [f"minfer: error: {PATH}: nomic-bert is an encoder (bidirectional attention, no lm "
                                "head): it only embeds; use `minfer embed`, Engine.embed or the server's /v1/embeddings"]


@pytest.mark.parametrize("kw,match", [
    (dict(drop_keys=("nomic-bert.attention.causal",)), "nomic-bert.attention.causal is absent"),
    (dict(drop_keys=("nomic-bert.attention.layer_norm_epsilon",)), "nomic-bert.attention.layer_norm_epsilon"),
    (dict(drop_keys=("tokenizer.ggml.token_type_count",)), "'tokenizer.ggml.token_type_count' is missing"),
    (dict(drop_tensors=("token_types.weight",), add_tensors={"token_types.weight": np.zeros((3, 32))}),
     r"'token_types.weight' has shape \(3, 32\), expected \(2, 32\)"),
    (dict(drop_tensors=("blk.1.attn_qkv.weight",), add_tensors={"blk.1.attn_qkv.weight": np.zeros((64, 32))}),
     "blk.1.attn_qkv.weight"),
    (dict(drop_tensors=("blk.0.ffn_gate.weight",)), "blk.0.ffn_gate.weight"),
    (dict(add_tensors={"blk.0.ffn_up.bias": np.zeros(64)}), "'blk.0.ffn_up.bias': llama.cpp's nomic-bert graph never"),
    (dict(drop_tensors=("token_embd_norm.bias",)), "token_embd_norm.bias"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, match)


@pytest.mark.parametrize("key,value,match", [
    ("nomic-bert.attention.head_count", 3, "embedding_length 32 is not divisible by head_count 3"),
    ("nomic-bert.rope.dimension_count", 15, "nomic-bert.rope.dimension_count=15: expected an even number"),
    ("nomic-bert.feed_forward_length", 0, "nomic-bert.feed_forward_length"),
])
def test_bad_hyper_parameters_are_refused_by_name(tmp_path, key, value, match):
    import gguf

    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, dict(set_keys={key: (value, gguf.GGUFValueType.UINT32)}), match)


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: an encoder's matrices all int8 (no int4 check), mean vectors within
    cosine 0.999 of transformers' (measured >= 0.99977)."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    eng = Engine.load(PATH, ctx=128, progress=False, switches=Switches(cpu_quant=True))
    assert eng.cpu_quant_report["int8_only"] is True
    for ids, h, _ in ref()[3:]:
        got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
        want = h.astype(np.float64).mean(0)
        assert float(got @ want) / np.linalg.norm(want) > 0.999
