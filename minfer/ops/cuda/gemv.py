"""Decode-shaped matmul (few rows of activations) reading the raw ggml blocks directly.

out (M, N) = x (M, K) @ W^T, W given as raw blocks (N, row_bytes). Memory-bound: the weight
bytes are the traffic, so each weight is read once per call, decoded in registers
(dequant.decode) and multiplied at once.
- M == 1: a multiply-and-reduce on CUDA cores (no padding waste).
- 1 < M <= 64: the decoded [BN, BK] tile goes through `tl.dot` against x^T [BK, MP]
  (MP = 16/32/64; tensor cores want >= 16 columns), one program per (row tile, split, M tile).
- Split-K: narrow shapes (qkv 4608 rows, down 3584 rows over K=18944) give too few row
  tiles to keep 132 SMs' worth of loads in flight, so K is cut into SPLIT ranges whose fp32
  partial sums land in a (SPLIT, M, N) buffer and one small kernel sums them (with the bias)
  afterwards (deterministic, unlike atomics).
"""

from __future__ import annotations

import re

import torch
import triton
import triton.language as tl

from minfer.ops import paths
from minfer.ops.cuda.dequant import HALFWORD_TYPES, LAYOUT, decode, decode_hw
from minfer.ops.cuda.gemv_raw_rope import rope_row, rope_store
from minfer.ops.cuda.pdl import enabled as pdl_enabled
from minfer.ops.cuda.pdl import enter as pdl_enter
from minfer.ops.cuda.pdl import launch_kw
from minfer.ops.cuda.resnorm_tail import resnorm_tail


