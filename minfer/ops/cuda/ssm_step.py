"""The Mamba-2 mixer's one-token decode step as two Triton kernels (models/mamba2.py, whose module doc
cites each rule): `ssm_step` is the causal conv and the selective state update in one launch, reading
and writing the per-sequence state in place; `ssm_gate_norm` the gate and the grouped RMSNorm.

ssm_step, for each row b (one token at position p = positions[b] of the sequence in state slot
slots[b]; no slots: the single-sequence cache's rings, slot 0) and each head h (group g = h // (H/G)):

    xBC = zxbcdt[b, di : di + conv_dim]                the in-projection's row, any float dtype
    conv[slot, p % K] = xBC                            after reading rows p-K+1 .. p-1 (zeros before
    v = silu(b + sum_k w[k] * xBC_{p-K+1+k})            position 0 when single-sequence: `masked`)
    x = v[h*P : h*P+P], B = v[di + g*N ...], C = v[di + G*N + g*N ...]
    dt = softplus(zxbcdt[b, di + conv_dim + h] + dt_bias[h])       threshold 20, as torch's
    S = exp(dt * A[h]) * S_prev + (dt * x) B^T         S_prev = ssm[slot, (p - 1) % 2, h] (P, N)
    ssm[slot, p % 2, h] = S                            (zero before position 0 when masked)
    y[b, h*P : h*P+P] = S C + D[h] x                   float32

in float32 (the rings are float32). One program per (row, head, block of BP head channels): it
conv-computes its x channels and its group's B and C (recomputed by each head of the group, a few
K*N loads), and the ring row of B and C is written by the group's first head's first block only.
Every program reads ring rows other than the one it writes (K >= 2, a ring of two states), so a
step repeated at its position reads what it read the first time (the CUDA-graph warm-ups, a token
computed ahead and dropped), as the torch step.

ssm_gate_norm: out = weight * RMSNorm(y * silu(z)) over each of G groups of di/G channels (no
weight: y * silu(z)), z read from the in-projection's row, out in the dtype asked; one program per
(row, group).

Launch paths: `ssm.step.triton` (one launch per Mamba-2 layer's decode rows), `ssm.norm.triton`.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops import paths


@triton.jit
def _conv_silu(row, ring, w, bias, p, ch, cm, W, stride_ck, K: tl.constexpr, HAS_BIAS: tl.constexpr,
               MASKED: tl.constexpr):
    """silu(bias + sum_k w[k] * xBC_{p-K+1+k}) of channels ch and this step's row (float32)."""
    cur = tl.load(row + ch, mask=cm, other=0.0).to(tl.float32)
    acc = cur * tl.load(w + (K - 1) * W + ch, mask=cm, other=0.0)
    for k in tl.static_range(K - 1):
        q = p - (K - 1) + k                                        # the position of tap k
        r = ((q % K) + K) % K
        m = cm
        if MASKED:
            m = m & (q >= 0)
        prev = tl.load(ring + r * stride_ck + ch, mask=m, other=0.0)
        acc += prev * tl.load(w + k * W + ch, mask=cm, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias + ch, mask=cm, other=0.0)
    return acc * tl.sigmoid(acc), cur


