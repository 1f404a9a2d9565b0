"""The Mamba-1 decode step's Triton kernels (minfer/ops/cuda/ssm1_step.py) in Triton's interpreter against
models/mamba1.py's torch step, float32: the batch engine's decode rows (conv_rows / scan_rows: rows of
scattered state slots, positions inside and past the conv window, read unmasked), the single sequence's
masked step (conv_seq / scan_chunked at T = 1 with stale ring contents before position 0), the repeated
step, B's and C's norms (weightless as Falcon-Mamba's, weighted as jamba's), the whole mixer over a
BatchState of decode rows and a prefill chunk, and the launches between the projections. The fixtures'
decode steps through the CUDA backend are tests/ops/test_arch_forward_interpreted.py's (mamba,
falcon-mamba, jamba); the GPU run is tests/gpu/test_ssm1_step_gpu.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, op_counter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
         "minfer.ops.cuda.moe_act", "minfer.ops.cuda.moe", "minfer.ops.cuda.layer_norm", "minfer.ops.cuda.ssm_step",
         "minfer.ops.cuda.ssm1_step", "minfer.ops.cuda"]

# (di, N, K, R): N = 16 as the released models; 12 and 20 not powers of two; di past one block of channels
SHAPES = [(64, 16, 4, 4), (96, 12, 4, 6), (40, 20, 3, 5), (600, 16, 4, 8)]


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(_MODS)


def _weights(di, N, K, R, gen, norms=False):
    from minfer.models.mamba1 import Mamba1Dims, Mamba1Weights

    d = Mamba1Dims(d_conv=K, d_inner=di, d_state=N, dt_rank=R)
    w = Mamba1Weights(ssm_in=None, conv_w=torch.randn(K, di, generator=gen) * 0.5, conv_b=torch.randn(di, generator=gen) * 0.3,
                      ssm_x=None, ssm_dt=None, dt_b=torch.randn(di, generator=gen),
                      A=-torch.rand(di, N, generator=gen) * 2 - 0.1, D=torch.randn(di, generator=gen), ssm_out=None)
    if norms:
        w.dt_norm, w.b_norm, w.c_norm = (torch.randn(n, generator=gen) for n in (R, N, N))
    return d, w


def _rms(t, eps=1e-5):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_rows_of_scattered_slots(cuda_ops, shape):
    """Rows in slots 5, 2, 6 of 7 at positions 0, 7 and 2 (unmasked), the in-projection's rows wider than
    x (z beside it): the conv against conv_rows, the scan + D + gate against scan_rows; every slot's rings
    after the step equal (untouched ones too)."""
    from minfer.models.mamba1 import conv_rows, scan_rows

    S = cuda_ops["ssm1_step"]
    di, N, K, R = shape
    gen = torch.Generator().manual_seed(sum(shape))
    d, w = _weights(di, N, K, R, gen)
    slots, pos = torch.tensor([5, 2, 6]), torch.tensor([0, 7, 2])
    T = len(slots)
    xz = torch.randn(T, 2 * di, generator=gen)
    conv = torch.randn(7, K, di, generator=gen)
    ssm = torch.randn(7, 2, di, N, generator=gen)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    x_ref = conv_rows(xz[:, :di], w, conv_ref, slots, pos)
    x = S.ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos, slots)
    assert _rel(x, x_ref) <= 1e-6
    assert torch.equal(conv, conv_ref)
    dtr, B, C = torch.randn(T, di, generator=gen), torch.randn(T, N, generator=gen), torch.randn(T, N, generator=gen)
    y = scan_rows(x_ref, F.softplus(dtr + w.dt_b), B, C, w.A, ssm_ref, slots, pos)
    want = (y + x_ref * w.D) * F.silu(xz[:, di:])
    got = S.ssm1_scan_step(x_ref, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos, slots)
    assert _rel(got, want) <= 1e-5
    assert _rel(ssm, ssm_ref) <= 1e-5


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_single_sequence_step_masked_and_repeatable(cuda_ops, shape):
    """One sequence at positions 0, 1, 2, 5: nothing read before position 0 (the rings hold stale values
    there), against conv_seq + scan_chunked (T = 1) + D + gate; the step run twice gives the same."""
    from minfer.models.mamba1 import conv_seq, scan_chunked

    S = cuda_ops["ssm1_step"]
    di, N, K, R = shape
    gen = torch.Generator().manual_seed(7 + sum(shape))
    d, w = _weights(di, N, K, R, gen)
    conv, ssm = torch.randn(K, di, generator=gen), torch.randn(2, di, N, generator=gen)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    for p in (0, 1, 2, 5):
        pos = torch.tensor([p])
        xz = torch.randn(1, 2 * di, generator=gen)
        dtr, B, C = torch.randn(1, di, generator=gen), torch.randn(1, N, generator=gen), torch.randn(1, N, generator=gen)
        x_ref = conv_seq(xz[:, :di], w, conv_ref, pos)
        y = scan_chunked(x_ref, F.softplus(dtr + w.dt_b), B, C, w.A, ssm_ref, pos)
        want = (y + x_ref * w.D) * F.silu(xz[:, di:])
        x = S.ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos)
        x2 = S.ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos)
        got = S.ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos)
        again = S.ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos)
        assert _rel(x, x_ref) <= 1e-6 and torch.equal(x, x2), p
        assert _rel(got, want) <= 1e-5 and torch.equal(got, again), p
        assert torch.equal(conv, conv_ref)
        assert _rel(ssm, ssm_ref) <= 1e-5


@pytest.mark.parametrize("weighted", [False, True])
def test_b_c_norms_in_the_scan(cuda_ops, weighted):
    """norm_eps: B and C RMS-normed in the kernel (times b_norm / c_norm when given) as mamba1's _rms;
    without the norm the result differs (the option is used)."""
    from minfer.models.mamba1 import scan_rows

    S = cuda_ops["ssm1_step"]
    di, N = 48, 16
    gen = torch.Generator().manual_seed(11 + weighted)
    d, w = _weights(di, N, 4, 4, gen, norms=True)
    slots, pos = torch.tensor([1, 0]), torch.tensor([3, 9])
    x, dtr = torch.randn(2, di, generator=gen), torch.randn(2, di, generator=gen)
    B, C = torch.randn(2, N, generator=gen) * 3, torch.randn(2, N, generator=gen) * 3
    xz = torch.randn(2, 2 * di, generator=gen)
    ssm = torch.randn(2, 2, di, N, generator=gen)
    ssm_ref = ssm.clone()
    Bn, Cn = (_rms(B) * w.b_norm, _rms(C) * w.c_norm) if weighted else (_rms(B), _rms(C))
    want = (scan_rows(x, F.softplus(dtr + w.dt_b), Bn, Cn, w.A, ssm_ref, slots, pos) + x * w.D) * F.silu(xz[:, di:])
    kw = dict(b_norm=w.b_norm, c_norm=w.c_norm) if weighted else {}
    got = S.ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm.clone(), pos, slots, norm_eps=1e-5, **kw)
    plain = S.ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm.clone(), pos, slots)
    assert _rel(got, want) <= 1e-5
    assert _rel(plain, want) > 1e-2


def test_bad_shapes_refused_by_name(cuda_ops):
    from minfer.errors import MinferError

    S = cuda_ops["ssm1_step"]
    gen = torch.Generator().manual_seed(1)
    d, w = _weights(32, 16, 4, 4, gen)
    xz = torch.randn(2, 64)
    with pytest.raises(MinferError, match="conv ring"):        # two rows on the single-sequence ring
        S.ssm1_conv_step(xz, w.conv_w, w.conv_b, torch.zeros(4, 32), torch.tensor([0, 1]))
    with pytest.raises(MinferError, match="ssm ring"):
        S.ssm1_scan_step(torch.randn(1, 32), torch.randn(1, 32), w.dt_b, torch.randn(1, 16), torch.randn(1, 16), w.A,
                         w.D, xz[:1], torch.zeros(2, 32, 8), torch.tensor([0]))
    with pytest.raises(MinferError, match="float32"):
        S.ssm1_conv_step(xz[:1], w.conv_w, w.conv_b, torch.zeros(4, 32, dtype=torch.bfloat16), torch.tensor([0]))


def _f32_qweight(name, t):
    from minfer.weights import QWeight

    return QWeight(name, 0, tuple(t.shape), t.contiguous().view(torch.uint8).reshape(t.shape[0], -1))


def _mixer_weights(gen, di=40, N=12, K=4, R=5, Dm=20, norms=False):
    d, w = _weights(di, N, K, R, gen, norms)
    w.ssm_in = _f32_qweight("ssm_in", torch.randn(2 * di, Dm, generator=gen) * 0.2)
    w.ssm_x = _f32_qweight("ssm_x", torch.randn(R + 2 * N, di, generator=gen) * 0.2)
    w.ssm_dt = _f32_qweight("ssm_dt", torch.randn(di, R, generator=gen) * 0.3)
    w.ssm_out = _f32_qweight("ssm_out", torch.randn(Dm, di, generator=gen) * 0.2)
    return d, w, Dm


@pytest.mark.parametrize("kind", ["plain", "falcon", "jamba"])
def test_mixer_batch_state_decode_rows_and_chunk(cuda_ops, monkeypatch, kind):
    """mamba1_mixer over a BatchState of two decode rows and a 3-token prefill chunk, and over the batch's
    decode rows alone, the backend routed to the interpreted CUDA one (the linears stay the CPU's), against
    the reference: outputs and every slot's rings; the decode rows take the kernels, the chunk the torch ops;
    Falcon-Mamba's weightless and jamba's weighted dt/B/C norms."""
    from dataclasses import replace

    import minfer.ops as O
    from minfer.models.mamba1 import mamba1_mixer
    from minfer.ops import paths
    from minfer.runtime.paged_state import BatchState

    gen = torch.Generator().manual_seed(3)
    d, w, Dm = _mixer_weights(gen, norms=kind == "jamba")
    d = replace(d, dt_b_c_rms=kind == "falcon")
    di, N, K = d.d_inner, d.d_state, d.d_conv
    for chunks, T in (([(2, 3, 4)], 5), ([], 2)):
        h = torch.randn(T, Dm, generator=gen)
        pos = torch.tensor([4, 9, 3, 4, 5])[:T]
        conv, ssm = torch.randn(6, K, di, generator=gen), torch.randn(6, 2, di, N, generator=gen)
        conv_ref, ssm_ref = conv.clone(), ssm.clone()
        ref = mamba1_mixer(h, w, d, BatchState(conv_ref, ssm_ref, 2, torch.tensor([3, 1]), chunks), pos, 1e-5, None)
        with monkeypatch.context() as mp:
            mp.setattr(O, "_backend", lambda x: cuda_ops["cuda"])
            paths.reset()
            out = mamba1_mixer(h, w, d, BatchState(conv, ssm, 2, torch.tensor([3, 1]), chunks), pos, 1e-5, None)
        assert float((out - ref).norm() / ref.norm()) < 1e-5, (kind, T)
        assert torch.equal(conv, conv_ref)
        assert _rel(ssm, ssm_ref) <= 1e-5
        c = paths.snapshot()["counts"]
        assert c.get("ssm1.conv.triton") == 1 and c.get("ssm1.scan.triton") == 1, c
        assert ("ssm1.scan.torch" in c) == bool(chunks), c


def test_decode_mixer_core_launches(cuda_ops, monkeypatch):
    """Between the in- and out-projection, a Falcon-Mamba decode step of the mixer on the CUDA path runs the
    two kernels, the two GEMVs between them and dt's norm as torch ops (B's and C's are in the scan kernel);
    counted by a dispatch mode (views and allocations aside). The torch step it replaces ran dozens."""
    from dataclasses import replace

    import minfer.ops as O
    from minfer.models.mamba1 import mamba1_mixer

    mode = op_counter()
    quiet = mode.quiet

    S = cuda_ops["ssm1_step"]

    class Backend:
        ssm1_conv_step = staticmethod(quiet(S.ssm1_conv_step, "conv"))
        ssm1_scan_step = staticmethod(quiet(S.ssm1_scan_step, "scan"))

    gen = torch.Generator().manual_seed(4)
    d, w, Dm = _mixer_weights(gen)
    d = replace(d, dt_b_c_rms=True)
    monkeypatch.setattr(O, "_backend", lambda x: Backend)
    monkeypatch.setattr(O, "linear", quiet(O.linear, "linear"))
    single = (torch.zeros(d.d_conv, d.d_inner), torch.zeros(2, d.d_inner, d.d_state))
    h, pos = torch.randn(1, Dm, generator=gen), torch.tensor([3])
    mode.c.clear()
    with mode:
        mamba1_mixer(h, w, d, single, pos, 1e-5, None)
    # linear x4 (in, x, dt, out), the two kernels; dt's norm: pow, mean, add, rsqrt, mul (float32 here: the
    # casts to and from the activation dtype are no-ops)
    assert dict(mode.c) == {"linear": 4, "conv": 1, "scan": 1, "pow": 1, "mean": 1, "add": 1, "rsqrt": 1,
                            "mul": 1}, dict(mode.c)
