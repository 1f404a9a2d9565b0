"""qwen35 (Qwen3.5 dense), qwen35moe (Qwen3.5 MoE) and qwen3next (Qwen3-Next): each rule of the gated
DeltaNet and gated attention layers is needed to meet transformers' logits, the chunked delta rule is the recurrence, the recurrent state in the cache (rings,
the engine's prefix rule, the preflight's bytes), the batch engine's state slots, and malformed files
refused by name.

The fixture (tests/data/arch/qwen35.gguf, tools/gen_arch_fixtures.py): 4 layers, linear attention on 0,
2, 3 (2 key heads, 4 value heads of 16, conv of 4 taps), gated full attention on 1 (4 heads of 32, 2 kv
heads, rope on 16 of 32 dims). qwen35moe.gguf: linear attention on 0, 1, 3 (2 key heads, 6 value heads),
full attention on 2, a top-2-of-4 MoE with the gated shared expert in every layer, tied head.
qwen3next.gguf: linear attention on 0-2 (ssm_ba, grouped value heads), full attention on 3. Logits,
greedy and the cache in pieces: test_arch_vs_transformers.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from minfer.errors import MinferError
from models.test_arch_vs_transformers import DATA, TOL, engine, load, ref, rel_err, rewrite

NAME = "qwen35"


def miss(eng, name=NAME) -> float:
    r = ref(name)
    return rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"])


def test_layer_kinds_and_cache_geometry():
    m = engine(NAME).model
    assert m.is_recurrent == (True, False, True, True)
    d = m.dims
    assert (d.d_conv, d.d_inner, d.d_state, d.n_v_heads, d.n_k_heads, d.conv_dim) == (4, 64, 16, 4, 2, 128)
    assert m.cfg.kv_layers == (None, (2, 32, 32), None, None)
    assert m.cfg.state_layers[0] == ((4, 128), (2, 4, 16, 16)) and m.cfg.state_layers[1] is None
    assert m.cfg.rope.n_rot == 16 and m.cfg.rope.style == "neox"
    assert m.paged_kv and m.recurrent and m.tiled_v_heads


def test_preflight_counts_rows_and_state():
    """2 kv heads * (32 + 32) float32 per position (the one attention layer) plus, once, 3 layers' state
    ((4 * 128 + 2 * 4 * 16 * 16) float32)."""
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.kv_cache import KVCache

    gf = GGUFFile(DATA / f"{NAME}.gguf")
    cfg = preflight.cache_config(gf)
    per, fixed = preflight.kv_bytes_per_token(cfg, "cpu"), preflight.state_bytes(cfg)
    assert per == 2 * 64 * 4
    assert fixed == 3 * (4 * 128 + 2 * 4 * 16 * 16) * 4
    assert KVCache.for_config(cfg, 100).nbytes() == 100 * per + fixed
    assert engine(NAME, ctx=100).cache.nbytes() == 100 * per + fixed


# ---- each rule is needed --------------------------------------------------------------------

def _scan_wrapped(monkeypatch, f):
    """Both scans with their inputs (q, k, v, g, beta) changed by f."""
    from minfer.models import deltanet

    for name in ("scan_chunked", "scan_sequential"):
        real = getattr(deltanet, name)
        monkeypatch.setattr(deltanet, name, lambda q, k, v, g, beta, ring, pos, *a, _r=real:
                            _r(*f(q, k, v, g, beta), ring, pos, *a))


def _perturb(monkeypatch, m, what: str) -> None:
    import torch.nn.functional as F

    from minfer.models import deltanet

    lin = [w for w in m.linear if w is not None]
    att = [b for b, r in zip(m.blocks, m.is_recurrent) if not r]
    Dk = m.dims.d_state
    if what == "conv_window":              # only the current row's tap
        real = deltanet.causal_conv

        def last_tap(x, w, ring, positions):
            real(x, w, ring, positions)
            return F.silu(x * w.conv_w[-1])
        monkeypatch.setattr(deltanet, "causal_conv", last_tap)
    elif what == "l2norm":
        monkeypatch.setattr(deltanet, "l2norm", lambda x: x)
    elif what == "q_scale":                # q not divided by sqrt(Dk)
        _scan_wrapped(monkeypatch, lambda q, k, v, g, b: (q * Dk ** 0.5, k, v, g, b))
    elif what == "beta":                   # beta = 1: the plain delta rule
        _scan_wrapped(monkeypatch, lambda q, k, v, g, b: (q, k, v, g, torch.ones_like(b)))
    elif what == "decay":                  # g = 0: no decay
        _scan_wrapped(monkeypatch, lambda q, k, v, g, b: (q, k, v, torch.zeros_like(g), b))
    elif what == "delta":                  # S += beta k v^T (linear attention, no delta correction)
        monkeypatch.setattr(deltanet, "scan_chunked", _no_delta)
        monkeypatch.setattr(deltanet, "scan_sequential", _no_delta)
    elif what == "dt_bias":
        for w in lin:
            w.dt_bias = torch.zeros_like(w.dt_bias)
    elif what == "A_as_A_log":             # the converter's -exp(A_log) applied a second time
        for w in lin:
            w.A = -torch.exp(w.A)
    elif what == "v_heads_grouped":        # value head j reading key head j // 2 (the converter reordered them)
        m.tiled_v_heads = False
    elif what == "out_gate":               # no silu(z)
        monkeypatch.setattr(deltanet, "gated_head_norm", lambda o, z, wt, eps:
                            o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * wt)
    elif what == "gate_before_norm":       # RMSNorm(o * silu(z))
        monkeypatch.setattr(deltanet, "gated_head_norm", lambda o, z, wt, eps: _rms(o * F.silu(z), eps) * wt)
    elif what == "ssm_norm_plus_one":      # the linear attention's norm read as (1 + w) like the others
        for w in lin:
            w.norm = w.norm + 1
    elif what == "norms_plus_one":         # (1 + w) applied again: the converter already added 1
        for b in m.blocks:
            b.attn_norm, b.ffn_norm = b.attn_norm + 1, b.ffn_norm + 1
    elif what == "q_gate":                 # attention output not gated (sigmoid -> 1)
        monkeypatch.setattr(m, "split_query", lambda qg, Dh: (qg[..., :Dh].contiguous(), torch.full_like(
            qg[..., Dh:], 40.0)))
    elif what == "q_gate_order":           # the gate read from the first Dh dims of each head
        monkeypatch.setattr(m, "split_query", lambda qg, Dh: (qg[..., Dh:].contiguous(), qg[..., :Dh]))
    elif what == "qk_norm":
        for b in att:
            b.attn_q_norm, b.attn_k_norm = torch.ones_like(b.attn_q_norm), torch.ones_like(b.attn_k_norm)
    elif what == "partial_rope":           # the whole head rotated
        m.cfg = dataclasses.replace(m.cfg, rope=dataclasses.replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    else:
        raise AssertionError(what)


def _rms(x, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _no_delta(q, k, v, g, beta, ring, positions, *a):
    from minfer.models.deltanet import _initial_state, _store_state

    s = _initial_state(ring, positions)
    out = []
    for t in range(q.shape[0]):
        s = s * torch.exp(g[t]).view(-1, 1, 1) + k[t].unsqueeze(-1) * (v[t] * beta[t].unsqueeze(-1)).unsqueeze(1)
        out.append(torch.einsum("hkv,hk->hv", s, q[t]))
    _store_state(ring, s, positions)
    return torch.stack(out)


RULES = ["conv_window", "l2norm", "q_scale", "beta", "decay", "delta", "dt_bias", "A_as_A_log", "v_heads_grouped",
         "out_gate", "gate_before_norm", "ssm_norm_plus_one", "norms_plus_one", "q_gate", "q_gate_order",
         "qk_norm", "partial_rope"]


@pytest.mark.parametrize("what", RULES)
def test_each_rule_is_needed(monkeypatch, what):
    """With any one rule changed the fixture misses transformers' logits by far."""
    eng = engine(NAME)
    assert miss(eng) < TOL
    _perturb(monkeypatch, eng.model, what)
    eng.reset()
    err = miss(eng)
    assert not err < 10 * TOL, (what, err)


