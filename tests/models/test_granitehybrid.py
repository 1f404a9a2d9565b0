"""granitehybrid (IBM Granite 4.0 H): each rule of the Mamba-2 layers is needed to meet
transformers' logits, the chunked scan is the recurrence, the recurrent state in the cache (its
rings, the engine's prefix rule, the preflight's bytes), and malformed files refused by name.

The fixtures (tests/data/arch/granitehybrid*.gguf, tools/gen_arch_fixtures.py): 4 layers, Mamba-2 on
0, 2, 3 (MoE fixture: 2 groups) or 0, 1, 3 (dense fixture: 1 group), 8 heads of 16, state 16, conv of
4 taps. Logits, greedy and the cache in pieces: tests/models/test_arch_vs_transformers.py.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite


def miss(eng, name="granitehybrid") -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layer_kinds_and_cache_geometry():
    eng = engine("granitehybrid")
    m = eng.model
    assert m.is_ssm == (True, False, True, True)
    assert engine("granitehybrid-dense").model.is_ssm == (True, True, False, True)
    d = m.dims
    assert (d.d_inner, d.d_state, d.n_heads, d.n_groups, d.d_conv, d.head_dim) == (128, 16, 8, 2, 4, 16)
    assert m.cfg.kv_layers == (None, (2, 16, 16), None, None)
    assert m.cfg.state_layers[1] is None
    assert m.cfg.state_layers[0] == ((4, 192), (2, 8, 16, 16))     # conv ring (K, di + 2GN), SSM ring (2, H, P, N)
    assert (m.q_scale, m.embed_scale, m.residual_scale, m.logit_scale) == pytest.approx(
        (0.3 * 4, 1.5, 0.8, 1.5))
    assert m.paged_kv and m.recurrent


def test_preflight_counts_rows_and_state():
    """The preflight's bytes are what the cache allocates: 2 * 2 * 16 float32 per position (the one
    attention layer) plus, once, 3 layers' state ((4 * 192 + 2 * 8 * 16 * 16) float32)."""
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache

    gf = GGUFFile(DATA / "granitehybrid.gguf")
    cfg = preflight.cache_config(gf)
    per, fixed = preflight.kv_bytes_per_token(cfg, "cpu"), preflight.state_bytes(cfg)
    assert per == 2 * 2 * 16 * 4
    assert fixed == 3 * (4 * 192 + 2 * 8 * 16 * 16) * 4
    assert KVCache.for_config(cfg, 100).nbytes() == 100 * per + fixed
    assert engine("granitehybrid", ctx=100).cache.nbytes() == 100 * per + fixed


def test_preflight_refuses_when_state_does_not_fit(monkeypatch):
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(DATA / "granitehybrid.gguf")
    need = 100 * 256 + 3 * 4864 * 4
    monkeypatch.setattr(preflight, "available_bytes", lambda device: need)
    assert preflight.check_ctx(gf, 100, "cpu", print) == 100
    monkeypatch.setattr(preflight, "available_bytes", lambda device: need - 1)
    with pytest.raises(MinferError, match="use -c 99 or less"):
        preflight.check_ctx(gf, 100, "cpu", print)


# ---- each rule is needed --------------------------------------------------------------------

