"""The Mamba-2 decode step's Triton kernels (minfer/ops/cuda/ssm_step.py) in Triton's interpreter
against models/mamba2.py's torch step, float32: the batch engine's decode rows (_decode_rows: rows
of scattered state slots, positions inside and past the conv window, position 0 read unmasked), the
single sequence's masked step (conv_scan with stale ring contents before position 0), the repeated
step, the gate and group norm, the whole mixer over a BatchState of decode rows and a prefill chunk,
and the mamba2 / granitehybrid fixtures' decode steps through the CUDA backend (logits within 1e-5,
the new launch paths counted). Shapes with n_groups > 1, head and state sizes not powers of two,
several head-channel blocks per head. The GPU run is tests/gpu/test_ssm_step_gpu.py."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, op_counter, route_to_cuda  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm", "minfer.ops.cuda.ssm_step",
         "minfer.ops.cuda"]
DATA = Path(__file__).resolve().parents[1] / "data" / "arch"

# (H, P, N, G, K, conv bias): P = 80 with N = 128 takes 3 blocks of 32 head channels per head
SHAPES = [(4, 16, 16, 1, 4, True), (6, 10, 12, 2, 4, True), (8, 12, 20, 4, 3, False), (2, 80, 128, 2, 4, True)]


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


def _weights(H, P, N, G, K, bias, gen, norm=True):
    from minfer.models.mamba2 import Mamba2Dims, Mamba2Weights

    d = Mamba2Dims(d_inner=H * P, d_state=N, n_heads=H, n_groups=G, d_conv=K)
    W = d.conv_dim
    w = Mamba2Weights(ssm_in=None, conv_w=torch.randn(K, W, generator=gen) * 0.5,
                      conv_b=torch.randn(W, generator=gen) * 0.3 if bias else None,
                      dt_bias=torch.randn(H, generator=gen), A=-torch.rand(H, generator=gen) * 2 - 0.1,
                      D=torch.randn(H, generator=gen), norm=torch.randn(H * P, generator=gen) if norm else None,
                      ssm_out=None)
    return d, w


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_rows_of_scattered_slots(cuda_ops, shape):
    """Rows in slots 5, 2, 6 of 7 at positions 0, 7 and 2 (unmasked: a slot's rings as they are),
    against _decode_rows + the D skip; every slot's rings after the step equal (untouched ones too)."""
    from minfer.models.mamba2 import _decode_rows

    S = cuda_ops["ssm_step"]
    H, P, N, G, K, bias = shape
    gen = torch.Generator().manual_seed(sum(shape[:5]))
    d, w = _weights(H, P, N, G, K, bias, gen)
    slots, pos = torch.tensor([5, 2, 6]), torch.tensor([0, 7, 2])
    T = len(slots)
    zx = torch.randn(T, d.in_dim, generator=gen)
    conv = torch.randn(7, K, d.conv_dim, generator=gen)
    ssm = torch.randn(7, 2, H, P, N, generator=gen)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    _, xbc, dt = zx.split([d.d_inner, d.conv_dim, H], dim=-1)
    x, y = _decode_rows(xbc, dt, w, d, conv_ref, ssm_ref, slots, pos)
    want = (y + x * w.D.view(1, H, 1)).reshape(T, -1)
    got = S.ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos, slots)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.allclose(conv, conv_ref, rtol=0, atol=0)
    assert (ssm - ssm_ref).abs().max() <= 1e-5 * ssm_ref.abs().max()


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_single_sequence_step_masked_and_repeatable(cuda_ops, shape):
    """One sequence at positions 0, 1, 2, 5: nothing read before position 0 (the rings hold stale
    values there), against conv_scan (T = 1) + D; the step run twice at a position gives the same."""
    from minfer.models.mamba2 import conv_scan

    S = cuda_ops["ssm_step"]
    H, P, N, G, K, bias = shape
    gen = torch.Generator().manual_seed(7 + sum(shape[:5]))
    d, w = _weights(H, P, N, G, K, bias, gen)
    conv = torch.randn(K, d.conv_dim, generator=gen)
    ssm = torch.randn(2, H, P, N, generator=gen)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    for p in (0, 1, 2, 5):
        pos = torch.tensor([p])
        zx = torch.randn(1, d.in_dim, generator=gen)
        _, xbc, dt = zx.split([d.d_inner, d.conv_dim, H], dim=-1)
        x, y = conv_scan(xbc, dt, w, d, (conv_ref, ssm_ref), pos)
        want = (y + x * w.D.view(1, H, 1)).reshape(1, -1)
        got = S.ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos)
        again = S.ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos)
        assert (got - want).abs().max() <= 1e-5 * want.abs().max(), p
        assert torch.equal(got, again)
        assert torch.equal(conv, conv_ref)
        assert (ssm - ssm_ref).abs().max() <= 1e-5 * ssm_ref.abs().max()


@pytest.mark.parametrize("groups,norm", [(1, True), (2, True), (3, True), (2, False)])
def test_gate_norm(cuda_ops, groups, norm):
    from minfer.models.mamba2 import gated_group_norm

    S = cuda_ops["ssm_step"]
    gen = torch.Generator().manual_seed(groups)
    di = 60
    y = torch.randn(5, di, generator=gen)
    zx = torch.randn(5, 2 * di + 9, generator=gen)
    wt = torch.randn(di, generator=gen) if norm else None
    want = gated_group_norm(y, zx[:, :di], wt, groups, 1e-5)
    got = S.ssm_gate_norm(y, zx, wt, groups, 1e-5, torch.float32)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()


def _f32_qweight(name, t):
    from minfer.weights import QWeight

    return QWeight(name, 0, tuple(t.shape), t.contiguous().view(torch.uint8).reshape(t.shape[0], -1))


