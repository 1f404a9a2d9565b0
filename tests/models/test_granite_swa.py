"""IBM Granite SWA, dense and MoE (minfer/models/granite_swa.py) on the CPU's float32 reference: the layout
read from the file, each rule of llama.cpp's graph needed (with one changed the logits miss transformers' by
more than 10x the tolerance), the experts' gate/up fused or apart, what the model cannot run refused by name.
The logits, greedy continuation, KV cache in pieces and paged cache are test_arch_vs_transformers' (names
"granite_swa", "granitemoe_swa"). Fixtures: tests/data/arch/granite{,moe}_swa.gguf (tools/gen_arch_fixtures.py:
transformers 5.25's GraniteSWAForCausalLM / GraniteMoeSWAForCausalLM converted by llama.cpp's
convert_hf_to_gguf.py; both write the arch granite_swa)."""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest
import torch

from minfer import ops
from minfer.errors import MinferError
from minfer.models.granite_swa import GraniteSwaModel
from models.arch_checks import assert_refused
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

U32, F32 = gguf.GGUFValueType.UINT32, gguf.GGUFValueType.FLOAT32


def miss(eng, name: str) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def miss_file(path, name: str) -> float:
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    return miss(Engine.load(path, ctx=64, progress=False, switches=reference_switches()), name)


def test_layout_read_from_the_file():
    m = engine("granite_swa").model
    hf = json.loads((DATA / "granite_swa.json").read_text())["config"]
    assert m.is_local == tuple(t == "sliding_attention" for t in hf["layer_types"]) == (False, True, True, False)
    assert m.use_rope == tuple(bool(t) for t in hf["layer_rope_theta"]) == (True, True, True, False)
    assert m.window == 8 and all(s.shape == (4,) for s in m.sinks) and m.moe == [None] * 4
    assert (m.embed_scale, m.residual_scale, m.logit_scale) == pytest.approx((1.5, 0.8, 1.5))
    assert m.q_scale == pytest.approx(0.3 * 4.0)
    e = engine("granitemoe_swa").model
    assert e.is_local == (False, True, True) and e.use_rope == (True,) * 3     # no rope_pattern: rope everywhere
    moe = e.moe[1]
    assert moe.up_exps is None and moe.gate_exps.shape == (8 * 64, 64)          # fused gate/up: 2 x 32 rows each
    assert moe.up_shexp.shape == (96, 64) and moe.down_shexp.shape == (64, 48) and moe.gate_shexp is None
    assert e.output is not e.token_embd


@pytest.mark.parametrize("name,what", [
    ("granite_swa", "no_sinks"), ("granite_swa", "no_window"), ("granite_swa", "rope_everywhere"),
    ("granite_swa", "window_everywhere"), ("granite_swa", "no_residual_scale"),
    ("granitemoe_swa", "no_sinks"), ("granitemoe_swa", "no_window"), ("granitemoe_swa", "no_shared"),
    ("granitemoe_swa", "shared_up_first"), ("granitemoe_swa", "experts_up_first"),
    ("granitemoe_swa", "no_weights_norm")])
def test_each_rule_is_needed(monkeypatch, name, what):
    eng = engine(name)
    m = eng.model
    assert miss(eng, name) < TOL
    if what == "no_sinks":
        monkeypatch.setattr(m, "sinks", [None] * len(m.sinks))
    elif what == "no_window":
        monkeypatch.setattr(m, "window", 0)
    elif what == "rope_everywhere":      # the NoPE layer rotated
        monkeypatch.setattr(m, "use_rope", (True,) * m.cfg.n_layers)
    elif what == "window_everywhere":
        monkeypatch.setattr(m, "is_local", (True,) * m.cfg.n_layers)
    elif what == "no_residual_scale":
        monkeypatch.setattr(m, "residual_scale", 1.0)
    elif what == "no_shared":
        for e in m.moe:
            monkeypatch.setattr(e, "up_shexp", None)
    elif what == "shared_up_first":      # the fused shared gate/up read as (up, gate)
        for e in m.moe:
            Fs = e.down_shexp.shape[1]
            d = e.up_shexp.dense
            monkeypatch.setattr(e.up_shexp, "dense", torch.cat([d[Fs:], d[:Fs]]))
    elif what == "experts_up_first":     # each expert's fused rows read as (up, gate)
        for e in m.moe:
            d = e.gate_exps.dense                                        # (E*2F, D), densified by Engine.load
            E, D = e.gate_inp.shape
            monkeypatch.setattr(e.gate_exps, "dense", d.view(E, 2, -1, D).flip(1).reshape(-1, D).contiguous())
    elif what == "no_weights_norm":
        real = ops.moe_ffn
        monkeypatch.setattr(ops, "moe_ffn", lambda h, r, g, u, d, k, norm, ctx=None, **kw: real(h, r, g, u, d, k, False,
                                                                                                ctx, **kw))
    assert miss(eng, name) > 10 * TOL, what


