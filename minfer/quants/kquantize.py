"""k-quant quantizers (float32 -> blocks): Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.

Port of llama.cpp's reference path used when no importance matrix is given (ggml-quants.c:
quantize_row_q2_K_ref / q4_K / q5_K with make_qkx2_quants, quantize_row_q3_K_ref with
make_q3_quants, quantize_row_q6_K_ref with make_qx_quants, nearest_int), vectorized over all
sub-blocks at once: the scale-search loops run over candidate scales, not over blocks.

Groups are laid out one per column, (n, M), so every sum runs in the C loops' left-to-right
order (see _sum) and products keep the C operand order. Bit-identical output to llama.cpp is
still not guaranteed: a C build may contract `sum += w*l` into FMAs (-march=native), which
changes the last bits and so, in rare near-ties, the chosen scale. The gguf package has no
quantizer for these types to compare bit for bit; tests/quants checks error bounds through
gguf's independent dequantizer instead.
"""

from __future__ import annotations

import numpy as np

from .base import f16_to_f32, f32_to_f16_bytes, nearest_int, signed_absmax
from .kquants import Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, scale_min_k4

GROUP_MAX_EPS = np.float32(1e-15)  # ggml-quants.c GROUP_MAX_EPS


def _sum(a: np.ndarray) -> np.ndarray:
    """Sum over axis 0 of an (n, M) array: numpy adds row after row, i.e. the same
    left-to-right order as the C loops (`sum += ...` for i = 0..n-1), for each of M groups."""
    return np.add.reduce(a, axis=0, dtype=np.float32)


def _round_clip(v: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """MAX(lo, MIN(hi, nearest_int(v))) kept in float32 (same values: rint is exact for
    |v| < 2^22; staying in float saves two int conversions in the hot search loops)."""
    r = np.rint(v)
    return np.clip(r, np.float32(lo), np.float32(hi), out=r)


def make_qkx2_quants(x, w, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool = False):
    """Asymmetric fit x ~ scale * L - the_min per group, L in 0..nmax, weighted least squares
    scored by squared error (use_mad: absolute error).

    x, w: (n, M) float32, one group per COLUMN (so that sums run in C order, see _sum).
    Returns scale (M,), the_min (M,) >= 0, L (n, M) uint8. ggml-quants.c make_qkx2_quants.
    """

    def err(diff):  # C: diff = use_mad ? fabsf(diff) : diff * diff; error += w * diff
        return _sum(w * (np.abs(diff) if use_mad else diff * diff))

    f32 = np.float32
    lo = np.minimum(x.min(axis=0), f32(0))  # `if (min > 0) min = 0`
    hi = x.max(axis=0)
    sum_w = _sum(w)
    sum_x = _sum(w * x)
    flat = hi == lo  # C returns scale 0, L = 0 for these; masked below

    iscale = f32(nmax) / np.where(flat, f32(1), hi - lo)
    scale = f32(1) / iscale
    L = _round_clip(iscale * (x - lo), 0, nmax)
    best = err(scale * L + lo - x)
    for step in range(nstep + 1):
        # iscale uses the current (possibly refined) min, as the C loop does.
        iscale = (f32(rmin) + f32(rdelta) * f32(step) + f32(nmax)) / np.where(flat, f32(1), hi - lo)
        Laux = _round_clip(iscale * (x - lo), 0, nmax)
        wl = w * Laux
        sum_l = _sum(wl)
        sum_l2 = _sum(wl * Laux)
        sum_xl = _sum(wl * x)
        D = sum_w * sum_l2 - sum_l * sum_l
        ok = D > 0
        Ds = np.where(ok, D, f32(1))
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / Ds
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / Ds
        pos = this_min > 0
        with np.errstate(divide="ignore", invalid="ignore"):
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
        this_min = np.where(pos, f32(0), this_min)
        cur = err(this_scale * Laux + this_min - x)
        better = ok & ~flat & (cur < best)
        L = np.where(better, Laux, L)
        best = np.where(better, cur, best)
        scale = np.where(better, this_scale, scale)
        lo = np.where(better, this_min, lo)
    L = np.where(flat, 0, L).astype(np.uint8)
    scale = np.where(flat, f32(0), scale).astype(np.float32)
    return scale, -lo, L


def _pack_scale_min_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """(B, 8) uint8 6-bit scales and mins -> (B, 12) bytes (inverse of scale_min_k4)."""
    out = np.empty((ls.shape[0], 12), dtype=np.uint8)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 15) | ((lm[:, 4:8] & 15) << 4)
    return out


