"""The MLA latent decode attention (minfer/ops/cuda/attention_mla.py) on the GPU in bf16, against
softmax(scale q K^T) V written out here in float64 from the same bf16 values: K rows of 512 + 64
dims (one KV head), V = K[:, :512] (a view, as deepseek2's cache holds it), 16 (V2-Lite) and 128 (V3)
query heads; the key count as an int and as a device tensor under a CUDA graph; the dispatch of
ops/cuda/attention.py; float32 caches (IEEE dots).

Tolerance (bf16): q and K are the same bf16 values in the kernel and the reference, and the
scores' dots accumulate their exact bf16 products in float32 (relative error ~1e-6: nothing at
this scale). The kernel rounds two things: each softmax weight p to bf16 before the p.V dot
(relative error <= 2^-9: the output's error at most 2^-9 * sum_j p_j |v_j| / l <= 2^-9 max|v|), and
the output to bf16 (2^-9 |o|). With N(0, 1) values, max|v| < 6 over these caches, so
|err| <= 2^-9 (6 + 6) ~ 0.023 in the worst case: ATOL 0.025. The rounding errors of the weights have
random signs, so the typical error is far below: the norm over all outputs is held to 1e-2 of the
reference's norm. (Both roundings emulated in float64 on the CPU at H 16 / 128 and 1000 .. 32768 keys:
max error 0.0009-0.0018, norm 0.0017-0.0020.) A wrong kernel (a key missed or counted twice, a split dropped, a wrong scale)
moves the output by O(1) / n_keys .. O(1), well past both at these lengths (checked with the kernel
told one key fewer: test_a_missing_key_is_caught).
"""

from __future__ import annotations

import importlib
import math

import pytest
import torch

pytestmark = pytest.mark.gpu

R, DR = 512, 64
ATOL = 0.025
NORM_TOL = 1e-2


def want(q, k, dv, n, scale):
    """softmax(scale q . K[:n]^T) K[:n, :dv] in float64 -> (1, H, dv)."""
    s = torch.einsum("hd,sd->hs", q[0].double(), k[:n, 0].double()) * scale
    return (torch.softmax(s, dim=-1) @ k[:n, 0, :dv].double())[None]


def case(h, n, rows=None, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed * 100003 + h * 1009 + n)
    k = torch.randn(rows or n, 1, R + DR, device="cuda", generator=g).to(dtype)
    q = torch.randn(1, h, R + DR, device="cuda", generator=g).to(dtype)
    return q, k, 1.0 / math.sqrt(192)       # V2-Lite / V3's 1 / sqrt(qk_nope + qk_rope) (mscale 1)


def check(got, ref, tag):
    err = (got.double() - ref).abs().max().item()
    rel = ((got.double() - ref).norm() / ref.norm()).item()
    assert err < ATOL and rel < NORM_TOL, (tag, err, rel)


@pytest.mark.parametrize("h", [16, 128])
@pytest.mark.parametrize("n", [1, 37, 300, 1000, 4096, 32768])
@pytest.mark.parametrize("splits", [None, 1, 5])
def test_mla_decode_bf16(h, n, splits):
    from minfer.ops.cuda.attention_mla import mla_decode

    if splits == 1 and n > 4096:
        pytest.skip("one program a head block over 32k keys: slow, and the same code as 4096")
    q, k, scale = case(h, n)
    got = mla_decode(q, k, R, n - 1, scale, n_keys_add=1, n_split=splits)
    assert got.shape == (1, h, R) and got.dtype == torch.bfloat16
    check(got, want(q, k, R, n, scale), (h, n, splits))


@pytest.mark.parametrize("h", [16, 128])
def test_mla_decode_float32_cache(h):
    from minfer.ops.cuda.attention_mla import mla_decode

    for n in (1, 300, 3000):
        q, k, scale = case(h, n, dtype=torch.float32, seed=1)
        got = mla_decode(q, k, R, n - 1, scale, n_keys_add=1)
        assert (got.double() - want(q, k, R, n, scale)).abs().max() < 1e-4


def test_a_missing_key_is_caught():
    """The tolerance separates: one key fewer than the reference's count fails it."""
    from minfer.ops.cuda.attention_mla import mla_decode

    q, k, scale = case(16, 37, seed=2)
    got = mla_decode(q, k, R, 34, scale, n_keys_add=1)        # 36 keys (a float64 check of such cases on
    # the CPU: max error 0.1-0.9, norm 0.05-0.2, against the emulated bf16 rounding's 0.002 / 0.002)
    ref = want(q, k, R, 37, scale)
    assert (got.double() - ref).abs().max() > ATOL or ((got.double() - ref).norm() / ref.norm()) > NORM_TOL


