"""Granite (minfer/models/granite.py) beyond the shared transformers checks of
test_arch_vs_transformers.py (logits, greedy, the KV cache in pieces): each of the four
multipliers is needed to meet transformers' logits, an absent optional one is not applied
(llama.cpp's rule), and what the model does not run is refused by name. Fixture:
tests/data/arch/granite.gguf (tools/gen_arch_fixtures.py: transformers' GraniteForCausalLM,
converted by llama.cpp's convert_hf_to_gguf.py; multipliers 1.5 / 0.3 / 0.8 / 1.5)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

sys.path.insert(0, os.path.dirname(__file__))
from test_arch_vs_transformers import reference_switches, rel_err  # noqa: E402
from test_arch_vs_transformers import rewrite as rewrite_gguf  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
TOL = 1e-3


def engine(path=DATA / "granite.gguf"):
    from minfer.runtime.engine import Engine

    return Engine.load(path, ctx=64, progress=False, switches=reference_switches())


def rewrite(dst: Path, **kw) -> Path:
    """test_arch_vs_transformers.rewrite of the granite fixture."""
    return rewrite_gguf(DATA / "granite.gguf", dst, **kw)


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
    r = np.load(DATA / "granitemoeshared.npz")
    eng = engine(DATA / "granitemoeshared.gguf")
    m = eng.model
    assert m.moe[0].gate_exps.n_experts == 8 and m.cfg.expert_ffn == 0 and m.expert_width(m.cfg) == 32
    assert m.moe[0].gate_shexp is not None
    for e in m.moe:
        e.gate_shexp = None
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) > 50 * TOL