@triton.jit
def _ssm_step_kernel(zx, stride_zx, conv_w, conv_b, dt_bias, A, Dskip, conv, ssm, slots, positions, y,
                     stride_cs, stride_ck, stride_ss, stride_sr, stride_sh, stride_sp, stride_y,
                     DI, W, P, N, HG, GN,
                     K: tl.constexpr, BP: tl.constexpr, BN: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_SLOTS: tl.constexpr, MASKED: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    pb = tl.program_id(2)
    g = h // HG
    p = tl.load(positions + b).to(tl.int64)
    if HAS_SLOTS:
        slot = tl.load(slots + b).to(tl.int64)
    else:
        slot = 0
    row = zx + b * stride_zx + DI                                  # xBC of this row (z comes first)
    ring = conv + slot * stride_cs
    pp = pb * BP + tl.arange(0, BP)
    pm = pp < P
    nn = tl.arange(0, BN)
    nm = nn < N

    # the conv + SiLU: this block's x channels, the group's B and C
    cx = h * P + pp
    x, cur_x = _conv_silu(row, ring, conv_w, conv_b, p, cx, pm, W, stride_ck, K, HAS_BIAS, MASKED)
    cb = DI + g * N + nn
    Bv, cur_b = _conv_silu(row, ring, conv_w, conv_b, p, cb, nm, W, stride_ck, K, HAS_BIAS, MASKED)
    cc = cb + GN
    Cv, cur_c = _conv_silu(row, ring, conv_w, conv_b, p, cc, nm, W, stride_ck, K, HAS_BIAS, MASKED)
    wr = ring + (((p % K) + K) % K) * stride_ck                   # this position's ring row
    tl.store(wr + cx, cur_x, mask=pm)
    first = (h % HG == 0) & (pb == 0)
    tl.store(wr + cb, cur_b, mask=nm & first)
    tl.store(wr + cc, cur_c, mask=nm & first)

    # dt, dA and the state update
    v = tl.load(zx + b * stride_zx + DI + W + h).to(tl.float32) + tl.load(dt_bias + h)
    e = tl.exp(v)
    u = 1.0 + e
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / (u - 1.0)))       # log1p(e), accurate for small e
    dt = tl.where(v > 20.0, v, lp)                                 # softplus, torch's threshold 20
    dA = tl.exp(dt * tl.load(A + h))
    sbase = ssm + slot * stride_ss + h * stride_sh
    offs = pp[:, None] * stride_sp + nn[None, :]
    m2 = pm[:, None] & nm[None, :]
    rd = m2
    if MASKED:
        rd = rd & (p > 0)
    pr = ((p % 2) + 2) % 2                                         # p % 2 (Python's, for any p)
    s = tl.load(sbase + (1 - pr) * stride_sr + offs, mask=rd, other=0.0)          # slot (p - 1) % 2
    s = s * dA + (x * dt)[:, None] * Bv[None, :]
    tl.store(sbase + pr * stride_sr + offs, s, mask=m2)
    out = tl.sum(s * Cv[None, :], axis=1) + x * tl.load(Dskip + h)
    tl.store(y + b * stride_y + cx, out, mask=pm)


@triton.jit
def _gate_norm_kernel(y, zx, w, out, stride_y, stride_zx, stride_o, GS, eps, BD: tl.constexpr,
                      HAS_W: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    d = tl.arange(0, BD)
    dm = d < GS
    c = g * GS + d
    yv = tl.load(y + r * stride_y + c, mask=dm, other=0.0)
    z = tl.load(zx + r * stride_zx + c, mask=dm, other=0.0).to(tl.float32)
    v = yv * (z * tl.sigmoid(z))
    if HAS_W:
        rs = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / GS + eps)
        v = v * rs * tl.load(w + c, mask=dm, other=0.0)
    tl.store(out + r * stride_o + c, v.to(out.dtype.element_ty), mask=dm)