@pytest.mark.parametrize("h", [16, 128])
def test_mla_decode_graph_replays_at_other_lengths(h):
    """A CUDA graph captured once with the position in a device tensor (the decode graph's step:
    the grid covers the cache's rows) replays right at other positions; rows past the position hold
    garbage."""
    from minfer.ops.cuda.attention_mla import mla_decode

    S = 4096
    q, k, scale = case(h, S, seed=3)
    pos = torch.zeros(1, dtype=torch.int64, device="cuda")
    mla_decode(q, k, R, pos, scale, n_keys_add=1)                    # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = mla_decode(q, k, R, pos, scale, n_keys_add=1)
    clean = k.clone()
    for p in (0, 5, 63, 64, 1000, 4095):
        k.copy_(clean)
        k[p + 1:] = 1e4
        pos.fill_(p)
        g.replay()
        torch.cuda.synchronize()
        check(out, want(q, k, R, p + 1, scale), (h, p))


def test_attention_dispatch_counts_the_kernel():
    from minfer.ops import paths

    A = importlib.import_module("minfer.ops.cuda.attention")
    q, k, scale = case(128, 2000, seed=4)
    paths.reset()
    got = A.attention(q, k, k[..., :R], 1999, scale=scale)
    check(got, want(q, k, R, 2000, scale), "dispatch")
    snap = paths.snapshot()
    assert snap["counts"] == {"attention.mla.decode.triton": 1} and not snap["fallbacks"], snap


# ---- the paged variant (minfer/ops/cuda/paged_attention_mla.py: the batch engine's decode rows) ----

def paged_case(B, h, page, max_len, seed=0, extra=1):
    """B rows of random lengths 1..max_len scattered into shuffled bf16 pages (block 0 reserved,
    every unused slot 1e4): (q (B, h, R + DR), pages, block tables, lengths, per-row keys)."""
    g = torch.Generator(device="cuda").manual_seed(seed * 7919 + B * 31 + h)
    lens = torch.randint(1, max_len + 1, (B,), generator=g, device="cuda").to(torch.int32)
    width = -(-max_len // page) + extra
    n_blocks = int(sum(-(-int(n) // page) for n in lens)) + 8
    kp = torch.full((n_blocks, page, 1, R + DR), 1e4, device="cuda", dtype=torch.bfloat16)
    perm = (torch.randperm(n_blocks - 1, device="cuda", generator=g) + 1).tolist()
    bt = torch.zeros(B, width, dtype=torch.int32, device="cuda")
    keys = []
    for b in range(B):
        n = int(lens[b])
        nb = -(-n // page)
        blocks = [perm.pop() for _ in range(nb)]
        bt[b, :nb] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(n, 1, R + DR, device="cuda", generator=g).to(torch.bfloat16)
        flat = kp[torch.tensor(blocks, device="cuda")].view(nb * page, 1, R + DR)
        flat[:n] = k
        kp[torch.tensor(blocks, device="cuda")] = flat.view(nb, page, 1, R + DR)
        keys.append(k)
    q = torch.randn(B, h, R + DR, device="cuda", generator=g).to(torch.bfloat16)
    return q, kp, bt, lens, keys


@pytest.mark.parametrize("B,h,page,max_len,splits", [(1, 16, 16, 3000, None), (37, 16, 16, 700, None),
                                                     (64, 128, 16, 300, None), (5, 128, 32, 1000, 1),
                                                     (160, 16, 16, 900, None), (9, 128, 16, 4096, 7)])
def test_paged_mla_decode_bf16(B, h, page, max_len, splits):
    """The paged MLA kernel in bf16 (V2-Lite's 16 heads, V3's 128) against the float64 formula row
    by row (tests/runtime/test_paged_mla.py checks it in Triton's interpreter)."""
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

    q, kp, bt, lens, keys = paged_case(B, h, page, max_len)
    scale = 1.0 / math.sqrt(192)
    got = paged_mla_decode(q, kp, kp[..., :R], bt, lens, scale=scale, n_split=splits)
    assert got.shape == (B, h, R) and got.dtype == torch.bfloat16
    for b, k in enumerate(keys):
        check(got[b:b + 1], want(q[b:b + 1], k, R, k.shape[0], scale), (B, h, b))


@pytest.mark.parametrize("h", [16, 128])
def test_paged_mla_decode_graph_replays_at_other_lengths(h):
    """Captured once (the batch decode graph's step: the grid from the block table's width),
    replayed right at other lengths with the same tables."""
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

    q, kp, bt, lens, keys = paged_case(8, h, 16, 2000, seed=2, extra=4)
    full = lens.clone()
    scale = 1.0 / math.sqrt(192)
    paged_mla_decode(q, kp, kp[..., :R], bt, lens, scale=scale)          # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = paged_mla_decode(q, kp, kp[..., :R], bt, lens, scale=scale)
    for frac in (1.0, 0.5, 0.01):
        lens.copy_(torch.clamp((full.float() * frac).to(torch.int32), min=1))
        g.replay()
        torch.cuda.synchronize()
        for b, k in enumerate(keys):
            n = int(lens[b])
            check(out[b:b + 1], want(q[b:b + 1], k, R, n, scale), (h, frac, b))