@triton.jit
def _weight_runs(rowp, n_run, k0, i, N, K, QT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr):
    """The runs' mask [R, 16] and their decoded weights [R, 16] fp32 at K offsets k0 [R]."""
    m = ((n_run < N) & (k0 < K))[:, None]
    if QT == 0 or QT == 1 or QT == 30:
        # float weights are read as runs of 16 values: a K that is no multiple of 16 ends a
        # row inside a run, whose values past K (the next row's, or past the tensor) are masked
        m = m & ((k0[:, None] + i) < K)
    return m, decode(QT, (rowp + (k0 // QK) * TS)[:, None], (k0 % QK)[:, None], i, m)


@triton.jit
def _runs_dot_hw(rowp, n_run, k0, xrow, N, K, QT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr, PDL: tl.constexpr):
    """HW (HALFWORD_TYPES, one row): the runs at K offsets k0 [R] multiplied by x's values (xrow: x's row),
    [R, 8] fp32 (dequant.decode_hw's even and odd values against x's even and odd ones). PDL: the weights
    are decoded before pdl_enter (the one-pass tile's contract; 0: the caller waited)."""
    m = ((n_run < N) & (k0 < K))[:, None]
    we, wo = decode_hw(QT, (rowp + (k0 // QK) * TS)[:, None], (k0 % QK)[:, None], m)
    pdl_enter(PDL)
    if xrow.dtype.element_ty == tl.bfloat16:     # x's values 2j and 2j + 1 as one 32-bit word: a bf16 is an fp32's top half
        xw = tl.load((xrow + k0[:, None]).to(tl.pointer_type(tl.int32)) + tl.arange(0, 8)[None, :], mask=m, other=0)
        return we * (xw << 16).to(tl.float32, bitcast=True) + wo * (xw & -65536).to(tl.float32, bitcast=True)
    xp = xrow + k0[:, None] + 2 * tl.arange(0, 8)[None, :]
    return we * tl.load(xp, mask=m, other=0.0).to(tl.float32) + wo * tl.load(xp + 1, mask=m, other=0.0).to(tl.float32)


@triton.jit
def _norm_runs(nx, ny, ng, s_out, h_out, eps, kk, first_row, K, store):
    """x_hat [R, 16] at K offsets kk [R, 16] (NORM): h = rms_norm(nx + ny) * ng rounded to h_out's
    dtype -- norm_rope_act._add_rms_norm_kernel's operations, the row's sum of squares taken over
    the first row's runs (first_row [R, 1]: each of the tile's rows covers the whole K once); where
    `store` (program 0), s = nx + ny and h are stored too."""
    km = kk < K
    v = tl.load(nx + kk, mask=km, other=0.0).to(tl.float32) + tl.load(ny + kk, mask=km, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(tl.sum(tl.where(first_row & km, v * v, 0.0), axis=1), axis=0) / K + eps)
    g = tl.load(ng + kk, mask=km, other=0.0).to(tl.float32)
    h = (v * r * g).to(h_out.dtype.element_ty)
    tl.store(s_out + kk, v.to(s_out.dtype.element_ty), mask=km & first_row & store)
    tl.store(h_out + kk, h, mask=km & first_row & store)
    return h.to(tl.float32)


@triton.jit
def _gemv_kernel(raw, x, out, part, bias, M, N, K, row_bytes, stride_xm, stride_om, tiles_per_split,
                 nx, ny, ng, s_out, eps, h_rn, cnt, rp, rt, kc, vc, nq, nk, kvs,
                 QT: tl.constexpr, QK: tl.constexpr, TS: tl.constexpr,
                 BN: tl.constexpr, BK: tl.constexpr, MP: tl.constexpr,
                 SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, USE_DOT: tl.constexpr, IEEE: tl.constexpr,
                 PDL: tl.constexpr = 0, ONE: tl.constexpr = False, NORM: tl.constexpr = False,
                 HW: tl.constexpr = False, RN: tl.constexpr = False, BD: tl.constexpr = 16, RP: tl.constexpr = 0,
                 HD: tl.constexpr = 2):
    # The weight tile is [BN * S runs, 16] (see dequant.decode): run q is row q // S of the
    # program's rows, values s*16.. (s = q % S) of the current K tile.
    # PDL (pdl.py): ONE (one K tile, one row, no split) decodes its weights before the wait,
    # the other configs wait first.
    # NORM (ONE only; Switches.gemv_raw_norm): x is not read; the row is made from the residual nx
    # and the previous GEMV's output ny (_norm_runs), x receiving h and s_out s from program 0.
    # RN (ONE only; Switches.gemv_raw_resnorm): after its rows are stored, the program that stores last (an
    # atomic ticket on cnt) makes s_out = nx + out and h_rn = rms_norm(s_out) * ng (resnorm_tail.py).
    # RP (ONE only; Switches.gemv_raw_rope): 1 neox / 2 normal rope pairs -- a program's rows are a permutation of
    # its head's HD rows (gemv_raw_rope.rope_row), and q rotated goes to out, k rotated and v to the caches kc / vc
    # at row *rp (gemv_raw_rope.rope_store); out's k / v rows are not written.
    S: tl.constexpr = BK // 16
    R: tl.constexpr = BN * S
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    run = tl.arange(0, R)
    if RP:
        n_run = rope_row(pid_n, run // S, BN, HD, RP == 1)       # [R] row of each run
    else:
        n_run = pid_n * BN + run // S                            # [R] row of each run
    s16 = (run % S) * 16                                         # [R] offset of the run in the tile
    rowp = raw + n_run.to(tl.int64) * row_bytes
    i = tl.arange(0, 16)[None, :]
    n_tiles = tl.cdiv(K, BK)
    t0 = pid_s * tiles_per_split
    t1 = tl.minimum(t0 + tiles_per_split, n_tiles)
    if ONE and HW:
        acc2 = _runs_dot_hw(rowp, n_run, s16, x + pid_m.to(tl.int64) * stride_xm, N, K, QT, QK, TS, PDL)
        t1 = t0                                                  # the loop below does nothing
    elif ONE:
        m, w = _weight_runs(rowp, n_run, s16, i, N, K, QT, QK, TS)   # weights: before the wait
        pdl_enter(PDL)
        if NORM:
            x1 = _norm_runs(nx, ny, ng, s_out, x, eps, s16[:, None] + i, (run // S == 0)[:, None], K, pid_n == 0)
        else:
            x1 = tl.load(x + pid_m.to(tl.int64) * stride_xm + s16[:, None] + i, mask=m, other=0.0).to(tl.float32)
        acc2 = w * x1
        t1 = t0                                                  # the loop below does nothing
    else:
        pdl_enter(PDL)
    if USE_DOT:
        mrow = pid_m * MP + tl.arange(0, MP)
        mmask = mrow < M
        acc = tl.zeros([BN, MP], dtype=tl.float32)
    elif not ONE:
        # elementwise partial products, reduced once after the loop (a reduction per
        # iteration costs warp shuffles every tile)
        acc2 = tl.zeros([R, 8 if HW else 16], dtype=tl.float32)
    for t in range(t0, t1):
        k0 = t * BK + s16                                        # [R] first value of each run
        if HW:
            acc2 += _runs_dot_hw(rowp, n_run, k0, x + pid_m.to(tl.int64) * stride_xm, N, K, QT, QK, TS, 0)
        else:
            m, w = _weight_runs(rowp, n_run, k0, i, N, K, QT, QK, TS)
        if USE_DOT:
            kk = t * BK + tl.arange(0, BK)
            xt = tl.load(x + mrow[None, :].to(tl.int64) * stride_xm + kk[:, None],
                         mask=(kk < K)[:, None] & mmask[None, :], other=0.0)   # [BK, MP]
            w2 = tl.reshape(w, (BN, BK)).to(xt.dtype)
            if IEEE:
                acc += tl.dot(w2, xt, input_precision="ieee")
            else:
                acc += tl.dot(w2, xt)
        elif not HW:
            xv = tl.load(x + pid_m.to(tl.int64) * stride_xm + k0[:, None] + i, mask=m, other=0.0)
            acc2 += w * xv.to(tl.float32)
    if RP:
        n = rope_row(pid_n, tl.arange(0, BN), BN, HD, RP == 1)
    else:
        n = pid_n * BN + tl.arange(0, BN)
    nmask = n < N
    if USE_DOT:
        if SPLIT == 1:
            if HAS_BIAS:
                acc += tl.load(bias + n, mask=nmask, other=0.0).to(tl.float32)[:, None]
            optr = out + mrow[None, :].to(tl.int64) * stride_om + n[:, None]
            tl.store(optr, acc.to(out.dtype.element_ty), mask=nmask[:, None] & mmask[None, :])
        else:
            pptr = part + (pid_s * M + mrow[None, :]).to(tl.int64) * N + n[:, None]
            tl.store(pptr, acc, mask=nmask[:, None] & mmask[None, :])
    else:
        acc1 = tl.sum(tl.reshape(tl.sum(acc2, axis=1), (BN, S)), axis=1)     # [BN]
        if SPLIT == 1:
            if HAS_BIAS:
                acc1 += tl.load(bias + n, mask=nmask, other=0.0).to(tl.float32)
            if RP:
                rope_store(acc1, out, pid_n, rp, rt, kc, vc, nq, nk, kvs, BN, HD, RP == 1)
            else:
                tl.store(out + pid_m.to(tl.int64) * stride_om + n, acc1.to(out.dtype.element_ty), mask=nmask)
            if RN:
                resnorm_tail(nx, out, ng, s_out, h_rn, eps, N, cnt, tl.num_programs(0), BD)
        else:
            tl.store(part + (pid_s * M + pid_m).to(tl.int64) * N + n, acc1, mask=nmask)


@triton.jit
def _splitk_reduce_kernel(part, bias, out, MN, N, SPLIT, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """out (M, N) = sum over splits of part (SPLIT, M, N) [+ bias], one launch."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in range(SPLIT):
        acc += tl.load(part + sp * MN + o, mask=m, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias + o % N, mask=m, other=0.0).to(tl.float32)
    tl.store(out + o, acc.to(out.dtype.element_ty), mask=m)


# Programs wanted in flight: a few per SM (132 on the H200) so that each SM has several
# programs' loads outstanding while others compute.
_TARGET_PROGRAMS = 132 * 4


# One-pass rows (Switches.gemv_one_pass): a one-row GEMV over at most this K takes the whole row
# in one K tile, without a split: no partial-sum buffer and no reduce launch after it.
ONE_PASS_MAX_K = 1024


# Switches.gemv_raw_tile4: BN 4 up to this many rows (the lm heads above it keep 8)
TILE4_MAX_ROWS = 65536


def one_pass_tile(m: int, n: int, k: int, tile4: bool = False):
    """(BN, BK) of the one-pass config, or None when the shape is not one (M > 1 or K past
    ONE_PASS_MAX_K). The small models' rows (hidden 576-1024: SmolLM2, Qwen2.5-0.5B, gemma-3-270m)
    took 4 K tiles of 256 in 4 splits and a reduce launch after each GEMV: a layer's seven GEMVs
    were eleven launches. BK: K rounded up to a power of two (the tail masked); BN 4 rows where
    8 would leave fewer than two programs an SM (132 SMs), so the few rows still spread; tile4
    (Switches.gemv_raw_tile4): BN 4 up to TILE4_MAX_ROWS rows (the raw sweep with halfword reads,
    H100: the 0.5B's Q5_0 gate+up 9.43 us at BN 4 against 10.27 at 8; its lm head 74.3 against 69.5)."""
    if m != 1 or k > ONE_PASS_MAX_K:
        return None
    bk = max(16, triton.next_power_of_2(k))
    return (4 if triton.cdiv(n, 8) < 264 or (tile4 and n <= TILE4_MAX_ROWS) else 8), bk


def raw_pdl(sw, x) -> int:
    """The launch's PDL mode for one row x (Switches.gemv_raw_pdl; pdl.enabled's rules, counted
    `pdl.gemv_raw`); 0 for more rows."""
    return pdl_enabled(sw, x.device, "gemv_raw") if x.shape[0] == 1 and sw.gemv_raw_pdl else 0


def raw_kw(sw, x) -> dict:
    """gemv()'s launch options from the switches for x: one_pass (2: with Switches.gemv_raw_tile4), pdl
    (raw_pdl), halfwords."""
    return {"one_pass": (2 if sw.gemv_raw_tile4 else 1) if sw.gemv_one_pass else 0, "pdl": raw_pdl(sw, x),
            "halfwords": sw.gemv_raw_halfwords}


def pass_suffix(m: int, n: int, k: int, one_pass: bool) -> str:
    """The launch path's suffix: '.one_pass' where this shape runs in one pass, else ''."""
    return ".one_pass" if one_pass and one_pass_tile(m, n, k) is not None else ""


def gemv_config(qtype: int, m: int, n: int, k: int, interpret: bool, one_pass: int = 0):
    """(BN, BK, MP, USE_DOT, SPLIT) for this shape; one_pass 2: the tile4 rule (one_pass_tile)."""
    tile = one_pass_tile(m, n, k, one_pass == 2) if one_pass else None
    if tile is not None:
        return tile[0], tile[1], 1, False, 1
    if interpret:
        bn, bk = 16, 64
    else:
        # M=1: 8 rows x 256 values (128 runs, one per thread): the H200 tile sweep (docs/perf-log.md section 3) put
        # (8, 256) first on qkv, down and the lm head, and within 4% of the best on gate_up
        bn, bk = (8, 256) if m == 1 else (64, 128)
    use_dot = m > 1
    mp = 1 if not use_dot else (16 if m <= 16 else 32 if m <= 32 else 64)
    return bn, bk, mp, use_dot, gemv_config_split(m, n, k, bn, bk, mp, use_dot)


def gemv_config_split(m, n, k, bn, bk, mp, use_dot) -> int:
    """Split K until the grid has about _TARGET_PROGRAMS programs."""
    grid_nm = triton.cdiv(n, bn) * (triton.cdiv(m, mp) if use_dot else m)
    n_tiles = triton.cdiv(k, bk)
    if grid_nm >= _TARGET_PROGRAMS:
        return 1
    return min(n_tiles, triton.cdiv(_TARGET_PROGRAMS, grid_nm), 32)


def gemv(x: torch.Tensor, raw: torch.Tensor, qtype: int, n: int, k: int, bias=None,
         out_dtype=None, interpret: bool = False, split: int | None = None,
         tile: tuple[int, int] | None = None, num_warps: int = 4, one_pass: int = 0,
         pdl: int = 0, norm=None, halfwords: bool = False, resnorm=None, rope=None) -> torch.Tensor:
    """x (M, K) float, last dim contiguous; raw uint8 (N, row_bytes) -> (M, N) in x's dtype.

    one_pass: a one-row shape with K <= ONE_PASS_MAX_K in one K tile, no split (one launch); 2: BN 4 up to
    TILE4_MAX_ROWS rows (Switches.gemv_raw_tile4; one_pass_tile).
    pdl: launched with programmatic dependent launch (pdl.py; one row only), the one-pass
    config's weights decoded before its wait.
    norm (one pass only; Switches.gemv_raw_norm): (nx float32 (1, K), ny (1, K), weight (K,), eps,
    s_out float32 (1, K)) -- x is then not read but written: the programs multiply h =
    rms_norm(nx + ny) * weight in x's dtype (norm_rope_act's add_rms_norm, one launch less), and
    program 0 stores h into x and nx + ny into s_out.
    halfwords (Switches.gemv_raw_halfwords): a one-row launch without the norm prologue reads Q4_0 / Q5_0 /
    Q8_0 blocks as halfwords (dequant.decode_hw; counted `gemv_raw.halfwords`), the same values.
    resnorm: (resid float32 (1, N), weight (N,), eps, s float32 (1, N), h (1, N), cnt int32 (>= 1,), zero) -- one
    row in one pass only (else ValueError): the residual add and RMSNorm after the GEMV, s = resid + out and
    h = rms_norm(s) * weight, made by the program that stores last (gemv_resnorm; Switches.gemv_raw_resnorm).
    rope: (positions (1,) int64, turns (Dh/2,) float64, k_cache, v_cache (S, Hkv, Dh), nq, nk, Dh, neox) -- the
    stacked q/k/v rows (nq, nk, nk) in one pass, one row, no norm prologue or residual norm (else ValueError): q
    rotated into out's first nq values, k rotated and v into the caches' row positions[0] (gemv_raw_rope.py;
    Switches.gemv_raw_rope); out's other values are not written.
    split / tile=(BN, BK) / num_warps override the chosen config (benchmark sweeps)."""
    m = x.shape[0]
    assert x.stride(1) == 1 and x.shape[1] == k
    _, qk, ts = LAYOUT[qtype]
    bn, bk, mp, use_dot, auto_split = gemv_config(qtype, m, n, k, interpret, one_pass)
    if tile is not None:
        bn, bk = tile
        auto_split = gemv_config_split(m, n, k, bn, bk, mp, use_dot)
    n_tiles = triton.cdiv(k, bk)
    split = max(1, min(split or auto_split, n_tiles))
    tiles_per_split = triton.cdiv(n_tiles, split)
    split = triton.cdiv(n_tiles, tiles_per_split)          # no empty splits
    one = not use_dot and split == 1 and n_tiles == 1
    if norm is not None and not (one and m == 1 and x.is_contiguous()):
        raise ValueError(f"gemv: the norm prologue needs one row in one pass ({m} x {k} in {n_tiles} K tiles, "
                         f"{split} splits)")
    if resnorm is not None and not (one and m == 1 and norm is None and bias is None):
        raise ValueError(f"gemv: the residual norm epilogue needs one row in one pass without a bias or norm "
                         f"prologue ({m} x {k} in {n_tiles} K tiles, {split} splits)")
    if rope is not None and not (one and m == 1 and norm is None and resnorm is None and bn % 2 == 0
                                 and rope[6] % bn == 0 and n % rope[6] == 0):
        raise ValueError(f"gemv: the rope epilogue needs one row in one pass without a norm, in {bn}-row tiles that "
                         f"pair a head's rows ({m} x {k} in {n_tiles} K tiles, {split} splits, head dim "
                         f"{rope[6]})")
    rp, rt, kc, vc, nq, nk, hd, neox = rope if rope is not None else (x, x, x, x, 0, 0, 2, True)
    nx, ny, ng, eps, s_out = norm if norm is not None else (x, x, x, 0.0, x)
    h_rn, cnt = x, x
    if resnorm is not None:
        nx, ng, eps, s_out, h_rn, cnt = resnorm
    hw = bool(halfwords) and qtype in HALFWORD_TYPES and not use_dot and norm is None
    if hw and (raw.data_ptr() % 2 or raw.stride(0) % 2 or (x.dtype == torch.bfloat16 and x.data_ptr() % 4)):
        hw = False                  # (a halfword or a bf16 pair read needs 2- / 4-byte aligned rows)
        paths.fallback("gemv_raw.halfwords", "a weight row or the bf16 x row at an odd address")
    if hw:
        paths.count("gemv_raw.halfwords")
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    grid = (triton.cdiv(n, bn), split, triton.cdiv(m, mp) if use_dot else m)
    pdl = pdl if m == 1 and not interpret else 0
    _gemv_kernel[grid](raw, x, out, part, bias if bias is not None else out, m, n, k, raw.stride(0),
                       x.stride(0), out.stride(0), tiles_per_split, nx, ny, ng, s_out, float(eps), h_rn, cnt,
                       rp, rt, kc, vc, nq, nk, kc.stride(0) if rope is not None else 0,
                       QT=qtype, QK=qk, TS=ts, BN=bn, BK=bk, MP=mp, SPLIT=split,
                       HAS_BIAS=bias is not None, USE_DOT=use_dot, IEEE=x.dtype == torch.float32,
                       PDL=pdl, ONE=one, NORM=norm is not None, HW=hw, RN=resnorm is not None,
                       BD=triton.next_power_of_2(n) if resnorm is not None else 16,
                       RP=(1 if neox else 2) if rope is not None else 0, HD=hd,
                       num_warps=num_warps, **launch_kw(pdl))
    if split > 1:
        mn = m * n
        blk = 1024 if not interpret else 64
        _splitk_reduce_kernel[(triton.cdiv(mn, blk),)](part, bias if bias is not None else part, out, mn, n, split,
                                                       HAS_BIAS=bias is not None, BLOCK=blk, num_warps=4)
    return out


def gemv_resnorm(a: torch.Tensor, raw: torch.Tensor, qtype: int, n: int, k: int, resid: torch.Tensor, weight,
                 eps: float, out_dtype, cnt: torch.Tensor, interpret: bool = False, pdl: int = 0,
                 halfwords: bool = False) -> tuple | None:
    """(s, h) of ops.linear_add_rms_norm for one decode row over a raw weight in one launch: y = a @ W^T in
    a's dtype (as ops.linear gives it), s = resid + y (float32), h = rms_norm(s) * weight in out_dtype, the
    last two made by the GEMV's last program (Switches.gemv_raw_resnorm; counted `gemv.raw_resnorm`). None
    where the shape is no one-pass tile (K over ONE_PASS_MAX_K) or resid is not a contiguous float32 row:
    the caller takes the GEMV and the add + norm kernel. cnt: a zeroed int32 ticket (the launch resets it)."""
    if (a.shape[0] != 1 or one_pass_tile(1, n, k) is None or resid.dtype != torch.float32
            or tuple(resid.shape) != (1, n) or not resid.is_contiguous() or not a.is_contiguous()):
        return None
    paths.count("gemv.raw_resnorm")
    s = torch.empty((1, n), dtype=torch.float32, device=a.device)
    h = torch.empty((1, n), dtype=out_dtype, device=a.device)
    gemv(a, raw, qtype, n, k, interpret=interpret, one_pass=True, pdl=pdl, halfwords=halfwords,
         resnorm=(resid, weight, float(eps), s, h, cnt))
    return s, h


def fuse_raw_group(ws: tuple) -> bool:
    """One raw block tensor for a decode group (q/k/v, gate/up: Model.decode_groups) whose weights
    were not repacked and share a quantized type and K, so the one-row decode multiplies them in
    one GEMV launch (qmatmul.linear_many, Switches.gemv_raw_fuse). A row of ggml blocks depends
    on nothing outside it, so the rows stacked are the group's matrix; each weight keeps a row
    view (`w.raw`), and the memory is the same. Where the last weight has another type (a Q8_0
    attn_v after Q5_0 q/k, the Q4_K_M rule's fallback), the leading run is fused alone. The first
    weight holds `raw_group = (fused weights, stacked blocks)`; returns whether it fused."""
    from minfer.ops.cuda.dequant import FLOAT_TYPES
    from minfer.ops.cuda.gemv_repack_layout import planes_of

    ws = tuple(ws)

    def rawable(w):
        return (w.qtype not in FLOAT_TYPES and w.qtype in LAYOUT and planes_of(w) is None
                and w.raw.dim() == 2 and w.raw.shape[0] == w.shape[0] and w.raw.is_contiguous())

    if len(ws) < 2 or not all(rawable(w) for w in ws) or len({w.shape[1] for w in ws}) != 1:
        return False
    lead = ws if len({w.qtype for w in ws}) == 1 else ws[:-1]
    if len(lead) < 2 or len({w.qtype for w in lead}) != 1 or len({w.raw.shape[1] for w in lead}) != 1:
        return False
    cat = torch.cat([w.raw for w in lead])
    r0 = 0
    for w in lead:
        w.raw = cat[r0:r0 + w.shape[0]]
        r0 += w.shape[0]
    lead[0].raw_group = (lead, cat)
    return True


def _decode_groups(model) -> list[tuple]:
    """The model's decode groups (Model.decode_groups; its linear groups where it declares no more)."""
    groups = getattr(model, "decode_groups", None) or getattr(model, "linear_groups", lambda: [])
    return [tuple(g) for g in groups()]


def fuse_raw_groups(model) -> int:
    """fuse_raw_group over the model's decode groups (at load on CUDA); returns how many fused."""
    return sum(fuse_raw_group(g) for g in _decode_groups(model))


# the decode groups whose input is a norm's output, by their first weight's name: the attention norm's (q/k/v)
# and the FFN norm's (gate/up) -- not a shared expert's (ffn_gate_shexp), whose input is the MoE block's
_ROLE_GROUPS = (("attn_norm", re.compile(r"(^|\.)attn_q\.weight$")), ("ffn_norm", re.compile(r"(^|\.)ffn_gate\.weight$")))


def raw_prenorm_roles(model) -> frozenset:
    """The norms ("attn_norm" before q/k/v, "ffn_norm" before gate/up) whose every layer's group (found by
    name, one a layer) is a fused raw group (fuse_raw_group) whose one-row GEMV runs in one pass: the
    norms add_rms_norm may leave to the group's launch (Switches.gemv_raw_norm; the workspace's
    raw_prenorm, set at load and again by a BatchEngine after its dense planes)."""
    groups = _decode_groups(model)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", None)

    def folds(g) -> bool:
        rg = getattr(g[0], "raw_group", None)
        return (rg is not None and g[:len(rg[0])] == rg[0]
                and one_pass_tile(1, sum(w.shape[0] for w in rg[0]), g[0].shape[1]) is not None
                # (the batch engine's dense planes take such rows to cuBLAS: nothing to fold into)
                and all(getattr(w, "batch_dense", None) is None for w in g)
                and getattr(g[0], "batch_dense_group", None) is None)

    roles = set()
    for role, pattern in _ROLE_GROUPS:
        mine = [g for g in groups if pattern.search(str(getattr(g[0], "name", "")))]
        if mine and len(mine) == n_layers and all(folds(g) for g in mine):
            roles.add(role)
    return frozenset(roles)
