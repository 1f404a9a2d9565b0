"""The Mamba-1 decode step's kernels (minfer/ops/cuda/ssm1_step.py) on the GPU against models/mamba1.py's
torch step on the same device, at the real models' shapes (Falcon-Mamba-7B: d_inner 8192, N 16, K 4;
mamba-2.8b: 5120; mamba-130m: 1536), the in-projection's rows in float32 and bf16 (the kernels read them
in their dtype, the torch step their float32 values), a batch of rows in scattered slots and the single
sequence's masked steps, Falcon-Mamba's B/C norms; then both kernels in a CUDA graph replayed at new device
positions. The interpreter run is tests/ops/test_ssm1_step_interpreted.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
DEV = "cuda"

SHAPES = [(8192, 16, 4), (5120, 16, 4), (1536, 16, 4)]      # (di, N, K)


def _weights(di, N, K, seed):
    from minfer.models.mamba1 import Mamba1Dims, Mamba1Weights

    gen = torch.Generator().manual_seed(seed)
    d = Mamba1Dims(d_conv=K, d_inner=di, d_state=N, dt_rank=di // 32)
    w = Mamba1Weights(ssm_in=None, conv_w=torch.randn(K, di, generator=gen) * 0.5, conv_b=torch.randn(di, generator=gen),
                      ssm_x=None, ssm_dt=None, dt_b=torch.randn(di, generator=gen),
                      A=-torch.rand(di, N, generator=gen) * 2 - 0.1, D=torch.randn(di, generator=gen), ssm_out=None)
    for f in ("conv_w", "conv_b", "dt_b", "A", "D"):
        setattr(w, f, getattr(w, f).to(DEV))
    return d, w, gen


def _close(got, want, tol=1e-5):
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)) <= tol


def _rms(t, eps=1e-5):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("norm", [False, True])
def test_decode_rows_match_torch_step(shape, dtype, norm):
    from minfer.models.mamba1 import conv_rows, scan_rows
    from minfer.ops import paths
    from minfer.ops.cuda.ssm1_step import ssm1_conv_step, ssm1_scan_step

    di, N, K = shape
    d, w, gen = _weights(di, N, K, sum(shape) + norm)
    S, T = 9, 5
    slots = torch.tensor([7, 2, 5, 1, 8], device=DEV)
    pos = torch.tensor([0, 1, 3, 40, 1001], device=DEV)
    xz = torch.randn(T, 2 * di, generator=gen).to(DEV, dtype)
    dtr = torch.randn(T, di, generator=gen).to(DEV, dtype)
    B, C = (torch.randn(T, N, generator=gen).to(DEV) for _ in range(2))
    conv = torch.randn(S, K, di, generator=gen).to(DEV)
    ssm = torch.randn(S, 2, di, N, generator=gen).to(DEV)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    x_ref = conv_rows(xz[:, :di].float(), w, conv_ref, slots, pos)
    Bn, Cn = (_rms(B), _rms(C)) if norm else (B, C)
    y = scan_rows(x_ref, F.softplus(dtr.float() + w.dt_b), Bn, Cn, w.A, ssm_ref, slots, pos)
    want = (y + x_ref * w.D) * F.silu(xz[:, di:].float())
    paths.reset()
    x = ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos, slots)
    got = ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos, slots, dtype,
                         norm_eps=1e-5 if norm else None)
    torch.cuda.synchronize()
    assert _close(x, x_ref) and torch.equal(conv, conv_ref) and _close(ssm, ssm_ref)
    assert got.dtype == dtype and _close(got.float(), want, 1e-5 if dtype == torch.float32 else 1e-2)
    c = paths.snapshot()["counts"]
    assert c.get("ssm1.conv.triton") == 1 and c.get("ssm1.scan.triton") == 1


@pytest.mark.parametrize("shape", SHAPES[::2])
def test_single_sequence_masked_steps(shape):
    from minfer.models.mamba1 import conv_seq, scan_chunked
    from minfer.ops.cuda.ssm1_step import ssm1_conv_step, ssm1_scan_step

    di, N, K = shape
    d, w, gen = _weights(di, N, K, 1 + sum(shape))
    conv = torch.randn(K, di, generator=gen).to(DEV)                  # stale values before position 0
    ssm = torch.randn(2, di, N, generator=gen).to(DEV)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    for p in range(6):
        pos = torch.tensor([p], device=DEV)
        xz, dtr = torch.randn(1, 2 * di, generator=gen).to(DEV), torch.randn(1, di, generator=gen).to(DEV)
        B, C = (torch.randn(1, N, generator=gen).to(DEV) for _ in range(2))
        x_ref = conv_seq(xz[:, :di], w, conv_ref, pos)
        y = scan_chunked(x_ref, F.softplus(dtr + w.dt_b), B, C, w.A, ssm_ref, pos)
        x = ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos)
        got = ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos)
        assert _close(got, (y + x_ref * w.D) * F.silu(xz[:, di:])), p
        assert torch.equal(conv, conv_ref) and _close(ssm, ssm_ref), p


def test_step_in_cuda_graph_at_new_positions():
    """Both kernels captured once (after a warm-up at the same position, which the rings allow),
    replayed at positions 0..7 copied into the static tensor: each replay equals an eager step."""
    from minfer.ops.cuda.ssm1_step import ssm1_conv_step, ssm1_scan_step

    di, N, K = 2048, 16, 4
    d, w, gen = _weights(di, N, K, 5)
    slots = torch.tensor([3, 1], device=DEV)
    pos = torch.zeros(2, dtype=torch.long, device=DEV)
    xz, dtr = torch.zeros(2, 2 * di, device=DEV), torch.zeros(2, di, device=DEV)
    B, C = torch.zeros(2, N, device=DEV), torch.zeros(2, N, device=DEV)
    conv, ssm = torch.zeros(4, K, di, device=DEV), torch.zeros(4, 2, di, N, device=DEV)
    conv_e, ssm_e = conv.clone(), ssm.clone()

    def step(xz, dtr, B, C, conv, ssm, pos):
        x = ssm1_conv_step(xz, w.conv_w, w.conv_b, conv, pos, slots)
        return ssm1_scan_step(x, dtr, w.dt_b, B, C, w.A, w.D, xz, ssm, pos, slots, torch.bfloat16, norm_eps=1e-5)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(xz, dtr, B, C, conv, ssm, pos)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step(xz, dtr, B, C, conv, ssm, pos)
    conv.zero_()
    ssm.zero_()
    for p in range(8):
        new = [torch.randn(t.shape, generator=gen).to(DEV) for t in (xz, dtr, B, C)]
        for t, v in zip((xz, dtr, B, C), new):
            t.copy_(v)
        pos.fill_(p)
        g.replay()
        want = step(*new, conv_e, ssm_e, pos.clone())
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(conv, conv_e) and torch.equal(ssm, ssm_e), p