def test_experts_fused_or_apart_give_the_same_logits(tmp_path):
    """create_tensor_gate_up_exps takes ffn_gate_up_exps (E, 2F, D) or ffn_gate_exps + ffn_up_exps: the fused
    tensor split into the two (gate rows first) meets transformers' too."""
    rd = gguf.GGUFReader(str(DATA / "granitemoe_swa.gguf"))
    fused = {t.name: np.asarray(t.data, dtype=np.float32) for t in rd.tensors if t.name.endswith("ffn_gate_up_exps.weight")}
    add = {}
    for name, a in fused.items():                                 # (E, 2F, D) in numpy order
        F = a.shape[1] // 2
        add[name.replace("gate_up_exps", "gate_exps")] = a[:, :F]
        add[name.replace("gate_up_exps", "up_exps")] = a[:, F:]
    p = rewrite(DATA / "granitemoe_swa.gguf", tmp_path / "apart.gguf", drop_tensors=tuple(fused), add_tensors=add)
    m = load(p)
    assert m.moe[0].up_exps is not None
    assert miss_file(p, "granitemoe_swa") < TOL


def test_the_sink_is_an_extra_softmax_logit():
    """HF's sigmoid(lse - sink) output scale equals ops.attention's sink in the denominator (gpt-oss's)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(5, 4, 16), torch.randn(5, 2, 16), torch.randn(5, 2, 16)
    sinks = torch.randn(4)
    got = ops.attention(q, k, v, 0, sinks=sinks)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    s = torch.einsum("thd,jhd->htj", q, kk) / 4.0
    s = s.masked_fill(torch.triu(torch.ones(5, 5, dtype=torch.bool), 1), float("-inf"))
    o = torch.einsum("htj,jhd->thd", s.softmax(-1), vv)
    want = o * torch.sigmoid(torch.logsumexp(s, -1) - sinks[:, None]).T[..., None]
    assert torch.allclose(got, want, atol=1e-5)


@pytest.mark.parametrize("key", ["granite_swa.attention.sliding_window", "granite_swa.attention.sliding_window_pattern",
                                 "granite_swa.logit_scale"])
def test_missing_key_is_named(tmp_path, key):
    assert_refused("granite_swa", tmp_path, dict(drop_keys=(key,)), key)


@pytest.mark.parametrize("name,tensor", [("granite_swa", "blk.2.attn_sinks.weight"),
                                         ("granite_swa", "blk.1.ffn_gate.weight"),
                                         ("granitemoe_swa", "blk.1.ffn_gate_up_exps.weight"),
                                         ("granitemoe_swa", "blk.2.ffn_up_shexp.weight"),
                                         ("granitemoe_swa", "blk.0.ffn_gate_inp.weight")])
def test_missing_tensor_is_named(tmp_path, name, tensor):
    assert_refused(name, tmp_path, dict(drop_tensors=(tensor,)), tensor.replace("gate_up_exps", "gate_exps"))


@pytest.mark.parametrize("name,kw,match", [
    ("granite_swa", dict(set_keys={"granite_swa.attention.sliding_window_pattern": (4, U32)}),
     "sliding_window_pattern' is 4: expected one flag per layer"),
    ("granite_swa", dict(set_keys={"granite_swa.attention.sliding_window": (0, U32)}), "sliding_window' is 0"),
    ("granitemoe_swa", dict(set_keys={"granite_swa.expert_weights_scale": (2.5, F32)}), "expert_weights_scale"),
    ("granite_swa", dict(add_tensors={"blk.1.attn_output.bias": np.zeros(64)}), r"blk\.1\.attn_output\.bias"),
    ("granite_swa", dict(set_keys={"granite_swa.rope.dimension_count": (8, U32)}), "rope.dimension_count=8")])
def test_bad_input_is_named(tmp_path, name, kw, match):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", **kw)
    with pytest.raises(MinferError, match=match):
        load(p)


def test_short_rope_pattern_is_named(tmp_path):
    import gguf as g

    key = "granite_swa.attention.rope_pattern"
    w_src = tmp_path / "short.gguf"
    rd = g.GGUFReader(str(DATA / "granite_swa.gguf"))
    w = g.GGUFWriter(str(w_src), "granite_swa")
    for name, f in rd.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        contents = f.contents()[:2] if name == key else f.contents()
        w.add_key_value(name, contents, f.types[0], sub_type=f.types[-1] if f.types[0] == g.GGUFValueType.ARRAY
                        else None)
    for t in rd.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(MinferError, match="rope_pattern' has 2 entries"):
        load(w_src)


def test_absent_rope_pattern_rotates_every_layer(tmp_path):
    """Without attention.rope_pattern every layer rotates (llama.cpp's default): the NoPE fixture then misses."""
    p = rewrite(DATA / "granite_swa.gguf", tmp_path / "x.gguf", drop_keys=("granite_swa.attention.rope_pattern",))
    assert load(p).use_rope == (True,) * 4
    assert miss_file(p, "granite_swa") > 10 * TOL
    assert GraniteSwaModel.arch == "granite_swa"