# ---- the scan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("chunk", [1, 7, 64])
def test_chunked_delta_rule_is_the_recurrence(chunk):
    """scan_chunked (the prefill's WY form) against the step-by-step recurrence, 150 positions from a
    carried state (start 37: the state after position 36 in ring slot 0), outputs and final state."""
    from minfer.models import deltanet as dn

    g = torch.Generator().manual_seed(0)
    T, H, K, V = 150, 4, 16, 16
    q = dn.l2norm(torch.randn(T, H, K, generator=g)) * K ** -0.5
    k, v = dn.l2norm(torch.randn(T, H, K, generator=g)), torch.randn(T, H, V, generator=g)
    decay, beta = -torch.rand(T, H, generator=g) * 2, torch.rand(T, H, generator=g)
    ring = torch.zeros(2, H, K, V)
    ring[0] = torch.randn(H, K, V, generator=g)
    pos = torch.arange(37, 37 + T)
    r1, r2 = ring.clone(), ring.clone()
    want = dn.scan_sequential(q, k, v, decay, beta, r1, pos)
    got = dn.scan_chunked(q, k, v, decay, beta, r2, pos, chunk=chunk)
    assert float((got - want).abs().max() / want.abs().max()) < 1e-5
    assert float((r2[0] - r1[0]).abs().max() / r1[0].abs().max()) < 1e-5     # the state after 186
    assert torch.equal(r2[1], ring[1])                                          # slot 1 untouched


