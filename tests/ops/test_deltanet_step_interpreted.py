"""The gated DeltaNet decode step's Triton kernel (minfer/ops/cuda/deltanet_step.py) in Triton's
interpreter against models/deltanet.py's torch step, float32: the batch engine's decode rows
(_decode_rows: rows of scattered state slots, positions inside and past the conv window, position 0
read unmasked), the single sequence's masked step (conv_scan with stale ring contents before position
0), the repeated step, then the gated norm; GQA in both head orders (tiled / grouped), qwen3next's
fused beta/alpha row, head sizes not powers of two, several column blocks per head (the norm's own
launch). Then whole models: the qwen35 / qwen35moe / qwen3next fixtures' decode steps through the
CUDA backend (logits within 1e-5 of the reference, the states equal, the new launch path counted)
and a layer's mixer over a BatchState of decode rows beside a prefill chunk. The GPU run is
tests/gpu/test_deltanet_step_gpu.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm",
         "minfer.ops.cuda.deltanet_step", "minfer.ops.cuda"]
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
EPS = 1e-6

# (Hk, Hv, Dk, K, tiled, fused_ba, block_v): block_v below Dv splits a head's columns (norm launch apart)
SHAPES = [(2, 4, 16, 4, True, False, None), (2, 6, 12, 4, False, True, None), (1, 1, 20, 3, False, False, None),
          (2, 4, 24, 4, True, True, 8), (3, 6, 32, 2, False, False, 16)]


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


def _setup(shape, gen):
    from minfer.models.deltanet import DeltaNetDims, DeltaNetWeights

    Hk, Hv, Dk, K = shape[:4]
    d = DeltaNetDims(d_conv=K, d_inner=Hv * Dk, d_state=Dk, n_v_heads=Hv, n_k_heads=Hk)
    w = DeltaNetWeights(attn_qkv=None, attn_gate=None, ssm_beta=None, ssm_alpha=None,
                        conv_w=torch.randn(K, d.conv_dim, generator=gen) * 0.5,
                        dt_bias=torch.randn(Hv, generator=gen), A=-torch.rand(Hv, generator=gen) * 2 - 0.1,
                        norm=torch.randn(Dk, generator=gen), ssm_out=None)
    return d, w


def _rows(d, B, fused, gen):
    """qkv, z, b, a of B rows (a None with fused: b is the (B, 2 Hv) ssm_ba row) and the mixer's g, beta."""
    from minfer.models.deltanet import split_ba

    qkv = torch.randn(B, d.conv_dim, generator=gen) * 2
    z = torch.randn(B, d.d_inner, generator=gen)
    if fused:
        b, a = torch.randn(B, 2 * d.n_v_heads, generator=gen) * 2, None
        bb, aa = split_ba(b, d.n_k_heads, d.n_v_heads)
    else:
        b, a = torch.randn(B, d.n_v_heads, generator=gen) * 2, torch.randn(B, d.n_v_heads, generator=gen) * 2
        bb, aa = b, a
    return qkv, z, b, a, torch.sigmoid(bb), aa


def _g(aa, w):
    return F.softplus(aa + w.dt_bias) * w.A


def _kernel(S, qkv, z, b, a, positions, conv, w, ssm, d, shape, slots=None):
    return S.deltanet_step(qkv, z, b, a, positions, conv, w.conv_w, ssm, w.dt_bias, w.A, w.norm,
                           n_k_heads=d.n_k_heads, tiled=shape[4], eps=EPS, slots=slots, fused_ba=shape[5],
                           block_v=shape[6])


def _close(a, b, tol=1e-5):
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_rows_of_scattered_slots(cuda_ops, shape):
    """Rows in slots 5, 2, 6 of 7 at positions 0, 7 and 2 (unmasked: a slot's rings as they are)
    against _decode_rows + gated_head_norm; every slot's rings after the step equal (untouched too)."""
    from minfer.models.deltanet import _decode_rows, gated_head_norm
    from minfer.ops import paths

    S = cuda_ops["deltanet_step"]
    gen = torch.Generator().manual_seed(sum(shape[:4]))
    d, w = _setup(shape, gen)
    K, Hv, Dk = d.d_conv, d.n_v_heads, d.d_state
    conv = torch.randn(7, K, d.conv_dim, generator=gen)
    ssm = torch.randn(7, 2, Hv, Dk, Dk, generator=gen) * 0.3
    slots, positions = torch.tensor([5, 2, 6]), torch.tensor([0, 7, 2])
    qkv, z, b, a, beta, aa = _rows(d, 3, shape[5], gen)
    rc, rs = conv.clone(), ssm.clone()
    o = _decode_rows(qkv, _g(aa, w), beta, w, d, rc, rs, slots, positions, shape[4])
    want = gated_head_norm(o, z.view(3, Hv, Dk), w.norm, EPS).reshape(3, -1)
    paths.reset()
    got = _kernel(S, qkv, z, b, a, positions, conv, w, ssm, d, shape, slots)
    assert _close(got, want) and _close(conv, rc) and _close(ssm, rs)
    counts = paths.snapshot()["counts"]
    assert counts.get("deltanet.step.triton") == 1
    assert counts.get("deltanet.norm.triton") == (1 if shape[6] else None)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("pos", [0, 1, 5])
