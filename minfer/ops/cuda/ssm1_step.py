"""The Mamba-1 mixer's one-token decode step as two Triton kernels (models/mamba1.py, whose module doc
cites each rule; the Mamba-2 step is ssm_step.py): `ssm1_conv_step`, the causal conv of the
in-projection's x with its ring, and `ssm1_scan_step`, the selective state update with dt's softplus,
B's and C's RMSNorms (Falcon-Mamba, jamba), the D skip and the z gate. Between them the x projection
and the dt projection stay GEMVs (ops.linear).

ssm1_conv_step, for each row b (one token at position p = positions[b] of the sequence in state slot
slots[b]; no slots: the single-sequence cache's ring, slot 0) and each channel c < di:

    x = xz[b, c]                                      the in-projection's row [x; z], any float dtype
    conv[slot, p % K, c] = x                          after reading rows p-K+1 .. p-1 (zeros before
    xc[b, c] = silu(b_c + sum_k w[k, c] x_{p-K+1+k})  position 0 when single-sequence: `masked`)

ssm1_scan_step, for each row b and channel c (float32 inside):

    dt = softplus(dtr[b, c] + dt_b[c])                 threshold 20, as torch's
    B, C = rms(B[b]) w_B, rms(C[b]) w_C                when asked (no weights: weightless, Falcon-Mamba)
    S = exp(dt A[c]) * S_prev + (dt xc[b, c]) B        S_prev = ssm[slot, (p - 1) % 2, c] (N,)
    ssm[slot, p % 2, c] = S                            (zero before position 0 when masked)
    out[b, c] = (S . C + D[c] xc[b, c]) * silu(z)      z = xz[b, di + c]; out in the dtype asked

One program per (row, block of channels); the ring slot a step writes is never one it reads (K >= 2,
a ring of two states), so a step repeated at its position (the CUDA graph's warm-ups, a token computed
ahead and dropped) gives what it gave the first time, as the torch step.

Launch paths: `ssm1.conv.triton`, `ssm1.scan.triton` (one launch each per Mamba-1 layer's decode rows).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.cuda.ssm_step import _conv_silu


@triton.jit
def _conv1_kernel(xz, stride_xz, conv_w, conv_b, conv, slots, positions, out, stride_cs, stride_ck, stride_o, DI,
                  K: tl.constexpr, BD: tl.constexpr, HAS_SLOTS: tl.constexpr, MASKED: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    cm = c < DI
    p = tl.load(positions + b).to(tl.int64)
    if HAS_SLOTS:
        slot = tl.load(slots + b).to(tl.int64)
    else:
        slot = 0
    ring = conv + slot * stride_cs
    v, cur = _conv_silu(xz + b * stride_xz, ring, conv_w, conv_b, p, c, cm, DI, stride_ck, K, True, MASKED)
    tl.store(ring + (((p % K) + K) % K) * stride_ck + c, cur, mask=cm)
    tl.store(out + b * stride_o + c, v, mask=cm)


@triton.jit
def _rms_vec(v, nn, m, N, eps, w, HAS_W: tl.constexpr):
    r = v / tl.sqrt(tl.sum(tl.where(m, v * v, 0.0), axis=0) / N + eps)
    if HAS_W:
        r = r * tl.load(w + nn, mask=m, other=0.0)
    return r


@triton.jit
def _scan1_kernel(xc, stride_x, dtr, stride_dt, dt_b, Bm, stride_b, Cm, stride_c, A, Dskip, xz, stride_xz,
                  ssm, slots, positions, out, bw, cw, stride_ss, stride_sr, stride_sd, stride_o, DI, N, eps,
                  BD: tl.constexpr, BN: tl.constexpr, NORM: tl.constexpr, NORM_W: tl.constexpr,
                  HAS_SLOTS: tl.constexpr, MASKED: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BD + tl.arange(0, BD)
    cm = c < DI
    nn = tl.arange(0, BN)
    nm = nn < N
    p = tl.load(positions + b).to(tl.int64)
    if HAS_SLOTS:
        slot = tl.load(slots + b).to(tl.int64)
    else:
        slot = 0
    x = tl.load(xc + b * stride_x + c, mask=cm, other=0.0)
    Bv = tl.load(Bm + b * stride_b + nn, mask=nm, other=0.0).to(tl.float32)
    Cv = tl.load(Cm + b * stride_c + nn, mask=nm, other=0.0).to(tl.float32)
    if NORM:
        Bv = _rms_vec(Bv, nn, nm, N, eps, bw, NORM_W)
        Cv = _rms_vec(Cv, nn, nm, N, eps, cw, NORM_W)
    v = tl.load(dtr + b * stride_dt + c, mask=cm, other=0.0).to(tl.float32) + tl.load(dt_b + c, mask=cm, other=0.0)
    e = tl.exp(tl.minimum(v, 20.0))
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))       # log1p(e), accurate for small e
    dt = tl.where(v > 20.0, v, lp)                                 # softplus, torch's threshold 20
    offs = c[:, None] * stride_sd + nn[None, :]
    m2 = cm[:, None] & nm[None, :]
    a = tl.load(A + c[:, None] * N + nn[None, :], mask=m2, other=0.0)
    sbase = ssm + slot * stride_ss
    rd = m2
    if MASKED:
        rd = rd & (p > 0)
    pr = ((p % 2) + 2) % 2
    s = tl.load(sbase + (1 - pr) * stride_sr + offs, mask=rd, other=0.0)           # the state after p - 1
    s = s * tl.exp(dt[:, None] * a) + (dt * x)[:, None] * Bv[None, :]
    tl.store(sbase + pr * stride_sr + offs, s, mask=m2)
    y = tl.sum(tl.where(m2, s * Cv[None, :], 0.0), axis=1) + x * tl.load(Dskip + c, mask=cm, other=0.0)
    z = tl.load(xz + b * stride_xz + DI + c, mask=cm, other=0.0).to(tl.float32)
    tl.store(out + b * stride_o + c, (y * (z * tl.sigmoid(z))).to(out.dtype.element_ty), mask=cm)


def _ring(ring: torch.Tensor, slots, T: int, shape: tuple, what: str) -> torch.Tensor:
    """The state ring(s) as (S, *shape), checked against T rows (one sequence: T = 1, no slots)."""
    if slots is None:
        ring = ring.unsqueeze(0)
    if ((slots is None and T != 1) or (slots is not None and tuple(slots.shape) != (T,))
            or tuple(ring.shape[1:]) != shape):
        raise MinferError(f"ssm1 step: the {what} ring {tuple(ring.shape)} does not fit {T} rows (expected "
                          f"{'' if slots is None else '(S, '}{shape}{'' if slots is None else ')'}, slots "
                          f"{None if slots is None else tuple(slots.shape)})")
    if ring.dtype != torch.float32 or ring.stride(-1) != 1:
        raise MinferError(f"ssm1 step: the {what} ring must be float32 with unit channel stride")
    return ring


def ssm1_conv_step(xz, conv_w, conv_b, conv, positions, slots=None) -> torch.Tensor:
    """The causal conv + SiLU of T decode rows (module doc): xz (T, >= di) the in-projection's rows (x
    first; any float dtype, unit column stride), conv_w (K, di), conv_b (di,) float32, positions (T,)
    int64 on the device. slots None: one sequence (T = 1), conv (K, di), nothing read before position
    0; slots (T,) int64: the batch engine's pool (S, K, di), read as it is. The ring is updated in
    place. -> xc (T, di) float32."""
    T = xz.shape[0]
    K, di = conv_w.shape
    if xz.shape[1] < di or conv_b.shape != (di,) or xz.stride(-1) != 1:
        raise MinferError(f"ssm1_conv_step: xz {tuple(xz.shape)} (stride {xz.stride()}), conv_w {tuple(conv_w.shape)}, "
                          f"conv_b {tuple(conv_b.shape)} do not fit")
    ring = _ring(conv, slots, T, (K, di), "conv")
    paths.count("ssm1.conv.triton")
    out = torch.empty((T, di), dtype=torch.float32, device=xz.device)
    BD = min(256, triton.next_power_of_2(di))
    _conv1_kernel[(T, triton.cdiv(di, BD))](
        xz, xz.stride(0), conv_w.contiguous(), conv_b, ring, positions if slots is None else slots, positions, out,
        ring.stride(0), ring.stride(1), out.stride(0), di,
        K=K, BD=BD, HAS_SLOTS=slots is not None, MASKED=slots is None, num_warps=4)
    return out


def _block_d(di: int, BN: int) -> int:
    """Channels per program: about 1024 state values a program (many programs for one row)."""
    return max(8, min(triton.next_power_of_2(di), 1024 // BN))


def ssm1_scan_step(xc, dtr, dt_b, B, C, A, D, xz, ssm, positions, slots=None, out_dtype=torch.float32,
                   norm_eps: float | None = None, b_norm=None, c_norm=None) -> torch.Tensor:
    """The state update, D skip and gate of T decode rows (module doc): xc (T, di) float32 the conv's
    output; dtr (T, di) the dt projection's rows before its bias (any float dtype); dt_b, D (di,), A (di,
    N) float32; B, C (T, N) views (unit column stride); xz (T, 2 di) the in-projection's rows (z second).
    norm_eps set: B and C each RMS-normed (times b_norm / c_norm when given) first. slots as
    ssm1_conv_step's; ssm (2, di, N) or (S, 2, di, N) float32, updated in place.
    -> (y + D x) * silu(z) (T, di) in out_dtype."""
    T, di = xc.shape
    N = A.shape[1]
    if (A.shape != (di, N) or tuple(dtr.shape) != (T, di) or tuple(B.shape) != (T, N) or tuple(C.shape) != (T, N)
            or xz.shape[0] != T or xz.shape[1] < 2 * di or dt_b.shape != (di,) or D.shape != (di,)
            or any(t.stride(-1) != 1 for t in (xc, dtr, B, C, xz))
            or (b_norm is None) != (c_norm is None) or (b_norm is not None and norm_eps is None)):
        raise MinferError(f"ssm1_scan_step: xc {tuple(xc.shape)}, dtr {tuple(dtr.shape)}, B {tuple(B.shape)}, "
                          f"C {tuple(C.shape)}, A {tuple(A.shape)}, xz {tuple(xz.shape)} do not fit")
    ring = _ring(ssm, slots, T, (2, di, N), "ssm")
    paths.count("ssm1.scan.triton")
    out = torch.empty((T, di), dtype=out_dtype, device=xc.device)
    BN = triton.next_power_of_2(N)
    BD = _block_d(di, BN)
    norm_w = b_norm is not None
    _scan1_kernel[(T, triton.cdiv(di, BD))](
        xc, xc.stride(0), dtr, dtr.stride(0), dt_b, B, B.stride(0), C, C.stride(0), A.contiguous(), D, xz,
        xz.stride(0), ring, positions if slots is None else slots, positions, out,
        b_norm if norm_w else D, c_norm if norm_w else D,
        ring.stride(0), ring.stride(1), ring.stride(2), out.stride(0), di, N,
        float(norm_eps) if norm_eps is not None else 0.0,
        BD=BD, BN=BN, NORM=norm_eps is not None, NORM_W=norm_w, HAS_SLOTS=slots is not None, MASKED=slots is None,
        num_warps=4)
    return out
