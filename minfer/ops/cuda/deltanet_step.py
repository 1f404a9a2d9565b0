"""The one-token decode step of the gated DeltaNet mixer (models/deltanet.py) as one Triton launch.

For each row b (one token at position p = positions[b] of the sequence whose state is in slot
slots[b]: the batch engine's pool, runtime/paged_state.py; or the single sequence's rings,
runtime/kv_cache.py `state_layers`) and value head h, one program per (b, h, block of Dv columns):

    x = qkv[b]                                       the in-projection's row (any float dtype)
    c = silu(sum_{j<K-1} w[j] ring[(p-K+1+j) % K] + w[K-1] x)   for the q, k channels of key head
                                                     kh(h) and the v channels of head h
    ring[p % K] = x                                  (rows p-K+1 .. p-1 read, never row p % K: no
                                                     program reads what another writes)
    q = l2norm(c_q) / sqrt(Dk), k = l2norm(c_k)      x * rsqrt(sum x^2 + 1e-6) (HF's l2norm)
    beta = sigmoid(b), g = A * softplus(a + dt_bias) (torch's softplus: x above 20 as is)
    S = exp(g) S[(p-1) % 2]; S += k (beta (v - S^T k))^T; S[p % 2] = S; o = S^T q
    y = o * rsqrt(mean(o^2) + eps) * norm_w * silu(z)  the gated RMSNorm per head (one block of Dv)

with kh(h) = h % Hk (tiled: qwen35's reordered value heads) or h // (Hv / Hk). The q/k channels of
a key head are written to the ring by one program (the first value head reading it, first block).
masked (the single sequence): the ring rows before position 0 and the state before position 0 read
as zeros (mamba2.causal_conv / _initial_state); the batch engine's slots are zeroed when taken
(masked off). The state ring is float32 (Dk, Dv) per head, updated in place. Nothing is read on the
host (positions and slots are device tensors): a CUDA graph replays the launch.

beta and alpha come from two (B, Hv) rows or from qwen3next's fused (B, 2 Hv) ssm_ba row (per key
head Hv/Hk beta values then Hv/Hk alpha values: deltanet.split_ba), read in place.

block_v < Dv splits the columns over more programs (more parallel for one row) and runs the gated
norm as a second launch. Launch paths: `deltanet.step.triton` (the conv, the norms, the delta rule
and, with one block, the gated norm), `deltanet.norm.triton` (the gated norm's own launch).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops import paths

@triton.jit
def _silu(x):
    return x / (1.0 + tl.exp(-x))


@triton.jit
def _conv(xrow, ring, conv_w, c, cm, p, stride_rk, W, K: tl.constexpr, MASKED: tl.constexpr):
    """silu of the causal conv of channels c (mask cm) at position p -> (silu(conv), the row x)."""
    x = tl.load(xrow + c, mask=cm, other=0.0).to(tl.float32)
    acc = tl.zeros(c.shape, tl.float32)
    for j in tl.static_range(K - 1):
        pos = p - (K - 1) + j
        m = cm
        if MASKED:
            m = cm & (pos >= 0)
        prev = tl.load(ring + ((pos + K) % K) * stride_rk + c, mask=m, other=0.0)
        acc += prev * tl.load(conv_w + j * W + c, mask=cm, other=0.0)
    acc += x * tl.load(conv_w + (K - 1) * W + c, mask=cm, other=0.0)
    return _silu(acc), x


@triton.jit
def _deltanet_step_kernel(qkv, z, b_in, a_in, positions, slots, conv_ring, conv_w, s_ring, dt_bias, A, norm_w, out,
                          stride_x, stride_z, stride_b, stride_a, stride_o,
                          stride_cs, stride_ck, stride_ss, stride_sr, stride_sh, stride_sk,
                          W, KD, Hk, Hv, Dk, Dv, R_BA, GS_BA, A_OFF, RS, q_scale, eps,
                          K: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, TILED: tl.constexpr,
                          MASKED: tl.constexpr, HAS_SLOTS: tl.constexpr, NORM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    vb = tl.program_id(2)
    p = tl.load(positions + row).to(tl.int64)
    if HAS_SLOTS:
        slot = tl.load(slots + row).to(tl.int64)
    else:
        slot = row * 0
    if TILED:
        kh = h % Hk
        first = h < Hk
    else:
        kh = h // (Hv // Hk)
        first = (h % (Hv // Hk)) == 0
    dk = tl.arange(0, BK)
    km = dk < Dk
    dv = vb * BV + tl.arange(0, BV)
    vm = dv < Dv

    # the conv of this head's channels; the current row into the ring (q/k channels by one program)
    xrow = qkv + row * stride_x
    ring = conv_ring + slot * stride_cs
    qc = kh * Dk + dk
    kc = KD + kh * Dk + dk
    vc = 2 * KD + h * Dv + dv
    q, xq = _conv(xrow, ring, conv_w, qc, km, p, stride_ck, W, K, MASKED)
    k, xk = _conv(xrow, ring, conv_w, kc, km, p, stride_ck, W, K, MASKED)
    v, xv = _conv(xrow, ring, conv_w, vc, vm, p, stride_ck, W, K, MASKED)
    wrow = ring + (p % K) * stride_ck
    tl.store(wrow + vc, xv, mask=vm)
    wqk = km & (first & (vb == 0))
    tl.store(wrow + qc, xq, mask=wqk)
    tl.store(wrow + kc, xk, mask=wqk)

    q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)) * q_scale   # HF l2norm's 1e-6 (deltanet.L2_EPS)
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))

    # beta = sigmoid(b), g = A * softplus(a + dt_bias)
    hb = (h // R_BA) * GS_BA + h % R_BA
    bb = tl.load(b_in + row * stride_b + hb).to(tl.float32)
    xa = tl.load(a_in + row * stride_a + A_OFF + hb).to(tl.float32) + tl.load(dt_bias + h).to(tl.float32)
    beta = 1.0 / (1.0 + tl.exp(-bb))
    sp = tl.where(xa > 20.0, xa, tl.where(xa < -15.0, tl.exp(xa), tl.log(1.0 + tl.exp(xa))))
    decay = tl.exp(sp * tl.load(A + h).to(tl.float32))

    # the delta rule on the state after p - 1 (ring slot (p-1) % RS), written at p % RS
    sbase = s_ring + slot * stride_ss + h * stride_sh
    offs = dk[:, None] * stride_sk + dv[None, :]
    m2 = km[:, None] & vm[None, :]
    S = tl.load(sbase + ((p + RS - 1) % RS) * stride_sr + offs, mask=m2, other=0.0)
    if MASKED:
        S = tl.where(p > 0, S, 0.0)
    S = S * decay
    kv = tl.sum(S * k[:, None], axis=0)                       # S^T k  (BV,)
    delta = (v - kv) * beta
    S = S + k[:, None] * delta[None, :]
    tl.store(sbase + (p % RS) * stride_sr + offs, S, mask=m2)
    o = tl.sum(S * q[:, None], axis=0)                        # S^T q

    ocols = out + row * stride_o + h * Dv + dv
    if NORM:
        zz = tl.load(z + row * stride_z + h * Dv + dv, mask=vm, other=0.0).to(tl.float32)
        nw = tl.load(norm_w + dv, mask=vm, other=0.0).to(tl.float32)
        r = 1.0 / tl.sqrt(tl.sum(o * o, axis=0) / Dv + eps)
        tl.store(ocols, (o * r * nw * _silu(zz)).to(out.dtype.element_ty), mask=vm)
    else:
        tl.store(ocols, o, mask=vm)


@triton.jit
def _gated_norm_kernel(o, z, norm_w, out, stride_o, stride_z, stride_out, Dv, eps, BV: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    dv = tl.arange(0, BV)
    vm = dv < Dv
    x = tl.load(o + row * stride_o + h * Dv + dv, mask=vm, other=0.0)
    zz = tl.load(z + row * stride_z + h * Dv + dv, mask=vm, other=0.0).to(tl.float32)
    nw = tl.load(norm_w + dv, mask=vm, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / Dv + eps)
    tl.store(out + row * stride_out + h * Dv + dv, (x * r * nw * _silu(zz)).to(out.dtype.element_ty), mask=vm)


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def deltanet_step(qkv, z, b, a, positions, conv_ring, conv_w, s_ring, dt_bias, A, norm_w, *, n_k_heads: int,
                  tiled: bool, eps: float, slots=None, fused_ba: bool = False, out_dtype=None,
                  block_v: int | None = None) -> torch.Tensor:
    """The decode step of B rows -> y (B, Hv*Dv) in out_dtype (None: float32), the gated-normed heads
    before the out projection.

    qkv (B, conv_dim), z (B, Hv*Dv): the in-projections' rows (any float dtype, read as float32).
    b, a (B, Hv): beta's and alpha's inputs; fused_ba: b is qwen3next's (B, 2 Hv) ssm_ba row and a is
    ignored. positions (B,) int64 on the device. conv_ring (K, conv_dim) and s_ring (2, Hv, Dk, Dv):
    one sequence's rings (masked at position 0; B must be 1) with slots None, or the pools (S, K,
    conv_dim), (S, 2, Hv, Dk, Dv) and slots (B,) int64 on the device (not masked: zeroed slots).
    conv_w (K, conv_dim) float32; dt_bias, A (Hv,); norm_w (Dv,). Rings updated in place."""
    B, W = qkv.shape
    single = slots is None
    if single:
        if conv_ring.dim() != 2 or s_ring.dim() != 4 or B != 1:
            raise MinferError("deltanet_step: one sequence's rings (K, conv_dim), (2, Hv, Dk, Dv) take one row")
        conv_ring, s_ring = conv_ring.unsqueeze(0), s_ring.unsqueeze(0)
    K = conv_w.shape[0]
    _, RS, Hv, Dk, Dv = s_ring.shape
    Hk = n_k_heads
    KD = Hk * Dk
    if (conv_ring.shape[1:] != (K, W) or tuple(conv_w.shape) != (K, W) or W != 2 * KD + Hv * Dv or Hv % Hk
            or conv_ring.stride(-1) != 1 or s_ring.stride(-1) != 1 or RS < 2):
        raise MinferError(f"deltanet_step: rings {tuple(conv_ring.shape)}, {tuple(s_ring.shape)}, conv weight "
                          f"{tuple(conv_w.shape)} and rows {tuple(qkv.shape)} do not fit {Hk} key heads")
    if conv_w.dtype != torch.float32 or conv_ring.dtype != torch.float32 or s_ring.dtype != torch.float32:
        raise MinferError("deltanet_step: the conv weight and the rings must be float32")
    qkv, z, b = _rows(qkv), _rows(z), _rows(b)
    if fused_ba:
        a, a_off, r_ba, gs_ba = b, Hv // Hk, Hv // Hk, 2 * (Hv // Hk)
    else:
        a, a_off, r_ba, gs_ba = _rows(a), 0, Hv, 0
    bv = triton.next_power_of_2(Dv) if block_v is None else min(int(block_v), triton.next_power_of_2(Dv))
    nv = triton.cdiv(Dv, bv)
    norm = nv == 1
    out = torch.empty((B, Hv * Dv), dtype=out_dtype or torch.float32, device=qkv.device)
    o = out if norm else torch.empty((B, Hv * Dv), dtype=torch.float32, device=qkv.device)
    bk = triton.next_power_of_2(Dk)
    paths.count("deltanet.step.triton")
    _deltanet_step_kernel[(B, Hv, nv)](
        qkv, z, b, a, positions, positions if single else slots, conv_ring, conv_w, s_ring, dt_bias, A, norm_w, o,
        qkv.stride(0), z.stride(0), b.stride(0), a.stride(0), o.stride(0),
        conv_ring.stride(0), conv_ring.stride(1), s_ring.stride(0), s_ring.stride(1), s_ring.stride(2),
        s_ring.stride(3), W, KD, Hk, Hv, Dk, Dv, r_ba, gs_ba, a_off, RS, float(Dk ** -0.5), float(eps),
        K=K, BK=bk, BV=bv, TILED=bool(tiled), MASKED=single, HAS_SLOTS=not single, NORM=norm,
        num_warps=8 if bk * bv >= 8192 else 4)
    if not norm:
        paths.count("deltanet.norm.triton")
        _gated_norm_kernel[(B, Hv)](o, z, norm_w, out, o.stride(0), z.stride(0), out.stride(0), Dv, float(eps),
                                    BV=triton.next_power_of_2(Dv))
    return out