def test_single_sequence_masked_and_repeated(cuda_ops, shape, pos):
    """One sequence's rings (K, conv_dim), (2, Hv, Dk, Dv) with stale contents: the rows and the state
    before position 0 read as zeros (conv_scan's masked step); the same step again at the same
    position gives the same output and rings (the ring of two)."""
    from minfer.models.deltanet import conv_scan, gated_head_norm

    S = cuda_ops["deltanet_step"]
    gen = torch.Generator().manual_seed(7 * pos + sum(shape[:4]))
    d, w = _setup(shape, gen)
    Hv, Dk = d.n_v_heads, d.d_state
    conv = torch.randn(d.d_conv, d.conv_dim, generator=gen)
    ssm = torch.randn(2, Hv, Dk, Dk, generator=gen) * 0.3
    qkv, z, b, a, beta, aa = _rows(d, 1, shape[5], gen)
    positions = torch.tensor([pos])
    rc, rs = conv.clone(), ssm.clone()
    o = conv_scan(qkv, _g(aa, w), beta, w, d, (rc, rs), positions, shape[4])
    want = gated_head_norm(o, z.view(1, Hv, Dk), w.norm, EPS).reshape(1, -1)
    got = _kernel(S, qkv, z, b, a, positions, conv, w, ssm, d, shape)
    assert _close(got, want) and _close(conv, rc) and _close(ssm, rs)
    c1, s1 = conv.clone(), ssm.clone()
    again = _kernel(S, qkv, z, b, a, positions, conv, w, ssm, d, shape)
    assert torch.equal(again, got) and torch.equal(conv, c1) and torch.equal(ssm, s1)


def _copy_cache(src, dst):
    dst.k.copy_(src.k)
    dst.v.copy_(src.v)
    for gs, gd in zip(src.states, dst.states):
        if gs is not None:
            for ts, td in zip(gs, gd):
                td.copy_(ts)


