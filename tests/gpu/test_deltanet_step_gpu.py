"""The gated DeltaNet decode step's kernel (minfer/ops/cuda/deltanet_step.py) on the GPU against
models/deltanet.py's torch step on the same device, at the real models' shapes (Qwen3-Next-80B: 16 key
/ 32 value heads of 128; Qwen3.5 MoE: 16 / 64; 16 / 16 and 16 / 48), both head orders, the fused
beta/alpha row, the projections' rows in float32 and bf16 (the kernel reads them in their dtype, the
torch step their float32 values), one and several column blocks per head: a batch of rows in scattered
slots, the single sequence's masked step, and the kernel in a CUDA graph replayed at new device
positions. The interpreter run is tests/ops/test_deltanet_step_interpreted.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.gpu
DEV = "cuda"
EPS = 1e-6

# (Hk, Hv, Dk, tiled, fused_ba)
SHAPES = [(16, 32, 128, False, True), (16, 64, 128, True, False), (16, 16, 128, True, False),
          (16, 48, 128, True, False)]


def _setup(Hk, Hv, Dk, seed, K=4):
    from minfer.models.deltanet import DeltaNetDims, DeltaNetWeights

    gen = torch.Generator().manual_seed(seed)
    d = DeltaNetDims(d_conv=K, d_inner=Hv * Dk, d_state=Dk, n_v_heads=Hv, n_k_heads=Hk)
    w = DeltaNetWeights(attn_qkv=None, attn_gate=None, ssm_beta=None, ssm_alpha=None,
                        conv_w=(torch.randn(K, d.conv_dim, generator=gen) * 0.5).to(DEV),
                        dt_bias=torch.randn(Hv, generator=gen).to(DEV),
                        A=(-torch.rand(Hv, generator=gen) * 2 - 0.1).to(DEV),
                        norm=torch.randn(Dk, generator=gen).to(DEV), ssm_out=None)
    return d, w, gen


def _rows(d, B, fused, dtype, gen):
    from minfer.models.deltanet import split_ba

    qkv = (torch.randn(B, d.conv_dim, generator=gen) * 2).to(DEV, dtype)
    z = torch.randn(B, d.d_inner, generator=gen).to(DEV, dtype)
    nb = 2 * d.n_v_heads if fused else d.n_v_heads
    b = (torch.randn(B, nb, generator=gen) * 2).to(DEV, dtype)
    a = None if fused else (torch.randn(B, nb, generator=gen) * 2).to(DEV, dtype)
    bb, aa = split_ba(b.float(), d.n_k_heads, d.n_v_heads) if fused else (b.float(), a.float())
    return qkv, z, b, a, torch.sigmoid(bb), aa


def _close(got, want, tol=1e-4):
    return float((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)) <= tol


def _step(qkv, z, b, a, positions, conv, w, ssm, d, tiled, fused, slots=None, block_v=None, out_dtype=None):
    from minfer.ops.cuda.deltanet_step import deltanet_step

    return deltanet_step(qkv, z, b, a, positions, conv, w.conv_w, ssm, w.dt_bias, w.A, w.norm,
                         n_k_heads=d.n_k_heads, tiled=tiled, eps=EPS, slots=slots, fused_ba=fused,
                         out_dtype=out_dtype, block_v=block_v)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_v", [None, 32])
def test_decode_rows_of_scattered_slots_gpu(shape, dtype, block_v):
    from minfer.models.deltanet import _decode_rows, gated_head_norm

    Hk, Hv, Dk, tiled, fused = shape
    d, w, gen = _setup(Hk, Hv, Dk, Hk + Hv)
    conv = torch.randn(9, d.d_conv, d.conv_dim, generator=gen).to(DEV)
    ssm = (torch.randn(9, 2, Hv, Dk, Dk, generator=gen) * 0.1).to(DEV)
    slots, positions = torch.tensor([5, 2, 8, 1], device=DEV), torch.tensor([0, 7, 2, 300], device=DEV)
    qkv, z, b, a, beta, aa = _rows(d, 4, fused, dtype, gen)
    rc, rs = conv.clone(), ssm.clone()
    o = _decode_rows(qkv.float(), F.softplus(aa + w.dt_bias) * w.A, beta, w, d, rc, rs, slots, positions, tiled)
    want = gated_head_norm(o, z.float().view(4, Hv, Dk), w.norm, EPS).reshape(4, -1)
    got = _step(qkv, z, b, a, positions, conv, w, ssm, d, tiled, fused, slots, block_v)
    torch.cuda.synchronize()
    assert _close(got, want) and _close(conv, rc, 1e-6) and _close(ssm, rs)


@pytest.mark.parametrize("shape", SHAPES[:2])
@pytest.mark.parametrize("pos", [0, 2, 9])
def test_single_sequence_masked_gpu(shape, pos):
    from minfer.models.deltanet import conv_scan, gated_head_norm

    Hk, Hv, Dk, tiled, fused = shape
    d, w, gen = _setup(Hk, Hv, Dk, pos + 1)
    conv = torch.randn(d.d_conv, d.conv_dim, generator=gen).to(DEV)
    ssm = (torch.randn(2, Hv, Dk, Dk, generator=gen) * 0.1).to(DEV)
    qkv, z, b, a, beta, aa = _rows(d, 1, fused, torch.float32, gen)
    positions = torch.tensor([pos], device=DEV)
    rc, rs = conv.clone(), ssm.clone()
    o = conv_scan(qkv, F.softplus(aa + w.dt_bias) * w.A, beta, w, d, (rc, rs), positions, tiled)
    want = gated_head_norm(o, z.view(1, Hv, Dk), w.norm, EPS).reshape(1, -1)
    got = _step(qkv, z, b, a, positions, conv, w, ssm, d, tiled, fused, out_dtype=torch.float32)
    torch.cuda.synchronize()
    assert _close(got, want) and _close(conv, rc, 1e-6) and _close(ssm, rs)


def test_kernel_in_a_cuda_graph_gpu():
    """Captured once, replayed at device positions 5 then 6 of rows in slots 3 and 1: each replay equals
    the eager kernel on copies of the rings."""
    Hk, Hv, Dk, tiled, fused = SHAPES[0]
    d, w, gen = _setup(Hk, Hv, Dk, 11)
    conv = torch.randn(4, d.d_conv, d.conv_dim, generator=gen).to(DEV)
    ssm = (torch.randn(4, 2, Hv, Dk, Dk, generator=gen) * 0.1).to(DEV)
    qkv, z, b, a, _, _ = _rows(d, 2, fused, torch.bfloat16, gen)
    slots, positions = torch.tensor([3, 1], device=DEV), torch.tensor([4, 4], device=DEV)
    _step(qkv, z, b, a, positions, conv.clone(), w, ssm.clone(), d, tiled, fused, slots)   # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    c0, s0 = conv.clone(), ssm.clone()
    with torch.cuda.graph(graph):
        out = _step(qkv, z, b, a, positions, conv, w, ssm, d, tiled, fused, slots)
    conv.copy_(c0)
    ssm.copy_(s0)
    for p in (5, 6):
        rc, rs = conv.clone(), ssm.clone()
        want = _step(qkv, z, b, a, torch.tensor([p, p], device=DEV), rc, w, rs, d, tiled, fused, slots)
        positions.fill_(p)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, want) and torch.equal(conv, rc) and torch.equal(ssm, rs)
