"""jina-bert-v3 (jina-embeddings-v3: XLM-RoBERTa with rotary positions, embeddings only; minfer/models/jina_bert_v3.py)
on the fixture tests/data/arch/jina-bert-v3 (tools/gen_jina_v3_fixture.py: a tiny random transformers
JinaEmbeddingsV3Model written in jinaai's original checkpoint layout with 5 task LoRA adapters, converted by llama.cpp's
converter, which writes arch jina-bert-v3 with the base weights and splits the adapters into separate files; the
tiny Unigram vocab of tools/gen_xlmr_fixture.py; file pooling MEAN from a sentence-transformers Pooling module).

References, none of them minfer's: transformers' float32 last_hidden_state (jina-bert-v3.npz: `hidden_tanh_<i>` with
GELU's tanh form, which llama.cpp's graph computes, and `hidden_<i>` as released, erf GELU), llama.cpp's own pooled
embeddings, normalized and not, and its token ids (tests/data/embed/goldens-jina-v3.json.gz). minfer runs the base model
without an adapter (what transformers' port and llama.cpp without --lora compute)."""

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
NAME = "jina-bert-v3"
PATH = DATA / "arch" / f"{NAME}.gguf"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-jina-v3.json.gz").read_bytes()))
META = json.loads((DATA / "arch" / f"{NAME}.json").read_text(encoding="utf-8"))
TOL = 1e-5       # rel, vs transformers with the tanh GELU: the same formulas in float32 (measured <= 5.8e-7)
TOL_ERF = 1e-3   # rel, vs transformers as released (erf GELU; measured <= 3.1e-4)
TOL_LL = 2e-3    # rel, vs llama.cpp's vectors on an F32 copy (ggml's float16 GELU table; measured <= 4.9e-4)
_ENGINES: dict = {}


def engine(path: Path = PATH, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (str(path), tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path, ctx=128, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def ref(tanh: bool = True) -> list[tuple[list[int], np.ndarray]]:
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    n = len([k for k in z.files if k.startswith("ids_")])
    return [(z[f"ids_{i}"].tolist(), z[f"hidden_tanh_{i}" if tanh else f"hidden_{i}"]) for i in range(n)]


def rel(got, want) -> float:
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape
    return float(np.abs(got - want).max() / np.abs(want).max())


def hidden_miss(eng, tanh: bool = True) -> float:
    return max(rel(eng.embed(ids, pooling="none", normalize=-1), h) for ids, h in ref(tanh))


def test_the_file_as_llama_cpps_converter_writes_it():
    """arch jina-bert-v3 (from lora_adaptations in config.json), XLM-R's t5 vocab, no position table, the fused
    attn_qkv, rope base 20000 (rotary_emb_base), pooling MEAN, one token type; the 5 task adapters written to
    separate LoRA files (general.type adapter), none of their tensors in the model file."""
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(PATH)
    md = gf.metadata
    assert md["general.architecture"] == NAME and md["tokenizer.ggml.model"] == "t5"
    assert md[f"{NAME}.rope.freq_base"] == 20000.0 and md[f"{NAME}.pooling_type"] == 1
    assert md[f"{NAME}.attention.causal"] is False and md["tokenizer.ggml.token_type_count"] == 1
    assert md[f"{NAME}.context_length"] == 128              # max_position_embeddings 130 - (pad_token_id + 1)
    assert "position_embd.weight" not in gf.tensors and not any("lora" in n for n in gf.tensors)
    ad = META["adapters_written_by_converter"]
    assert [a["task"] for a in ad] == sorted(META["jinaai_config"]["lora_adaptations"])
    assert all(a["general.type"] == "adapter" and a["n_tensors"] > 0 for a in ad)
    m = engine().model
    c = m.cfg
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn, c.vocab) == (2, 64, 4, 4, 16, 96, 202)
    assert m.causal is False and m.paged_kv is False and c.rms_eps == pytest.approx(1e-5)
    assert c.pooling_type == 1 and m.rank_head is None and m.position_embd is None and m.type_row.shape == (64,)
    assert c.rope.style == "neox" and c.rope.theta == 20000.0 and c.rope.n_rot == 16
    assert all(b.attn_qkv is not None and b.attn_qkv_b is not None and b.ffn_gate is None and b.ffn_up_b is not None
               for b in m.blocks)
    assert len(m.qweights()) == 1 + 4 * len(m.blocks)


def test_hidden_rows_match_transformers():
    """5 texts (Latin, accents, CJK, Cyrillic) and 40 / 100 random ids: within TOL of transformers with the tanh GELU
    (llama.cpp's), TOL_ERF as released; the two references more than 10 x TOL apart."""
    eng = engine()
    assert hidden_miss(eng) < TOL
    assert hidden_miss(eng, tanh=False) < TOL_ERF
    assert max(rel(a[1], b[1]) for a, b in zip(ref(True), ref(False))) > 10 * TOL


def _causal(q, k, v, scale):
    T, H, Dh = q.shape
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True,
                                       scale=scale)
    return o.transpose(0, 1).reshape(T, H * Dh)