def test_prefill_across_chunks_equals_decode_steps():
    """70 tokens in one prefill (two chunks of the delta rule) against the same tokens one position at a
    time: every position's logits agree to float32 rounding; each chunk from a zero state misses by far."""
    from minfer.models import deltanet

    ids = (torch.arange(70) * 37 % 300 + 3).tolist()
    whole = engine(NAME, ctx=80).logits(ids).numpy()
    eng = engine(NAME, ctx=80)
    steps = np.concatenate([eng.forward([t], i).numpy() for i, t in enumerate(ids)])
    assert rel_err(steps, whole) < 1e-4
    real = deltanet.scan_chunked

    def no_carry(q, k, v, g, beta, ring, positions, chunk=deltanet.CHUNK):
        return torch.cat([real(q[c:c + chunk], k[c:c + chunk], v[c:c + chunk], g[c:c + chunk], beta[c:c + chunk],
                               ring, positions[c:c + chunk] * 0, chunk) for c in range(0, q.shape[0], chunk)])
    deltanet.scan_chunked = no_carry
    try:
        broken = engine(NAME, ctx=80).logits(ids).numpy()
    finally:
        deltanet.scan_chunked = real
    assert rel_err(broken, whole) > 10 * TOL


def test_a_step_repeated_at_its_position_is_harmless():
    """The rings are indexed by position: a step run again at its position (decode-graph warm-up; a token
    computed ahead, then dropped) reads what it read the first time."""
    from minfer.models import Step

    r = ref(NAME)
    ids = r["ids"].tolist()
    eng = engine(NAME)
    m, cache = eng.model, eng.cache
    m.forward(torch.tensor(ids[:20]), Step.at(0, 20, "cpu"), cache)
    a = m.forward(torch.tensor([ids[20]]), Step(torch.tensor([20]), None, "all"), cache)   # host-free step
    b = m.forward(torch.tensor([ids[20]]), Step(torch.tensor([20]), None, "all"), cache)
    assert torch.equal(a, b)
    m.forward(torch.tensor([5]), Step.at(21, 1, "cpu"), cache)         # a token ahead, then dropped
    c = m.forward(torch.tensor([ids[21]]), Step.at(21, 1, "cpu"), cache)
    d = m.forward(torch.tensor([ids[22]]), Step.at(22, 1, "cpu"), cache)
    assert rel_err(torch.cat([a, c, d]).numpy(), r["logits"][20:23]) < TOL


