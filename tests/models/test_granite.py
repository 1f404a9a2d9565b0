"""Granite (minfer/models/granite.py) beyond the shared transformers checks of
test_arch_vs_transformers.py (logits, greedy, the KV cache in pieces): each of the four
multipliers is needed to meet transformers' logits, an absent optional one is not applied
(llama.cpp's rule), and what the model does not run is refused by name. Fixture:
tests/data/arch/granite.gguf (tools/gen_arch_fixtures.py: transformers' GraniteForCausalLM,
converted by llama.cpp's convert_hf_to_gguf.py; multipliers 1.5 / 0.3 / 0.8 / 1.5)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
TOL = 1e-3


def rel_err(got, ref) -> float:
    return float((np.abs(got - ref).max(-1) / np.abs(ref).max(-1)).max())


def engine(path=DATA / "granite.gguf"):
    import os

    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    return Engine.load(path, ctx=64, progress=False, switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))


def rewrite(dst: Path, drop_keys=(), set_keys=None, add_tensors=None) -> Path:
    """A copy of the fixture without some keys, with some keys set (name -> (value, GGUFValueType)),
    and with extra float32 tensors (name -> array), written by the gguf package."""
    import gguf

    rd = gguf.GGUFReader(str(DATA / "granite.gguf"))
    w = gguf.GGUFWriter(str(dst), "granite")
    for name, f in rd.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop_keys or name in (set_keys or {}):
            continue
        vtype = f.types[0]
        w.add_key_value(name, f.contents(), vtype, sub_type=f.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None)
    for name, (value, vtype) in (set_keys or {}).items():
        w.add_key_value(name, value, vtype)
    for t in rd.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=tuple(int(x) for x in reversed(t.shape)),
                     raw_dtype=t.tensor_type)
    for name, arr in (add_tensors or {}).items():
        w.add_tensor(name, np.asarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def test_multipliers_read_from_the_file():
    m = engine().model
    assert (m.embed_scale, m.residual_scale, m.logit_scale) == pytest.approx((1.5, 0.8, 1.5))
    assert m.q_scale == pytest.approx(0.3 * math.sqrt(m.cfg.head_dim))


@pytest.mark.parametrize("what", ["embed_scale", "q_scale", "residual_scale", "logit_scale"])
def test_each_multiplier_is_needed(monkeypatch, what):
    """With any one multiplier left at 1 the logits miss transformers' by far: the fixture tests each."""
    r = np.load(DATA / "granite.npz")
    eng = engine()
    monkeypatch.setattr(eng.model, what, 1.0)
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 50 * TOL


def test_absent_optional_multiplier_is_not_applied(tmp_path):
    """Without granite.residual_scale the branches are added unscaled (llama.cpp granite.cpp:
    `if (hparams.f_residual_scale)`), which is not the fixture's model."""
    m = engine(rewrite(tmp_path / "x.gguf", drop_keys=("granite.residual_scale",))).model
    assert m.residual_scale == 1.0


def test_missing_logit_scale_is_named(tmp_path):
    with pytest.raises(MinferError, match=r"granite\.logit_scale"):
        engine(rewrite(tmp_path / "x.gguf", drop_keys=("granite.logit_scale",)))


def test_bias_tensor_is_refused_by_name(tmp_path):
    p = rewrite(tmp_path / "x.gguf", add_tensors={"blk.1.attn_output.bias": np.zeros(64)})
    with pytest.raises(MinferError, match=r"blk\.1\.attn_output\.bias"):
        engine(p)


def test_rope_switched_off_is_refused(tmp_path):
    import gguf

    p = rewrite(tmp_path / "x.gguf", set_keys={"granite.rope.scaling.finetuned": (False, gguf.GGUFValueType.BOOL)})
    with pytest.raises(MinferError, match=r"granite\.rope\.scaling\.finetuned"):
        engine(p)


def test_granitemoe_shared_expert_is_needed():
    """Without the shared expert (GraniteMoeShared) the logits miss transformers' by far; the
    routed experts' width is feed_forward_length (no expert_feed_forward_length in the file)."""
    import os

    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    r = np.load(DATA / "granitemoeshared.npz")
    eng = Engine.load(DATA / "granitemoeshared.gguf", ctx=64, progress=False,
                      switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"}))
    m = eng.model
    assert m.moe[0].gate_exps.n_experts == 8 and m.cfg.expert_ffn == 0 and m.expert_width(m.cfg) == 32
    assert m.moe[0].gate_shexp is not None
    for e in m.moe:
        e.gate_shexp = None
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 50 * TOL