@pytest.mark.parametrize("what", ["causal", "rope_normal", "no_rope", "rope_base_10000", "no_token_type",
                                  "no_mlp_bias", "gelu_erf", "qkv_order"])
def test_each_rule_is_needed(monkeypatch, what):
    """Bidirectional attention (not causal), NEOX rope pairs (not NORM adjacent pairs), rope at all and with the
    file's base (not 10000), token type row 0 added, the MLP biases (bert.cpp's GELU branch adds them, unlike
    nomic-bert's), GELU's tanh form (llama.cpp's; the erf form is transformers' as released), the fused rows split q,
    k, v: with any one changed the hidden rows miss transformers' (tanh) by more than 10x the tolerance."""
    import minfer.models.nomic_bert as nb
    from minfer import ops

    eng = engine()
    m = eng.model
    assert hidden_miss(eng) < TOL
    if what == "causal":
        monkeypatch.setattr(nb, "bidirectional_attention", _causal)
    elif what == "rope_normal":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, style="normal")))
    elif what == "rope_base_10000":
        monkeypatch.setattr(m, "cfg", replace(m.cfg, rope=replace(m.cfg.rope, theta=10000.0)))
    elif what == "no_rope":
        monkeypatch.setattr(ops, "rope", lambda x, positions, cfg: x)
    elif what == "no_token_type":
        monkeypatch.setattr(m, "type_row", None)
    elif what == "no_mlp_bias":
        for b in m.blocks:
            monkeypatch.setattr(b, "ffn_up_b", None)
    elif what == "gelu_erf":
        def mlp(h, blk, ctx):
            u = ops.linear(h, blk.ffn_up, blk.ffn_up_b, ctx)
            return ops.linear(F.gelu(u.float()).to(h.dtype), blk.ffn_down, blk.ffn_down_b, ctx)
        monkeypatch.setattr(m, "mlp", mlp)
        assert hidden_miss(eng, tanh=False) < TOL          # exactly transformers as released
    else:
        orig = m.qkv
        monkeypatch.setattr(m, "qkv", lambda h, blk, ctx: (lambda q, k, v: (k, q, v))(*orig(h, blk, ctx)))
    miss = hidden_miss(eng)
    print(f"{what}: {miss:.3g}")
    assert miss > 10 * TOL


def test_positions_from_zero_and_offsets():
    """Rope positions are 0..T-1 (llama.cpp's inp_pos, transformers' arange); XLM-R's table numbering from
    pad_token_id + 1 would not matter here: rope's scores depend on position differences only, so a constant offset
    gives the same rows (within float error), while positions scaled by 2 do not."""
    eng = engine()
    m = eng.model
    orig = m.attention
    for f, same in ((lambda p: p + 2, True), (lambda p: 2 * p, False)):
        m.attention = lambda h, blk, ctx, positions=None, **kw: orig(h, blk, ctx, f(positions), **kw)
        try:
            miss = hidden_miss(eng)
        finally:
            del m.attention
        assert (miss < TOL) if same else (miss > 10 * TOL), miss