def test_prefix_reused_only_whole_and_needed(monkeypatch):
    ids = ref(NAME)["ids"].tolist()
    other = ids[:25] + [7, 8, 9]
    fresh = engine(NAME).logits(other)[-1]
    eng = engine(NAME)
    eng.prefill(ids[:30])
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) < 1e-6
    eng.prefill(ids[:30])
    monkeypatch.setattr(eng.model, "recurrent", False)                 # reuse the first 25 of 30: wrong
    assert rel_err(eng.prefill(other)[None].numpy(), fresh[None].numpy()) > 10 * TOL


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe", "qwen3next"])
def test_batch_engine_serves_them(name):
    """paged_kv = True: BatchEngine.from_engine (what `minfer serve -np N` builds) runs two prompts at
    once with per-sequence state slots (runtime/paged_state.py, deltanet.py conv_scan_batch;
    tests/runtime/test_paged_deltanet.py has the chunked, reused-slot and graph-bucket cases), each
    equal to its single greedy; a cache without recurrent_state handed to the model is a MinferError,
    not a silently stateless run."""
    from minfer.models import Step
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.sampling import SamplingParams

    eng = engine(name)
    ids = ref(name)["ids"].tolist()
    g = SamplingParams(temperature=0)
    be = BatchEngine.from_engine(eng, max_seqs=2)
    assert be.cache.states is not None and not be.blocks.prefix_cache
    outs = be.generate_many([ids[:20], ids[3:14]], g, 6)
    for p, out in zip([ids[:20], ids[3:14]], outs):
        assert [ev.token_id for ev in out] == [ev.token_id for ev in eng.generate(p, g, max_new_tokens=6)]

    class NoState:        # a cache with the attention calls only
        pass
    with pytest.raises(MinferError, match="keeps their recurrent state.*NoState keeps none"):
        eng.model.forward(torch.tensor([3, 4]), Step.at(0, 2, "cpu"), NoState())


# ---- malformed files: one MinferError naming the key or tensor --------------------------------

@pytest.mark.parametrize("key", [f"{NAME}.ssm.conv_kernel", f"{NAME}.ssm.inner_size", f"{NAME}.ssm.state_size",
                                 f"{NAME}.ssm.time_step_rank", f"{NAME}.ssm.group_count",
                                 f"{NAME}.rope.dimension_sections"])
def test_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.0.attn_qkv.weight", "blk.2.attn_gate.weight", "blk.3.ssm_beta.weight",
                                    "blk.0.ssm_alpha.weight", "blk.2.ssm_conv1d.weight", "blk.3.ssm_dt.bias",
                                    "blk.0.ssm_a", "blk.2.ssm_norm.weight", "blk.3.ssm_out.weight",
                                    "blk.1.attn_q.weight", "blk.1.attn_q_norm.weight", "blk.1.attn_k_norm.weight",
                                    "blk.1.post_attention_norm.weight", "blk.2.ffn_up.weight"])