def test_mixer_batch_state_decode_rows_and_chunk(cuda_ops, monkeypatch):
    """mamba2_mixer over a BatchState of two decode rows and a 3-token prefill chunk, the backend
    routed to the interpreted CUDA one (the linears stay the CPU's) against the reference: outputs
    and every slot's rings; the decode rows take the kernel, the chunk the torch ops."""
    import minfer.ops as O
    from minfer.models.mamba2 import mamba2_mixer
    from minfer.ops import paths
    from minfer.runtime.paged_state import BatchState

    H, P, N, G, K = 6, 10, 12, 2, 4
    gen = torch.Generator().manual_seed(3)
    d, w = _weights(H, P, N, G, K, True, gen)
    Dm = 24
    w.ssm_in = _f32_qweight("ssm_in", torch.randn(d.in_dim, Dm, generator=gen) * 0.2)
    w.ssm_out = _f32_qweight("ssm_out", torch.randn(Dm, d.d_inner, generator=gen) * 0.2)
    h = torch.randn(5, Dm, generator=gen)
    pos = torch.tensor([4, 9, 3, 4, 5])
    conv = torch.randn(6, K, d.conv_dim, generator=gen)
    ssm = torch.randn(6, 2, H, P, N, generator=gen)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    ref = mamba2_mixer(h, w, d, BatchState(conv_ref, ssm_ref, 2, torch.tensor([3, 1]), [(2, 3, 4)]), pos, 1e-5, None)
    monkeypatch.setattr(O, "_backend", lambda x: cuda_ops["cuda"])
    paths.reset()
    out = mamba2_mixer(h, w, d, BatchState(conv, ssm, 2, torch.tensor([3, 1]), [(2, 3, 4)]), pos, 1e-5, None)
    assert float((out - ref).norm() / ref.norm()) < 1e-5
    assert torch.allclose(conv, conv_ref, rtol=0, atol=0)
    assert (ssm - ssm_ref).abs().max() <= 1e-5 * ssm_ref.abs().max()
    c = paths.snapshot()["counts"]
    assert c.get("ssm.step.triton") == 1 and c.get("ssm.norm.triton") == 1 and c.get("ssm.scan.torch") == 1


@pytest.mark.parametrize("name", ["mamba2", "granitehybrid"])
def test_fixture_decode_steps_through_cuda_backend(cuda_ops, monkeypatch, name):
    """The fixture's prefill by the reference, then three host-free decode steps (device positions)
    through the CUDA backend's code against the reference's: logits within 1e-5, the decode
    counting ssm.step.triton and ssm.norm.triton and no torch conv or scan."""
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
    cache.k.copy_(ref_cache.k)
    cache.v.copy_(ref_cache.v)
    for a, b in zip(cache.states, ref_cache.states):
        if a is not None:
            for s, r in zip(a, b):
                s.copy_(r)
    refs = [m.forward(torch.tensor([t]), Step.at(T + i, 1, "cpu"), ref_cache) for i, t in enumerate((7, 11, 5))]
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    paths.reset()
    for i, (t, ref) in enumerate(zip((7, 11, 5), refs)):
        dec = m.forward(torch.tensor([t]), Step(torch.tensor([T + i]), None, "all"), cache, ctx)
        assert float((dec - ref).norm() / ref.norm()) < 1e-5, i
    c = paths.snapshot()["counts"]
    n_mamba = sum(g is not None for g in cache.states)
    assert c.get("ssm.step.triton") == 3 * n_mamba and c.get("ssm.norm.triton") == 3 * n_mamba, c
    assert "ssm.conv.torch" not in c and "ssm.scan.torch" not in c, c


def test_decode_mixer_core_is_two_launches(cuda_ops, monkeypatch):
    """Between the in- and out-projection, a decode step of the mixer on the CUDA path runs the two
    kernels and no torch compute op (counted by a dispatch mode, views and allocations aside); the
    torch step it replaces ran 61 ops for one sequence and 38 for the batch engine's rows (float32)."""
    import minfer.ops as O
    from minfer.models.mamba2 import mamba2_mixer
    from minfer.runtime.paged_state import BatchState

    mode = op_counter()
    quiet = mode.quiet

    class Backend:
        ssm_step = staticmethod(quiet(cuda_ops["ssm_step"].ssm_step, "ssm_step"))
        ssm_gate_norm = staticmethod(quiet(cuda_ops["ssm_step"].ssm_gate_norm, "ssm_gate_norm"))

    H, P, N, G, K, Dm = 6, 10, 12, 2, 4, 24
    gen = torch.Generator().manual_seed(4)
    d, w = _weights(H, P, N, G, K, True, gen)
    w.ssm_in = _f32_qweight("ssm_in", torch.randn(d.in_dim, Dm, generator=gen) * 0.2)
    w.ssm_out = _f32_qweight("ssm_out", torch.randn(Dm, d.d_inner, generator=gen) * 0.2)
    monkeypatch.setattr(O, "_backend", lambda x: Backend)
    monkeypatch.setattr(O, "linear", quiet(O.linear))
    single = (torch.zeros(K, d.conv_dim), torch.zeros(2, H, P, N))
    batch = BatchState(torch.zeros(4, K, d.conv_dim), torch.zeros(4, 2, H, P, N), 2, torch.tensor([3, 1]), [])
    for st, T in ((single, 1), (batch, 2)):
        h, pos = torch.randn(T, Dm, generator=gen), torch.arange(T) + 3
        mode.c.clear()
        with mode:
            mamba2_mixer(h, w, d, st, pos, 1e-5, None)
        assert dict(mode.c) == {"ssm_step": 1, "ssm_gate_norm": 1}, dict(mode.c)