def test_bidirectional_first_row_sees_the_last_token():
    eng = engine()
    ids, h = ref()[5]
    other = ids[:-2] + [ids[-2] % 190 + 5, ids[-1]]
    a = np.asarray(eng.embed(ids, pooling="none", normalize=-1))
    b = np.asarray(eng.embed(other, pooling="none", normalize=-1))
    assert rel(a, h) < TOL and np.abs(a[0] - b[0]).max() > 1e-3


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none", "file"])
def test_pooled_vectors_match_llamacpp(pooling):
    """Engine.embed against llama.cpp's own vectors (an F32 copy of the file) for each pooling and the file's own
    (pooling=None: MEAN), not normalized (normalize=-1) and L2-normalized (the default, llama-cpp-python's
    normalize=True), within TOL_LL. The goldens' ids are what minfer's tokenizer gives the texts."""
    eng = engine()
    d = GOLDENS["fixtures"][NAME][pooling]
    assert d["pooling_type"] == {"none": 0, "mean": 1, "cls": 2, "last": 3, "file": 1}[pooling]
    assert len(d["inputs"]) == 5
    p = None if pooling == "file" else pooling
    worst = 0.0
    for inp in d["inputs"]:
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        worst = max(worst, rel(eng.embed(inp["text"], pooling=p, normalize=-1), inp["embedding"]),
                    rel(eng.embed(inp["text"], pooling=p), inp["embedding_normalized"]),
                    rel(eng.embed(inp["ids"], pooling=p, normalize=-1), inp["embedding"]))
    print(f"{pooling}: max rel miss vs llama.cpp {worst:.2e}")
    assert worst < TOL_LL


def test_poolings_are_told_apart():
    """cls is the first row, last the last row, mean their average, of llama.cpp's per-token rows; the three differ."""
    g = GOLDENS["fixtures"][NAME]
    rows = np.asarray(g["none"]["inputs"][1]["embedding"], dtype=np.float64)
    assert rel(g["cls"]["inputs"][1]["embedding"], rows[0]) < 1e-6
    assert rel(g["last"]["inputs"][1]["embedding"], rows[-1]) < 1e-6
    assert rel(g["mean"]["inputs"][1]["embedding"], rows.mean(0)) < 1e-5
    assert min(rel(g[a]["inputs"][1]["embedding"], g[b]["inputs"][1]["embedding"])
               for a, b in (("cls", "last"), ("cls", "mean"), ("mean", "last"))) > 0.05


def test_tokenizer_matches_llama_cpp():
    """llama.cpp's ids (add_special and parse_special on and off; `<mask>` LSTRIP for this arch), and transformers'
    ids of the reference's texts are llama.cpp's (so the hidden-row comparison runs what llama.cpp would run)."""
    tok = engine().tokenizer
    rows = GOLDENS["tokens"][NAME]
    assert len(rows) >= 12
    for r in rows:
        t = r["text"]
        assert tok.encode(t, parse_special=False) == r["special"], t
        assert tok.encode(t, parse_special=True) == r["special_parsed"], t
        assert tok.encode(t, add_bos=False, parse_special=False) == r["plain"], t
        assert tok.encode(t, add_bos=False, parse_special=True) == r["plain_parsed"], t
    for (ids, _), t, r in zip(ref(), META["texts"], rows):
        assert r["text"] == t and ids == r["special"]


def test_generation_is_refused_and_one_forward():
    eng = engine()
    msg = r"jina-bert-v3 is an encoder \(bidirectional attention, no lm head\): it only embeds"
    with pytest.raises(MinferError, match=msg):
        eng.logits([0, 50, 2])
    with pytest.raises(MinferError, match=msg):
        list(eng.generate([0, 50, 2], max_new_tokens=2))
    assert eng.model.hidden_sink is None
    chunked = engine(MINFER_PREFILL_CHUNK=3)      # an encoder's input is one forward whatever the prefill chunk
    assert chunked.prefill_chunk() == 3 and hidden_miss(chunked) < TOL