def test_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_layer_pattern_key_needed(tmp_path):
    """Without attention.recurrent_layers the default interval (every 4th layer full attention) makes layer
    1 a linear-attention layer, whose tensors this file does not have: named."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(f"{NAME}.attention.recurrent_layers",))
    with pytest.raises(MinferError, match=r"blk\.1\.ssm_conv1d\.weight"):
        load(p)


def test_a_stored_as_a_log_is_refused(tmp_path):
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_tensors=("blk.2.ssm_a",),
                add_tensors={"blk.2.ssm_a": np.full((4,), 0.5)})
    with pytest.raises(MinferError, match=r"blk\.2\.ssm_a.*-exp\(A_log\)"):
        load(p)


@pytest.mark.parametrize("key,value,match", [
    (f"{NAME}.ssm.inner_size", 96, r"state_size=16 differs from the value head size"),
    (f"{NAME}.ssm.time_step_rank", 3, r"time_step_rank=3"),
    (f"{NAME}.ssm.conv_kernel", 1, r"conv_kernel' = 1"),
    (f"{NAME}.full_attention_interval", 0, None),
    (f"{NAME}.attention.value_length", 16, r"key_length=32 != value_length=16"),
])
def test_wrong_key_is_named(tmp_path, key, value, match):
    import gguf

    drop = (f"{NAME}.attention.recurrent_layers",) if key.endswith("interval") else ()
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=drop,
                set_keys={key: (value, gguf.GGUFValueType.UINT32)})
    with pytest.raises(MinferError, match=match or key.replace(".", r"\.")):
        load(p)


def test_fourth_rope_section_is_refused(tmp_path):
    import gguf

    key = f"{NAME}.rope.dimension_sections"
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(key,),
                set_keys={key: ([2, 2, 2, 2], gguf.GGUFValueType.ARRAY)})
    with pytest.raises(MinferError, match=r"dimension_sections=\[2, 2, 2, 2\]"):
        load(p)


# ---- qwen35moe: the MoE and the gated shared expert ----------------------------------------------

MOE = "qwen35moe"


def _perturb_moe(monkeypatch, m, what: str) -> None:
    from minfer.models.qwen3moe import Qwen3MoeModel

    if what == "shared_gate":          # the shared expert added ungated
        monkeypatch.setattr(m, "ffn", lambda h, e, ctx: (Qwen3MoeModel.ffn(m, h, e, ctx).float()
                                                         + m.shared_expert(h, e, ctx).float()).to(h.dtype))
    elif what == "shared_expert":      # routed experts only
        monkeypatch.setattr(m, "ffn", lambda h, e, ctx: Qwen3MoeModel.ffn(m, h, e, ctx))
    elif what == "renormalize":        # the top-k softmax weights not renormalized
        m.weights_norm = False
    elif what == "v_heads_grouped":    # 3 value heads per key head read in HF's grouped order
        m.tiled_v_heads = False
    else:
        raise AssertionError(what)


@pytest.mark.parametrize("what", ["shared_gate", "shared_expert", "renormalize", "v_heads_grouped"])
def test_each_moe_rule_is_needed(monkeypatch, what):
    eng = engine(MOE)
    assert miss(eng, MOE) < TOL
    _perturb_moe(monkeypatch, eng.model, what)
    eng.reset()
    assert not miss(eng, MOE) < 10 * TOL, what


def test_moe_layers_and_preflight():
    from minfer.commands import preflight
    from minfer.gguf_file import GGUFFile

    m = engine(MOE).model
    assert m.is_recurrent == (True, True, False, True) and m.cfg.ffn == 0
    assert (m.cfg.n_experts, m.cfg.n_experts_used, m.cfg.expert_ffn, m.cfg.expert_shared_ffn) == (4, 2, 32, 48)
    assert all(e is not None and e.gate_inp_shexp is not None for e in m.moe)
    cfg = preflight.cache_config(GGUFFile(DATA / f"{MOE}.gguf"))
    assert preflight.kv_bytes_per_token(cfg, "cpu") == 2 * 64 * 4
    assert preflight.state_bytes(cfg) == 3 * (4 * 160 + 2 * 6 * 16 * 16) * 4


@pytest.mark.parametrize("key", [f"{MOE}.expert_count", f"{MOE}.expert_used_count",
                                 f"{MOE}.expert_feed_forward_length", f"{MOE}.expert_shared_feed_forward_length"])
def test_moe_missing_key_is_named(tmp_path, key):
    p = rewrite(DATA / f"{MOE}.gguf", tmp_path / "x.gguf", drop_keys=(key,))
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


@pytest.mark.parametrize("tensor", ["blk.0.ffn_gate_inp.weight", "blk.2.ffn_up_exps.weight",
                                    "blk.3.ffn_gate_inp_shexp.weight", "blk.1.ffn_down_shexp.weight"])
def test_moe_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{MOE}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_feed_forward_length_optional_only_for_experts(tmp_path):
    """qwen35moe files carry no feed_forward_length (ffn_key_optional); the dense qwen35 needs it."""
    p = rewrite(DATA / f"{NAME}.gguf", tmp_path / "x.gguf", drop_keys=(f"{NAME}.feed_forward_length",))
    with pytest.raises(MinferError, match=r"qwen35\.feed_forward_length' is missing"):
        load(p)


def test_moe_expert_weights_scale_refused(tmp_path):
    import gguf

    key = f"{MOE}.expert_weights_scale"
    p = rewrite(DATA / f"{MOE}.gguf", tmp_path / "x.gguf", set_keys={key: (2.5, gguf.GGUFValueType.FLOAT32)})
    with pytest.raises(MinferError, match=key.replace(".", r"\.")):
        load(p)


# ---- qwen3next: plain NEOX rope, beta/alpha in one matrix, value heads in HF's grouped order ------

NEXT = "qwen3next"


def _perturb_next(monkeypatch, m, what: str) -> None:
    from minfer.models import deltanet

    if what == "v_heads_tiled":        # the Qwen3.5 converter's order: wrong for Qwen3-Next files
        m.tiled_v_heads = True
    elif what == "ba_order":           # alpha's rows read first
        real = deltanet.split_ba
        monkeypatch.setattr(deltanet, "split_ba", lambda ba, hk, hv: real(ba, hk, hv)[::-1])
    elif what == "ba_halves":          # all beta rows then all alpha rows (not per key head)
        monkeypatch.setattr(deltanet, "split_ba", lambda ba, hk, hv: (ba[:, :hv], ba[:, hv:]))
    elif what == "norms_plus_one":     # HF's (1 + w) applied to what the converter already shifted
        for b in m.blocks:
            b.attn_norm = b.attn_norm + 1
    elif what == "partial_rope":
        m.cfg = dataclasses.replace(m.cfg, rope=dataclasses.replace(m.cfg.rope, n_rot=m.cfg.head_dim))
    elif what in ("shared_gate", "renormalize"):
        _perturb_moe(monkeypatch, m, what)
    else:
        raise AssertionError(what)


@pytest.mark.parametrize("what", ["v_heads_tiled", "ba_order", "ba_halves", "norms_plus_one", "partial_rope",
                                  "shared_gate", "renormalize"])
def test_each_qwen3next_rule_is_needed(monkeypatch, what):
    eng = engine(NEXT)
    assert miss(eng, NEXT) < TOL
    _perturb_next(monkeypatch, eng.model, what)
    eng.reset()
    assert not miss(eng, NEXT) < 10 * TOL, what


def test_qwen3next_layers():
    m = engine(NEXT).model
    assert m.is_recurrent == (True, True, True, False)
    assert not m.tiled_v_heads and not m.mrope and m.cfg.rope.n_rot == 16
    assert all(w.ssm_ba is not None and w.ssm_beta is None for w in m.linear if w is not None)
    assert m.cfg.kv_layers == (None, None, None, (2, 32, 32))


def test_qwen3next_default_interval_matches_the_array(tmp_path):
    """Without attention.recurrent_layers the every-4th default gives the same layers here."""
    r = ref(NEXT)
    p = rewrite(DATA / f"{NEXT}.gguf", tmp_path / "x.gguf", drop_keys=(f"{NEXT}.attention.recurrent_layers",))
    from minfer.runtime.engine import Engine
    from models.test_arch_vs_transformers import reference_switches

    eng = Engine.load(p, ctx=64, progress=False, switches=reference_switches())
    assert rel_err(eng.logits(r["ids"].tolist()).numpy(), r["logits"]) < TOL


@pytest.mark.parametrize("tensor", ["blk.0.ssm_ba.weight", "blk.3.attn_q.weight", "blk.1.ffn_gate_inp_shexp.weight"])
def test_qwen3next_missing_tensor_is_named(tmp_path, tensor):
    p = rewrite(DATA / f"{NEXT}.gguf", tmp_path / "x.gguf", drop_tensors=(tensor,))
    with pytest.raises(MinferError, match=tensor.replace(".", r"\.")):
        load(p)


def test_qwen3next_legacy_qkvz_layout_refused(tmp_path):
    p = rewrite(DATA / f"{NEXT}.gguf", tmp_path / "x.gguf", drop_tensors=("blk.1.attn_qkv.weight",),
                add_tensors={"blk.1.ssm_in.weight": np.zeros((192, 64))})
    with pytest.raises(MinferError, match=r"blk\.1\.ssm_in\.weight.*older Qwen3-Next layout"):
        load(p)