def _perturb(monkeypatch, m, what: str) -> None:
    import torch.nn.functional as F

    from minfer.models import mamba2

    layers = [w for w in m.mamba if w is not None]
    if what == "conv_window":          # only the current row's tap: no causal window
        real = mamba2.causal_conv

        def last_tap(xbc, w, ring, positions):
            real(xbc, w, ring, positions)
            out = xbc * w.conv_w[-1]
            return F.silu(out + w.conv_b if w.conv_b is not None else out)
        monkeypatch.setattr(mamba2, "causal_conv", last_tap)
    elif what == "conv_bias":
        for w in layers:
            w.conv_b = None
    elif what == "D_skip":
        for w in layers:
            w.D = torch.zeros_like(w.D)
    elif what == "dt_bias":
        for w in layers:
            w.dt_bias = torch.zeros_like(w.dt_bias)
    elif what == "A_sign":             # A read as stored with the other sign: the state grows
        for w in layers:
            w.A = -w.A
    elif what == "A_as_A_log":         # the converter's -exp(A_log) applied a second time
        for w in layers:
            w.A = -torch.exp(w.A)
    elif what == "gate":
        monkeypatch.setattr(mamba2, "gated_group_norm", lambda y, z, wt, g, eps: _norm(y, wt, g, eps))
    elif what == "gate_after_norm":    # HF's norm_before_gate=True reading: norm, then the gate
        monkeypatch.setattr(mamba2, "gated_group_norm",
                            lambda y, z, wt, g, eps: _norm(y, wt, g, eps) * F.silu(z))
    elif what == "whole_norm":         # one RMS over all channels instead of per group
        real = mamba2.gated_group_norm
        monkeypatch.setattr(mamba2, "gated_group_norm", lambda y, z, wt, g, eps: real(y, z, wt, 1, eps))
    elif what == "groups_interleaved":  # head h reading group h % G instead of h // (H / G)
        def interleaved(x, dt_raw, B, C, w):
            H, G = x.shape[1], B.shape[1]
            return F.softplus(dt_raw + w.dt_bias), B.repeat(1, H // G, 1), C.repeat(1, H // G, 1)
        monkeypatch.setattr(mamba2, "_discretize", interleaved)
    elif what == "mamba_residual_scale":   # the Mamba-2 branch added without Granite's residual scale
        real = m._attention
        monkeypatch.setattr(m, "_attention", lambda h, blk, i, *a: real(h, blk, i, *a) / m.residual_scale
                            if m.is_ssm[i] else real(h, blk, i, *a))
    else:
        raise AssertionError(what)


def _norm(y, wt, g, eps):
    T, di = y.shape
    v = y.view(T, g, di // g)
    return (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)).reshape(T, di) * wt


RULES = ["conv_window", "conv_bias", "D_skip", "dt_bias", "A_sign", "A_as_A_log", "gate", "gate_after_norm",
         "whole_norm", "groups_interleaved", "mamba_residual_scale"]


@pytest.mark.parametrize("what", RULES)
def test_each_mamba2_rule_is_needed(monkeypatch, what):
    """With any one rule changed the MoE fixture (2 groups) misses transformers' logits by far (or
    goes non-finite: A > 0 makes the state grow as exp(dt |A|) per position)."""
    eng = engine("granitehybrid")
    assert miss(eng) < TOL
    _perturb(monkeypatch, eng.model, what)
    eng.reset()
    err = miss(eng)
    assert not err < 10 * TOL, (what, err)


# ---- the scan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_scan_is_the_recurrence(chunk):
    """scan_chunked (the prefill's SSD form) against the step-by-step recurrence, 150 positions from
    a carried state (start 37: the state after position 36 in ring slot 0), outputs and final state."""
    from minfer.models import mamba2

    g = torch.Generator().manual_seed(0)
    T, H, P, G, N = 150, 8, 16, 2, 16
    x, dt = torch.randn(T, H, P, generator=g), torch.randn(T, H, generator=g)
    B, C = torch.randn(T, G, N, generator=g), torch.randn(T, G, N, generator=g)
    w = mamba2.Mamba2Weights(None, None, None, torch.randn(H, generator=g), -torch.rand(H, generator=g) * 3,
                             None, None, None)
    ring = torch.zeros(2, H, P, N)
    ring[0] = torch.randn(H, P, N, generator=g)
    pos = torch.arange(37, 37 + T)
    r1, r2 = ring.clone(), ring.clone()
    want = mamba2.scan_sequential(x, dt, B, C, w, r1, pos)
    got = mamba2.scan_chunked(x, dt, B, C, w, r2, pos, chunk=chunk)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    assert float((r2[0] - r1[0]).abs().max() / r1[0].abs().max()) < 1e-5     # the state after 186
    assert torch.equal(r2[1], ring[1])                                          # slot 1 untouched


def test_prefill_across_chunks_equals_decode_steps():
    """70 tokens in one prefill (two chunks of the scan) against the same tokens one position at a
    time (the T = 1 steps): every position's logits agree to float32 rounding (3.7e-5 here; the
    state dropped or misplaced at the chunk boundary misses by far)."""
    from minfer.models import mamba2

    ids = (torch.arange(70) * 37 % 300 + 3).tolist()
    whole = engine("granitehybrid", ctx=80).logits(ids).numpy()
    eng = engine("granitehybrid", ctx=80)
    steps = np.concatenate([eng.forward([t], i).numpy() for i, t in enumerate(ids)])
    assert rel_err(steps, whole) < 1e-4
    real = mamba2.scan_chunked

    def no_carry(x, dt, B, C, w, ring, positions, chunk=mamba2.CHUNK):   # each chunk from a zero state
        return torch.cat([real(x[c:c + chunk], dt[c:c + chunk], B[c:c + chunk], C[c:c + chunk], w, ring,
                               positions[c:c + chunk] * 0, chunk) for c in range(0, x.shape[0], chunk)])
    mamba2.scan_chunked = no_carry
    try:
        broken = engine("granitehybrid", ctx=80).logits(ids).numpy()
    finally:
        mamba2.scan_chunked = real
    assert rel_err(broken, whole) > 10 * TOL


def test_a_step_repeated_at_its_position_is_harmless():
    """The rings are indexed by position: a step run again at the same position (the decode graph's
    warm-up runs; a token computed ahead on the device, then dropped, and the position computed
    again with another token) reads what it read the first time."""
    from minfer.models import Step

    r = ref("granitehybrid")
    ids = r["ids"].tolist()
    eng = engine("granitehybrid")
    m, cache = eng.model, eng.cache
    m.forward(torch.tensor(ids[:20]), Step.at(0, 20, "cpu"), cache)
    a = m.forward(torch.tensor([ids[20]]), Step(torch.tensor([20]), None, "all"), cache)   # host-free step
    b = m.forward(torch.tensor([ids[20]]), Step(torch.tensor([20]), None, "all"), cache)   # the same again
    assert torch.equal(a, b)
    m.forward(torch.tensor([5]), Step.at(21, 1, "cpu"), cache)         # a token ahead, then dropped
    c = m.forward(torch.tensor([ids[21]]), Step.at(21, 1, "cpu"), cache)
    d = m.forward(torch.tensor([ids[22]]), Step.at(22, 1, "cpu"), cache)
    assert rel_err(torch.cat([a, c, d]).numpy(), r["logits"][20:23]) < TOL


# ---- the engine's rule: a cached prefix is reused whole or not at all ---------------------------

def _starts(monkeypatch, eng) -> list:
    seen, real = [], eng.model.forward
    monkeypatch.setattr(eng.model, "forward", lambda tokens, step, cache, ctx=None:
                        seen.append((step.start, len(tokens))) or real(tokens, step, cache, ctx))
    return seen


def test_prefix_reused_only_whole(monkeypatch):
    r = ref("granitehybrid")
    ids = r["ids"].tolist()
    eng = engine("granitehybrid")
    seen = _starts(monkeypatch, eng)
    eng.prefill(ids[:20])
    last = eng.prefill(ids[:30])                         # the cached 20 begin the prompt: 10 more computed
    assert seen[-1] == (20, 10)
    assert rel_err(last[None].numpy(), r["logits"][29:30]) < TOL
    other = ids[:25] + [7, 8, 9]                         # diverges inside the cached 30: from 0
    last = eng.prefill(other)
    assert seen[-1] == (0, 28)
    fresh = engine("granitehybrid").logits(other)[-1]
    assert rel_err(last[None].numpy(), fresh[None].numpy()) < 1e-6


def test_without_the_rule_a_shorter_prefix_is_wrong(monkeypatch):
    """The rule is needed: reusing the first 25 of 30 cached tokens would continue from the state
    after position 29."""
    ids = ref("granitehybrid")["ids"].tolist()
    other = ids[:25] + [7, 8, 9]
    eng = engine("granitehybrid")
    eng.prefill(ids[:30])
    monkeypatch.setattr(eng.model, "recurrent", False)
    wrong = eng.prefill(other)
    fresh = engine("granitehybrid").logits(other)[-1]
    assert rel_err(wrong[None].numpy(), fresh[None].numpy()) > 10 * TOL


def test_forward_inside_the_cached_tokens_is_refused():
    ids = ref("granitehybrid")["ids"].tolist()
    eng = engine("granitehybrid")
    eng.forward(ids[:10], 0)
    with pytest.raises(MinferError, match="inside the 10 cached tokens.*cannot be rewound"):
        eng.forward(ids[5:8], 5)
    eng.forward(ids[10:12], 10)                          # the end: fine
    assert len(eng.logits(ids[:3])) == 3                 # position 0: starts again


def test_batch_engine_serves_it():
    """paged_kv = True: BatchEngine.from_engine (what `minfer serve -np N` builds) runs two prompts at
    once with per-sequence state slots (runtime/paged_state.py; tests/runtime/test_paged_recurrent.py
    has the chunked, held, preempted and reused-slot cases), each equal to its single greedy; a cache
    without recurrent_state handed to the model is a MinferError, not a silently stateless run."""
    from minfer.models import Step
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    eng = engine("granitehybrid")
    ids = ref("granitehybrid")["ids"].tolist()
    g = SamplingParams(temperature=0)
    be = BatchEngine.from_engine(eng, max_seqs=2)
    assert be.cache.states is not None and not be.blocks.prefix_cache
    outs = be.generate_many([ids[:20], ids[3:14]], g, 6)
    for p, out in zip([ids[:20], ids[3:14]], outs):
        assert [ev.token_id for ev in out] == [ev.token_id for ev in eng.generate(p, g, max_new_tokens=6)]

    class NoState:        # a cache with the attention calls only (runtime/paged_kv.py's PagedKVCache)
        pass
    with pytest.raises(MinferError, match="keeps their recurrent state.*NoState keeps none"):
        eng.model.forward(torch.tensor([3, 4]), Step.at(0, 2, "cpu"), NoState())


# ---- malformed files: one MinferError naming the key or tensor --------------------------------

@pytest.mark.parametrize("key", ["granitehybrid.ssm.conv_kernel", "granitehybrid.ssm.inner_size",
                                 "granitehybrid.ssm.state_size", "granitehybrid.ssm.time_step_rank",
                                 "granitehybrid.ssm.group_count"])
def test_missing_ssm_key_is_named(tmp_path, key):
    p = rewrite(DATA / "granitehybrid.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("name,tensor", [("granitehybrid", "blk.0.ssm_in.weight"),
                                         ("granitehybrid", "blk.2.ssm_conv1d.weight"),
                                         ("granitehybrid", "blk.3.ssm_dt.bias"), ("granitehybrid", "blk.0.ssm_a"),
                                         ("granitehybrid", "blk.2.ssm_d"), ("granitehybrid", "blk.3.ssm_norm.weight"),
                                         ("granitehybrid", "blk.0.ssm_out.weight"),
                                         ("granitehybrid", "blk.1.attn_k.weight"),
                                         ("granitehybrid", "blk.2.ffn_up_exps.weight"),
                                         ("granitehybrid", "blk.3.ffn_down_shexp.weight"),
                                         ("granitehybrid-dense", "blk.1.ffn_gate.weight")])