def _quantize_qkx(x: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Shared Q4_K / Q5_K body. x (B, 256) -> (d16 (B,2), dmin16 (B,2), scales (B,12), L (B,256))."""
    f32 = np.float32
    B = x.shape[0]
    xt = np.ascontiguousarray(x.reshape(B * 8, 32).T)  # (32, B*8): one 32-value group per column
    av_x = np.sqrt(_sum(xt * xt) / f32(32))
    w = av_x + np.abs(xt)
    scales, mins, L = make_qkx2_quants(xt, w, nmax, rmin, rdelta, nstep)
    scales, mins, L = scales.reshape(B, 8), mins.reshape(B, 8), L.T.reshape(B, 8, 32)
    max_scale = np.maximum(scales.max(axis=1), f32(0))
    max_min = np.maximum(mins.max(axis=1), f32(0))
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, f32(63) / max_scale, f32(0))
        inv_min = np.where(max_min > 0, f32(63) / max_min, f32(0))
    # `uint8_t ls = nearest_int(...)` wraps mod 256, then MIN(63, ls)
    ls = np.minimum(nearest_int(inv_scale[:, None] * scales).astype(np.uint8), 63)
    lm = np.minimum(nearest_int(inv_min[:, None] * mins).astype(np.uint8), 63)
    d16 = f32_to_f16_bytes((max_scale / f32(63))[:, None])
    dmin16 = f32_to_f16_bytes((max_min / f32(63))[:, None])
    packed = _pack_scale_min_k4(ls, lm)
    # Requantize against the stored (f16, 6-bit) scales; groups with d == 0 keep their L.
    sc, mn = scale_min_k4(packed)
    d = (f16_to_f32(d16) * sc.astype(f32))[:, :, None]
    dm = (f16_to_f32(dmin16) * mn.astype(f32))[:, :, None]
    xg = x.reshape(B, 8, 32)
    with np.errstate(divide="ignore", invalid="ignore"):
        Lr = np.clip(nearest_int(np.where(d != 0, (xg + dm) / np.where(d != 0, d, f32(1)), 0)), 0, nmax)
    L = np.where(d != 0, Lr, L).astype(np.uint8).reshape(B, 256)
    return d16, dmin16, packed, L


def _q4k_quantize_blocks(cls, x):
    """ggml-quants.c quantize_row_q4_K_ref: make_qkx2_quants(32, 15, ..., -1, 0.1, 20)."""
    B = x.shape[0]
    d16, dmin16, packed, L = _quantize_qkx(x, 15, -1.0, 0.1, 20)
    Lg = L.reshape(B, 4, 2, 32)
    qs = (Lg[:, :, 0] | (Lg[:, :, 1] << 4)).reshape(B, 128)
    return np.concatenate([d16, dmin16, packed, qs], axis=1)


def _q5k_quantize_blocks(cls, x):
    """ggml-quants.c quantize_row_q5_K_ref: make_qkx2_quants(32, 31, ..., -0.5, 0.1, 15)."""
    B = x.shape[0]
    d16, dmin16, packed, L = _quantize_qkx(x, 31, -0.5, 0.1, 15)
    Lg = L.reshape(B, 8, 32)
    qh = np.zeros((B, 32), dtype=np.uint8)
    for g in range(8):  # group g's 5th bit goes to bit g of qh[l]
        qh |= ((Lg[:, g] >> 4) & 1) << g
    lo = (Lg & 15).reshape(B, 4, 2, 32)
    qs = (lo[:, :, 0] | (lo[:, :, 1] << 4)).reshape(B, 128)
    return np.concatenate([d16, dmin16, packed, qh, qs], axis=1)


def make_qx_quants_rmse1(x: np.ndarray, nmax: int):
    """Symmetric fit x ~ scale * (L - nmax), weights x^2, 18 extra scale candidates.

    x: (n, M) float32, one group per column -> scale (M,), L (n, M) uint8 in 0..2*nmax-1.
    ggml-quants.c make_qx_quants(n, nmax, x, L, rmse_type=1, qw=NULL).
    """
    f32 = np.float32
    mx = signed_absmax(x, 0)[0]
    zero = np.abs(mx) < GROUP_MAX_EPS
    mxs = np.where(zero, f32(1), mx)
    w = x * x
    wx = w * x

    def fit(iscale):  # C: sumlx += w*x[i]*l; suml2 += w*l*l
        l = _round_clip(iscale * x, -nmax, nmax - 1)
        return l, _sum(wx * l), _sum(w * l * l)

    l, sumlx, suml2 = fit(-f32(nmax) / mxs)
    L = l
    with np.errstate(divide="ignore", invalid="ignore"):
        scale = np.where(suml2 != 0, sumlx / suml2, f32(0))
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        l, sumlx, suml2 = fit(-(f32(nmax) + f32(0.1) * f32(step)) / mxs)
        better = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        L = np.where(better, l, L)
        with np.errstate(divide="ignore", invalid="ignore"):
            scale = np.where(better, sumlx / suml2, scale)
        best = np.where(better, scale * sumlx, best)
    L = np.where(zero, 0, L + f32(nmax)).astype(np.uint8)
    scale = np.where(zero, f32(0), scale).astype(np.float32)
    return scale, L


def _groups16(x: np.ndarray, make, nmax: int):
    """Q6_K/Q3_K: each super-block's 16 groups of 16 quantized by `make` (their own scale and
    levels), and per super-block the group scale of largest magnitude, which sets the f16 d.
    x (B, 256) -> scales (B, 16), L (B, 16, 16), max_scale (B,)."""
    B = x.shape[0]
    scales, L = make(np.ascontiguousarray(x.reshape(B * 16, 16).T), nmax)
    scales, L = scales.reshape(B, 16), L.T.reshape(B, 16, 16)
    return scales, L, signed_absmax(scales, 1)[:, 0]


def _requantize16(x: np.ndarray, d16: np.ndarray, sc: np.ndarray, L: np.ndarray, nmax: int) -> np.ndarray:
    """The levels again against the group scales as stored (f16 d times the integer sc), as
    quantize_row_q6_K_ref / q3_K_ref do: clip(nearest(x / d), -nmax, nmax - 1) + nmax; a group
    whose stored scale is 0 keeps L. -> uint8 (B, 16, 16)."""
    f32 = np.float32
    d = (f16_to_f32(d16) * sc.astype(f32))[:, :, None]  # (B, 16, 1)
    xg = x.reshape(x.shape[0], 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        Lr = np.clip(nearest_int(np.where(d != 0, xg / np.where(d != 0, d, f32(1)), 0)), -nmax, nmax - 1) + nmax
    return np.where(d != 0, Lr, L).astype(np.uint8)


def _q6k_quantize_blocks(cls, x):
    """ggml-quants.c quantize_row_q6_K_ref."""
    f32 = np.float32
    B = x.shape[0]
    scales, L, max_scale = _groups16(x, make_qx_quants_rmse1, 32)
    empty = np.abs(max_scale) < GROUP_MAX_EPS  # whole super-block stored as zeros
    iscale = f32(-128) / np.where(empty, f32(1), max_scale)
    d16 = f32_to_f16_bytes((f32(1) / iscale)[:, None])
    sc = np.minimum(nearest_int(iscale[:, None] * scales), 127).astype(np.int8)
    L = _requantize16(x, d16, sc, L, 32).reshape(B, 2, 4, 32)  # [h, k, l]
    ql = np.concatenate(
        [(L[:, :, 0] & 15) | ((L[:, :, 2] & 15) << 4), (L[:, :, 1] & 15) | ((L[:, :, 3] & 15) << 4)], axis=2
    ).reshape(B, 128)
    hi = L >> 4
    qh = (hi[:, :, 0] | (hi[:, :, 1] << 2) | (hi[:, :, 2] << 4) | (hi[:, :, 3] << 6)).reshape(B, 64)
    out = np.concatenate([ql, qh, sc.view(np.uint8), d16], axis=1)
    out[empty] = 0
    return out


def _pack_crumbs(L: np.ndarray) -> np.ndarray:
    """(B, 256) uint8 in 0..3 -> (B, 64): qs[32h + l] = sum_k L[128h + 32k + l] << 2k."""
    g = L.reshape(L.shape[0], 2, 4, 32)
    return (g[:, :, 0] | (g[:, :, 1] << 2) | (g[:, :, 2] << 4) | (g[:, :, 3] << 6)).reshape(-1, 64)


def _q2k_quantize_blocks(cls, x):
    """ggml-quants.c quantize_row_q2_K_ref: make_qkx2_quants(16, 3, w=|x|, -0.5, 0.1, 15, mad)."""
    f32 = np.float32
    B = x.shape[0]
    xt = np.ascontiguousarray(x.reshape(B * 16, 16).T)  # (16, B*16): one group per column
    scales, mins, L = make_qkx2_quants(xt, np.abs(xt), 3, -0.5, 0.1, 15, use_mad=True)
    scales, mins, L = scales.reshape(B, 16), mins.reshape(B, 16), L.T.reshape(B, 16, 16)
    max_scale = np.maximum(scales.max(axis=1), f32(0))
    max_min = np.maximum(mins.max(axis=1), f32(0))
    with np.errstate(divide="ignore"):
        inv_s = np.where(max_scale > 0, f32(15) / max_scale, f32(0))
        inv_m = np.where(max_min > 0, f32(15) / max_min, f32(0))
    # `y.scales[j] = l` then `|= l << 4`: stored in a uint8, so both wrap mod 256
    ls = nearest_int(inv_s[:, None] * scales).astype(np.uint8)
    lm = nearest_int(inv_m[:, None] * mins).astype(np.uint8)
    sc = ls | (lm << 4)
    d16 = f32_to_f16_bytes((max_scale / f32(15))[:, None])  # 0 when max_scale == 0
    dmin16 = f32_to_f16_bytes((max_min / f32(15))[:, None])
    d = (f16_to_f32(d16) * (sc & 15).astype(f32))[:, :, None]
    dm = (f16_to_f32(dmin16) * (sc >> 4).astype(f32))[:, :, None]
    xg = x.reshape(B, 16, 16)
    with np.errstate(divide="ignore", invalid="ignore"):
        Lr = np.clip(nearest_int(np.where(d != 0, (xg + dm) / np.where(d != 0, d, f32(1)), 0)), 0, 3)
    L = np.where(d != 0, Lr, L).astype(np.uint8).reshape(B, 256)
    return np.concatenate([sc, _pack_crumbs(L), d16, dmin16], axis=1)


def make_q3_quants_rmse(x: np.ndarray, nmax: int):
    """Symmetric fit with a coordinate-descent refinement, weights x^2.

    x: (n, M) float32, one group per column -> scale (M,), L (n, M) int8 in 0..2*nmax-1.
    ggml-quants.c make_q3_quants(n, nmax, x, L, do_rmse=true). The inner loop visits the n
    values in order (each update feeds the next), vectorized across the M groups. A group
    whose pass changed nothing would change nothing on the next pass either, so running all
    five passes equals the C loop's early `break`.
    """
    f32 = np.float32
    n = x.shape[0]
    mx = signed_absmax(x, 0)[0]
    zero = np.abs(mx) < GROUP_MAX_EPS
    iscale = -f32(nmax) / np.where(zero, f32(1), mx)
    L = _round_clip(iscale * x, -nmax, nmax - 1)
    w = x * x
    wx = w * x
    sumlx = _sum(wx * L)
    suml2 = _sum(w * L * L)
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(5):
            for i in range(n):
                wi, wxi, xi, li = w[i], wx[i], x[i], L[i]
                slx = sumlx - wxi * li
                sl2 = suml2 - wi * li * li
                new_l = _round_clip(np.where(slx > 0, xi * sl2 / slx, 0), -nmax, nmax - 1)
                slx2 = slx + wxi * new_l
                sl22 = sl2 + wi * new_l * new_l
                take = (slx > 0) & (new_l != li) & (sl22 > 0) & (slx2 * slx2 * suml2 > sumlx * sumlx * sl22)
                L[i] = np.where(take, new_l, li)
                sumlx = np.where(take, slx2, sumlx)
                suml2 = np.where(take, sl22, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, f32(0)).astype(f32)
    L = np.where(zero, 0, L + f32(nmax)).astype(np.int8)
    return np.where(zero, f32(0), scale), L


def _q3k_quantize_blocks(cls, x):
    """ggml-quants.c quantize_row_q3_K_ref."""
    f32 = np.float32
    B = x.shape[0]
    scales, L, max_scale = _groups16(x, make_q3_quants_rmse, 4)
    has = max_scale != 0
    iscale = f32(-32) / np.where(has, max_scale, f32(1))
    ls = np.where(has[:, None], np.clip(nearest_int(iscale[:, None] * scales), -32, 31) + 32, 0).astype(np.uint8)
    packed = np.zeros((B, 12), dtype=np.uint8)
    packed[:, 0:8] = (ls[:, 0:8] & 15) | ((ls[:, 8:16] & 15) << 4)
    hi = (ls >> 4).reshape(B, 4, 4)  # [j // 4, j % 4]
    packed[:, 8:12] = hi[:, 0] | (hi[:, 1] << 2) | (hi[:, 2] << 4) | (hi[:, 3] << 6)
    d16 = f32_to_f16_bytes(np.where(has, f32(1) / iscale, f32(0))[:, None])
    sc = ls.astype(np.int8) - np.int8(32)  # what the decoder reads back
    L = _requantize16(x, d16, sc, L, 4).reshape(B, 256)
    high = L > 3  # value j's 3rd bit goes to bit j // 32 of hmask[j % 32]
    hmask = np.packbits(high.reshape(B, 8, 32).transpose(0, 2, 1), axis=-1, bitorder="little").reshape(B, 32)
    low = np.where(high, L - 4, L).astype(np.uint8)
    return np.concatenate([hmask, _pack_crumbs(low), packed, d16], axis=1)


# The k-quant classes live in kquants.py (dequantization); attach the quantizers here so each
# file stays one concern. Chunks of 256 super-blocks keep the search's temporaries in cache.
for _cls, _fn in (
    (Q2_K, _q2k_quantize_blocks),
    (Q3_K, _q3k_quantize_blocks),
    (Q4_K, _q4k_quantize_blocks),
    (Q5_K, _q5k_quantize_blocks),
    (Q6_K, _q6k_quantize_blocks),
):
    _cls.quantize_blocks = classmethod(_fn)
    _cls.can_quantize = True
    _cls.quantize_chunk = 256