def test_separate_qkv_is_read(tmp_path):
    """create_tensor_qkv also takes attn_q / attn_k / attn_v with their biases: the fused rows split that way give
    the same hidden rows."""
    import gguf
    from gguf.quants import dequantize

    from models.test_arch_vs_transformers import rewrite

    r = gguf.GGUFReader(str(PATH))
    t = {x.name: dequantize(x.data, x.tensor_type).reshape([int(d) for d in reversed(x.shape)]) for x in r.tensors}
    drop, add = [], {}
    for i in range(2):
        for s in ("weight", "bias"):
            drop.append(f"blk.{i}.attn_qkv.{s}")
            for p, part in zip("qkv", np.split(t[f"blk.{i}.attn_qkv.{s}"], 3, axis=0)):
                add[f"blk.{i}.attn_{p}.{s}"] = part.astype(np.float32)
    p = rewrite(PATH, tmp_path / "split.gguf", drop_tensors=tuple(drop), add_tensors=add)
    eng = engine(p)
    assert all(b.attn_qkv is None and b.attn_q is not None and b.attn_k_b is not None for b in eng.model.blocks)
    assert hidden_miss(eng) < TOL


@pytest.mark.parametrize("kw,match", [
    (dict(add_tensors={"blk.0.attn_qkv.weight.lora_a": np.zeros((64, 4))}),
     "tensor 'blk.0.attn_qkv.weight.lora_a' is not part of a jina-bert-v3 model"),
    (dict(add_tensors={"blk.0.ffn_up.weight.lora_b": np.zeros((4, 96))}),
     "a LoRA tensor: the converter writes the task adapters as separate files; minfer runs the base model only"),
    (dict(add_tensors={"position_embd.weight": np.zeros((128, 64))}), "tensor 'position_embd.weight' is not part"),
    (dict(add_tensors={"blk.0.ffn_gate.weight": np.zeros((96, 64))}), "tensor 'blk.0.ffn_gate.weight' is not part"),
    (dict(add_tensors={"cls.weight": np.zeros((64, 64))}), "tensor 'cls.weight' is not part"),
    (dict(add_tensors={"blk.1.attn_norm_2.weight": np.zeros(64)}), "tensor 'blk.1.attn_norm_2.weight' is not part"),
    (dict(drop_tensors=("token_embd_norm.bias",)), "token_embd_norm.bias"),
    (dict(drop_tensors=("blk.1.layer_output_norm.bias",)), "blk.1.layer_output_norm.bias"),
    (dict(drop_keys=("tokenizer.ggml.token_type_count",)), "'tokenizer.ggml.token_type_count' is missing"),
    (dict(drop_keys=("jina-bert-v3.attention.layer_norm_epsilon",)), "jina-bert-v3.attention.layer_norm_epsilon"),
])
def test_bad_files_are_refused_by_name(tmp_path, kw, match):
    from models.arch_checks import assert_refused

    assert_refused(NAME, tmp_path, kw, match)


def test_an_adapter_file_is_refused(tmp_path):
    """A LoRA adapter GGUF (what the converter writes per task) is not a model: refused, naming its task."""
    import gguf

    from models.arch_checks import assert_refused

    S = gguf.GGUFValueType.STRING
    assert_refused(NAME, tmp_path, dict(set_keys={"general.type": ("adapter", S),
                                                  "adapter.lora.task_name": ("retrieval.query", S)}),
                   "general.type adapter, task 'retrieval.query'")


def test_the_default_int8_path(tmp_path, monkeypatch):
    """The CPU's default MINFER_CPU_QUANT=1: mean vectors within cosine 0.999 of transformers'."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    monkeypatch.setenv("MINFER_HOME", str(tmp_path / "home"))
    eng = Engine.load(PATH, ctx=128, progress=False, switches=Switches(cpu_quant=True))
    for ids, h in ref()[3:]:
        got = np.asarray(eng.embed(ids, pooling="mean"), dtype=np.float64)
        want = torch.from_numpy(h).double().mean(0).numpy()
        assert float(got @ want) / np.linalg.norm(want) > 0.999