def test_missing_tensor_is_named(tmp_path, name, tensor):
    p = rewrite(DATA / f"{name}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_a_stored_as_a_log_is_refused(tmp_path):
    """ssm_a must hold A = -exp(A_log) < 0 (the converter's); positive values are named."""
    p = rewrite(DATA / "granitehybrid.gguf", tmp_path / "x.gguf", drop_tensors=("blk.2.ssm_a",),
                add_tensors={"blk.2.ssm_a": np.full((8, 1), 0.5)})
    with pytest.raises(MinferError, match=r"blk\.2\.ssm_a.*-exp\(A_log\)"):
        load(p)


@pytest.mark.parametrize("key,value,match", [
    ("granitehybrid.rope.scaling.finetuned", True, "rope on the attention layers"),
    ("granitehybrid.ssm.inner_size", 96, r"inner_size=96 is not twice"),
    ("granitehybrid.ssm.time_step_rank", 7, r"time_step_rank=7"),
    ("granitehybrid.ssm.conv_kernel", 1, r"conv_kernel' = 1"),
    ("granitehybrid.expert_weights_scale", 2.5, r"expert_weights_scale"),
])
def test_unsupported_or_wrong_key_is_named(tmp_path, key, value, match):
    import gguf

    vtype = {bool: gguf.GGUFValueType.BOOL, int: gguf.GGUFValueType.UINT32,
             float: gguf.GGUFValueType.FLOAT32}[type(value)]
    p = rewrite(DATA / "granitehybrid.gguf", tmp_path / "x.gguf", set_keys={key: (value, vtype)})
    with pytest.raises(MinferError, match=match):
        load(p)