def _block_p(P: int, BN: int) -> int:
    """Head channels per program: about 4096 state values a program, at most the head."""
    return max(1, min(triton.next_power_of_2(P), 4096 // BN))


def ssm_step(zxbcdt, conv_w, conv_b, dt_bias, A, D, conv, ssm, positions, slots=None) -> torch.Tensor:
    """The decode step of T rows, one token each (module doc): zxbcdt (T, 2*di + 2*G*N + H) the
    in-projection's rows [z; xBC; dt] in any float dtype; conv_w (K, conv_dim), conv_b (conv_dim,) or
    None, dt_bias, A, D (H,) float32; positions (T,) int64 on the device. slots None: one sequence
    (T = 1), conv (K, conv_dim) and ssm (2, H, P, N), nothing read before position 0; slots (T,)
    int64: the batch engine's pools conv (S, K, conv_dim), ssm (S, 2, H, P, N), read as they are
    (a slot is zeroed when a sequence takes it). The rings are updated in place.
    -> y = S C + D x (T, H * P) float32."""
    T = zxbcdt.shape[0]
    K, W = conv_w.shape
    H = A.shape[0]
    P, N = ssm.shape[-2:]
    di = H * P
    if slots is None:
        conv, ssm = conv.unsqueeze(0), ssm.unsqueeze(0)
    gn2 = W - di
    if (gn2 <= 0 or gn2 % (2 * N) or H % (gn2 // (2 * N)) or tuple(conv.shape[1:]) != (K, W)
            or tuple(ssm.shape[1:]) != (2, H, P, N) or zxbcdt.shape[1] != di + W + H
            or (slots is None and T != 1) or (slots is not None and slots.shape[0] != T)):
        raise MinferError(f"ssm_step: shapes do not fit: zxbcdt {tuple(zxbcdt.shape)}, conv_w {tuple(conv_w.shape)}, "
                          f"A {tuple(A.shape)}, conv {tuple(conv.shape)}, ssm {tuple(ssm.shape)}, "
                          f"slots {None if slots is None else tuple(slots.shape)}")
    if conv.dtype != torch.float32 or ssm.dtype != torch.float32 or conv.stride(-1) != 1 or ssm.stride(-1) != 1:
        raise MinferError("ssm_step: the state rings must be float32 with unit channel stride")
    G = gn2 // (2 * N)
    paths.count("ssm.step.triton")
    if zxbcdt.stride(-1) != 1:
        zxbcdt = zxbcdt.contiguous()
    conv_w = conv_w.contiguous()
    y = torch.empty((T, di), dtype=torch.float32, device=zxbcdt.device)
    BN = triton.next_power_of_2(N)
    BP = _block_p(P, BN)
    grid = (T, H, triton.cdiv(P, BP))
    _ssm_step_kernel[grid](
        zxbcdt, zxbcdt.stride(0), conv_w, conv_w if conv_b is None else conv_b, dt_bias, A, D, conv, ssm,
        positions if slots is None else slots, positions, y,
        conv.stride(0), conv.stride(1), ssm.stride(0), ssm.stride(1), ssm.stride(2), ssm.stride(3), y.stride(0),
        di, W, P, N, H // G, G * N,
        K=K, BP=BP, BN=BN, HAS_BIAS=conv_b is not None, HAS_SLOTS=slots is not None, MASKED=slots is None,
        num_warps=4)
    return y


def ssm_gate_norm(y, zxbcdt, weight, groups: int, eps: float, out_dtype) -> torch.Tensor:
    """weight * RMSNorm(y * silu(z)) over each of `groups` groups of channels (weight None: y * silu(z)),
    y (T, di) float32, z = zxbcdt[:, :di] (any float dtype) -> (T, di) in out_dtype
    (models/mamba2.py gated_group_norm)."""
    T, di = y.shape
    if di % groups or zxbcdt.shape[0] != T or zxbcdt.shape[1] < di or (weight is not None and weight.numel() != di):
        raise MinferError(f"ssm_gate_norm: y {tuple(y.shape)}, zxbcdt {tuple(zxbcdt.shape)}, {groups} groups, "
                          f"weight {None if weight is None else tuple(weight.shape)} do not fit")
    paths.count("ssm.norm.triton")
    if y.stride(-1) != 1:
        y = y.contiguous()
    if zxbcdt.stride(-1) != 1:
        zxbcdt = zxbcdt.contiguous()
    gs = di // groups
    out = torch.empty((T, di), dtype=out_dtype, device=y.device)
    bd = triton.next_power_of_2(gs)
    _gate_norm_kernel[(T, groups)](y, zxbcdt, y if weight is None else weight.contiguous(), out, y.stride(0),
                                   zxbcdt.stride(0), out.stride(0), gs, float(eps), BD=bd, HAS_W=weight is not None,
                                   num_warps=4 if bd <= 2048 else 8)
    return out
