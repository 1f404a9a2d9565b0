"""The Mamba-2 decode step's kernels (minfer/ops/cuda/ssm_step.py) on the GPU against models/mamba2.py's
torch step on the same device, at the real models' shapes (Nemotron Nano 9B v2: 128 heads of 80,
N 128, 8 groups; Mamba-Codestral: 128 x 64, 8 groups; Granite 4.0 H: 1 group; a state of 256), the
in-projection's rows in float32 and bf16 (the kernel reads them in their dtype, the torch step their
float32 values), a batch of rows in scattered slots and the single sequence's masked step; then the
kernel in a CUDA graph replayed at new device positions. The interpreter run is
tests/ops/test_ssm_step_interpreted.py."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
DEV = "cuda"

# (H, P, N, G, K)
SHAPES = [(128, 80, 128, 8, 4), (128, 64, 128, 8, 4), (64, 64, 128, 1, 4), (24, 64, 256, 1, 4)]


def _weights(H, P, N, G, K, seed):
    from minfer.models.mamba2 import Mamba2Dims, Mamba2Weights

    gen = torch.Generator().manual_seed(seed)
    d = Mamba2Dims(d_inner=H * P, d_state=N, n_heads=H, n_groups=G, d_conv=K)
    W = d.conv_dim
    w = Mamba2Weights(ssm_in=None, conv_w=torch.randn(K, W, generator=gen) * 0.5,
                      conv_b=torch.randn(W, generator=gen) * 0.3, dt_bias=torch.randn(H, generator=gen),
                      A=-torch.rand(H, generator=gen) * 2 - 0.1, D=torch.randn(H, generator=gen),
                      norm=torch.randn(H * P, generator=gen), ssm_out=None)
    for f in ("conv_w", "conv_b", "dt_bias", "A", "D", "norm"):
        setattr(w, f, getattr(w, f).to(DEV))
    return d, w, gen


def _close(got, want, tol=1e-5):
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)) <= tol


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_rows_match_torch_step(shape, dtype):
    from minfer.models.mamba2 import _decode_rows, gated_group_norm
    from minfer.ops import paths
    from minfer.ops.cuda.ssm_step import ssm_gate_norm, ssm_step

    H, P, N, G, K = shape
    d, w, gen = _weights(H, P, N, G, K, sum(shape))
    S, T = 9, 5
    slots = torch.tensor([7, 2, 5, 1, 8], device=DEV)
    pos = torch.tensor([0, 1, 3, 40, 1001], device=DEV)
    zx = torch.randn(T, d.in_dim, generator=gen).to(DEV, dtype)
    conv = torch.randn(S, K, d.conv_dim, generator=gen).to(DEV)
    ssm = torch.randn(S, 2, H, P, N, generator=gen).to(DEV)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    z, xbc, dt = zx.float().split([d.d_inner, d.conv_dim, H], dim=-1)
    x, y = _decode_rows(xbc, dt, w, d, conv_ref, ssm_ref, slots, pos)
    want = (y + x * w.D.view(1, H, 1)).reshape(T, -1)
    paths.reset()
    got = ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos, slots)
    torch.cuda.synchronize()
    assert _close(got, want) and torch.equal(conv, conv_ref) and _close(ssm, ssm_ref)
    out = ssm_gate_norm(got, zx, w.norm, G, 1e-5, dtype)
    ref = gated_group_norm(want, z, w.norm, G, 1e-5).to(dtype)
    assert out.dtype == dtype and _close(out.float(), ref.float(), 1e-5 if dtype == torch.float32 else 1e-2)
    c = paths.snapshot()["counts"]
    assert c.get("ssm.step.triton") == 1 and c.get("ssm.norm.triton") == 1


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_single_sequence_masked_steps(shape):
    from minfer.models.mamba2 import conv_scan
    from minfer.ops.cuda.ssm_step import ssm_step

    H, P, N, G, K = shape
    d, w, gen = _weights(H, P, N, G, K, 1 + sum(shape))
    conv = torch.randn(K, d.conv_dim, generator=gen).to(DEV)          # stale values before position 0
    ssm = torch.randn(2, H, P, N, generator=gen).to(DEV)
    conv_ref, ssm_ref = conv.clone(), ssm.clone()
    for p in range(6):
        pos = torch.tensor([p], device=DEV)
        zx = torch.randn(1, d.in_dim, generator=gen).to(DEV)
        _, xbc, dt = zx.split([d.d_inner, d.conv_dim, H], dim=-1)
        x, y = conv_scan(xbc, dt, w, d, (conv_ref, ssm_ref), pos)
        got = ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos)
        assert _close(got, (y + x * w.D.view(1, H, 1)).reshape(1, -1)), p
        assert torch.equal(conv, conv_ref) and _close(ssm, ssm_ref), p


def test_step_in_cuda_graph_at_new_positions():
    """Captured once (after a warm-up at the same position, which the rings allow), replayed at
    positions 0..7 copied into the static tensor: each replay equals an eager step."""
    from minfer.ops.cuda.ssm_step import ssm_step

    H, P, N, G, K = 32, 80, 128, 4, 4
    d, w, gen = _weights(H, P, N, G, K, 5)
    slots = torch.tensor([3, 1], device=DEV)
    pos = torch.zeros(2, dtype=torch.long, device=DEV)
    zx = torch.zeros(2, d.in_dim, device=DEV)
    conv = torch.zeros(4, K, d.conv_dim, device=DEV)
    ssm = torch.zeros(4, 2, H, P, N, device=DEV)
    conv_e, ssm_e = conv.clone(), ssm.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos, slots)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ssm_step(zx, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, pos, slots)
    conv.zero_()
    ssm.zero_()
    for p in range(8):
        x = torch.randn(2, d.in_dim, generator=gen).to(DEV)
        zx.copy_(x)
        pos.fill_(p)
        g.replay()
        want = ssm_step(x, w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv_e, ssm_e, pos.clone(), slots)
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(conv, conv_e) and torch.equal(ssm, ssm_e), p