@pytest.mark.parametrize("name", ["qwen35", "qwen35moe", "qwen3next"])
def test_model_decode_steps_through_the_kernel(cuda_ops, monkeypatch, name):
    """The fixture's 10-token prefill by the reference, then two host-free decode steps through the
    CUDA backend (the DeltaNet layers by the kernel, nothing on the torch path) against the
    reference's: logits within 1e-5, the layers' rings equal."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
    toks = torch.arange(3, 13) * 7 % 300 + 3
    T = len(toks)
    ref_cache = KVCache.for_config(m.cfg, 64)
    m.forward(toks, Step.at(0, T, "cpu"), ref_cache)
    cache = KVCache.for_config(m.cfg, 64)
    _copy_cache(ref_cache, cache)
    refs = [m.forward(torch.tensor([t]), Step.at(T + i, 1, "cpu"), ref_cache) for i, t in enumerate((7, 11))]

    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    for i, (t, ref) in enumerate(zip((7, 11), refs)):
        out = m.forward(torch.tensor([t]), Step(torch.tensor([T + i]), None, "all"), cache, ctx)
        assert float((out - ref).norm() / ref.norm()) < 1e-5
    for gs, gd in zip(ref_cache.states, cache.states):
        if gs is not None:
            assert all(_close(td, ts, 1e-4) for ts, td in zip(gs, gd))
    counts = paths.snapshot()["counts"]
    n_rec = sum(g is not None for g in cache.states)
    assert counts.get("deltanet.step.triton") == 2 * n_rec
    assert "deltanet.scan.torch" not in counts and "deltanet.conv.torch" not in counts


@pytest.mark.parametrize("name", ["qwen35", "qwen3next"])
def test_mixer_batch_decode_rows_beside_a_chunk(cuda_ops, monkeypatch, name):
    """A layer's deltanet_mixer over a BatchState of 3 decode rows (slots 4, 1, 3 at positions 9, 0,
    2) and a 5-token prefill chunk in slot 2: the decode rows by the kernel, the chunk by the torch
    scan, against the reference mixer (outputs within 1e-5, every slot's rings equal)."""
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.models.deltanet import deltanet_mixer
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.runtime.paged_state import BatchState
    from minfer.switches import Switches

    C = cuda_ops["cuda"]
    m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
    i = next(j for j, lw in enumerate(m.linear) if lw is not None)
    d, lw = m.dims, m.linear[i]
    gen = torch.Generator().manual_seed(3)
    conv = torch.randn(5, d.d_conv, d.conv_dim, generator=gen)
    ssm = torch.randn(5, 2, d.n_v_heads, d.d_state, d.v_dim, generator=gen) * 0.3
    h = torch.randn(8, lw.attn_qkv.shape[1], generator=gen)
    positions = torch.tensor([9, 0, 2, 0, 1, 2, 3, 4])

    def run(cv, sm, ctx=None):
        st = BatchState(cv, sm, 3, torch.tensor([4, 1, 3]), [(3, 5, 2)])
        return deltanet_mixer(h, lw, d, st, positions, m.cfg.rms_eps, m.tiled_v_heads, ctx)

    rc, rs = conv.clone(), ssm.clone()
    want = run(rc, rs)
    route_to_cuda(monkeypatch, C)
    paths.reset()
    got = run(conv, ssm, Context(Switches(), C.Workspace.for_model(m)))
    assert float((got - want).norm() / want.norm()) < 1e-5
    assert _close(conv, rc) and _close(ssm, rs, 1e-4)
    counts = paths.snapshot()["counts"]
    assert counts.get("deltanet.step.triton") == 1 and counts.get("deltanet.scan.torch") == 1


@pytest.mark.parametrize("batch", [False, True])
def test_decode_mixer_core_is_the_kernel_alone(cuda_ops, monkeypatch, batch):
    """Between the projections, the CUDA path's decode mixer (qwen3next's layer, bf16 rows) runs no torch
    compute op: only the interpreter's argument staging (empty / new_empty / set_ / copy_) around the one
    launch, where the torch step ran ~60 (single) / ~54 (3 batch rows) ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from minfer import ops
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.models.deltanet import deltanet_mixer
    from minfer.ops import paths
    from minfer.runtime.paged_state import BatchState

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = set()

        def __torch_dispatch__(self, f, types, args=(), kwargs=None):
            self.names.add(f.__name__.split(".")[0])
            return f(*args, **(kwargs or {}))

    m = load_model(GGUFFile(DATA / "qwen3next.gguf"), progress=False)
    i = next(j for j, lw in enumerate(m.linear) if lw is not None)
    d, lw = m.dims, m.linear[i]
    B = 3 if batch else 1
    outs = {}

    def lin(x, w, b=None, ctx=None, out_dtype=None):          # the projections left out of the count
        if id(w) not in outs:
            outs[id(w)] = torch.randn(x.shape[0], w.shape[0]).to(torch.bfloat16)
        return outs[id(w)]

    monkeypatch.setattr(ops, "_backend", lambda x: cuda_ops["cuda"])
    monkeypatch.setattr(ops, "linear", lin)
    if batch:
        st = BatchState(torch.zeros(4, d.d_conv, d.conv_dim), torch.zeros(4, 2, d.n_v_heads, d.d_state, d.v_dim), B,
                        torch.tensor([1, 2, 3]), [])
    else:
        st = (torch.zeros(d.d_conv, d.conv_dim), torch.zeros(2, d.n_v_heads, d.d_state, d.v_dim))
    h, pos = torch.randn(B, lw.attn_qkv.shape[1]).to(torch.bfloat16), torch.tensor([5] * B)
    deltanet_mixer(h, lw, d, st, pos, 1e-6, m.tiled_v_heads, None)
    paths.reset()
    with Ops() as mode:
        deltanet_mixer(h, lw, d, st, pos, 1e-6, m.tiled_v_heads, None)
    views = {"view", "_unsafe_view", "slice", "select", "unsqueeze", "alias", "as_strided", "detach"}
    assert mode.names - views <= {"empty", "new_empty", "set_", "copy_"}, mode.names
    assert paths.snapshot()["counts"] == {"deltanet.step.triton": 1}
