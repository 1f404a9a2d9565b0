"""Batched-decode GEMM over the repacked Q4_K / Q6_K planes: out (M, N) = x (M, K) @ W^T, 8 < M <= 256.

Why: batched decode at 16-256 rows multiplied by dense bf16 copies of every weight (the batch
engine's dense planes: +13.17 GiB on the 7B, ~14 GB read per step); the repacked planes hold
the same values in 4.6 / 6.6 bits (~4.4 GB for the 7B). The GEMV's tl.dot path (gemv_repack.py)
multiplies K=32 slices and ran at 0.4-0.94 TB/s at M=32 (docs/perf-log.md, decode GEMV).

Shape of the kernel (swap-AB): the MMA's M dimension is the weight's rows (BN = 64/128: one
wgmma row tile per warpgroup), its N dimension the batch rows (BM = 16..128), K one or two
super-blocks (BB * 256 values) per iteration. Per iteration a program
  - loads the tile's quant words ([BN, 8*BB chunks, 4 words]: one 16-byte load per chunk, as
    the GEMV; evict-first when no other M tile will read them) and its scales;
  - decodes them in registers to the EXACT values in fp32 (the bit tricks of gemv_repack's
    _dequant_kernel: q under the exponent of 2^23, an exact subtract, dl*q exact, one rounding
    for - ml, as ggml), rounded once to x's dtype -- the values cuBLAS multiplies on a dense
    plane made by dequantize_into, so both paths see the same bf16 weights;
  - multiplies the [BN, BK] tile by x^T [BK, BM] in ONE tl.dot (fp32 accumulate).
Triton's pipeliner keeps num_stages tiles of words, scales and x in flight (cp.async).
Split K (SPLIT > 1: too few row tiles to fill the GPU): fp32 partials (SPLIT, M, N); the last
program of a tile (an atomic ticket, as the GEMV) sums them in split order -- deterministic --
and runs the epilogue (+ bias, + resid), so one launch per GEMM; inline_reduce=False sums in a
second kernel. Grid axis 0 is the M tile, so the programs that read the same weight tile run
side by side and the second finds it in L2.
Configs: [BN, BM, BB, SPLIT, num_warps, num_stages] per "<type> <N>x<K> m<bucket>" in
qgemm_repack_h200.json (minfer/bench/qgemm_sweep.py writes them), else default_config.
"""

from __future__ import annotations

import json
import os

import torch
import triton
import triton.language as tl

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, REPACKED_TYPES, Repacked

MAX_M = 256                           # largest M the kernel is made for (bigger: prefill's dequant + cuBLAS)


# ---------------------------------------------------------------- the kernel

@triton.jit
def _decode(wq, hq, sa, sb, QT: tl.constexpr, BN: tl.constexpr, C: tl.constexpr):
    """[BN, C*32] fp32 exact values of C chunks: wq [BN, C, 4] int32 words (hq: Q6_K's high-bit
    halfwords as int32), sa/sb [BN, C] the chunk's scale words (Q4_K: sc | m << 8 and
    d | dmin << 16; Q6_K: the int8 scale pair as int16 and d). Same operations as
    gemv_repack._dequant_kernel, which is bit-exact against minfer.quants."""
    # nibble p of word w is value 4p + w of the chunk: broadcasting over p puts a chunk's 32
    # values in order in one thread, so the reshape keeps K in natural order
    sh = (tl.arange(0, 8) * 4)[None, None, :, None]
    if QT == 12:
        scm = sa.to(tl.int32)
        d = (sb & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = (sb >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        dl = (d * (scm & 255).to(tl.float32))[:, :, None, None]              # exact: 11 x 6 bits
        ml = (dmin * ((scm >> 8) & 255).to(tl.float32))[:, :, None, None]
        q = (wq[:, :, None, :] >> sh) & 15
        # exact int -> float: q under 2^23's exponent, minus 2^23 (no I2F); dl*q is exact,
        # so mul-then-sub (or an fma) rounds once, as ggml's d1 * q - m1
        v = ((q | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0) * dl - ml
    else:
        s2 = sa.to(tl.int32)
        d = sb.to(tl.float32)
        dl0 = (d * ((s2 << 24) >> 24).to(tl.float32))[:, :, None, None]      # scale 2c: values 0..15
        dl1 = (d * (s2 >> 8).to(tl.float32))[:, :, None, None]               # scale 2c+1: 16..31
        q = ((wq[:, :, None, :] >> sh) & 15) | (((hq[:, :, None, :] >> (sh // 2)) & 3) << 4)
        qf = (q | 0x4B000000).to(tl.float32, bitcast=True) - 8388640.0      # 2^23 + 32: q - 32, exact
        half = (tl.arange(0, 8) < 4)[None, None, :, None]
        v = qf * tl.where(half, dl0, dl1)
    return tl.reshape(v, (BN, C * 32))


@triton.jit
def _epilogue(v, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om,
              HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr):
    """v [BN, BM] fp32 (+ bias[n] + resid[m, n]) -> out[m, n] (stores coalesced along n)."""
    if HAS_BIAS:
        v += tl.load(bias + rows, mask=rmask, other=0.0).to(tl.float32)[:, None]
    m2 = rmask[:, None] & mmask[None, :]
    if HAS_RESID:
        v += tl.load(resid + mcol[None, :].to(tl.int64) * stride_rm + rows[:, None], mask=m2,
                     other=0.0).to(tl.float32)
    tl.store(out + mcol[None, :].to(tl.int64) * stride_om + rows[:, None], v.to(out.dtype.element_ty), mask=m2)


@triton.jit
def _qgemm_kernel(p0, p1, p2, p3, x, out, part, cnt, bias, resid,
                  M, N, NB, stride_xm, stride_rm, stride_om, blocks_per_split, SPLIT,
                  QT: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr, BB: tl.constexpr,
                  EVEN_K: tl.constexpr, IS_SPLIT: tl.constexpr, INLINE_REDUCE: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, EVICT: tl.constexpr,
                  DOT_F32: tl.constexpr, IEEE: tl.constexpr):
    """Program (M tile, row tile, K split): acc [BN, BM] = W[rows, K range] @ x[mcols, K range]^T."""
    C: tl.constexpr = BB * 8                                           # chunks of 32 values per row and step
    BK: tl.constexpr = BB * 256
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_s = tl.program_id(2)
    rows = pid_n * BN + tl.arange(0, BN)
    rmask = rows < N
    # rows past N (and batch rows past M) read the last valid row: no mask on the hot loads;
    # they are never stored
    row2 = tl.minimum(rows, N - 1).to(tl.int64)[:, None]               # [BN, 1]
    mcol = pid_m * BM + tl.arange(0, BM)
    mmask = mcol < M
    xrow = tl.minimum(mcol, M - 1).to(tl.int64)[:, None] * stride_xm   # [BM, 1]
    ci = tl.arange(0, C)
    w4 = tl.arange(0, 4 * C)
    kv = tl.arange(0, BK)
    b_lo = pid_s * blocks_per_split
    b_hi = tl.minimum(b_lo + blocks_per_split, NB)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for blk in range(b_lo, b_hi, BB):
        kc = blk * 8 + ci                                              # [C] chunk index in the row
        qoff = row2 * (NB * 32) + blk * 32 + w4[None, :]               # [BN, 4C] words: 16-byte chunks
        xoff = xrow + (blk * 256 + kv)[None, :]                        # [BM, BK]
        if EVEN_K:
            wq = tl.load(p0 + qoff, eviction_policy=EVICT)
            if QT == 12:
                hq = wq
                sa = tl.load(p1 + row2 * (NB * 8) + kc[None, :], eviction_policy=EVICT)
                sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row2 * NB + (kc // 8)[None, :],
                             eviction_policy=EVICT)
            else:
                hq = tl.load(p1 + qoff, eviction_policy=EVICT)
                # the int8 scales 2c, 2c+1 of chunk c as one little-endian int16
                sa = tl.load(p2.to(tl.pointer_type(tl.int16)) + row2 * (NB * 8) + kc[None, :],
                             eviction_policy=EVICT)
                sb = tl.load(p3 + row2 * NB + (kc // 8)[None, :], eviction_policy=EVICT)
            xb = tl.load(x + xoff)
        else:
            # a K range that is not a whole number of BB blocks: the blocks past b_hi read as
            # zero words and zero scales (value 0) and zero x
            km4 = (blk * 32 + w4 < b_hi * 32)[None, :]
            kmask = (kc < b_hi * 8)[None, :]
            wq = tl.load(p0 + qoff, mask=km4, other=0, eviction_policy=EVICT)
            if QT == 12:
                hq = wq
                sa = tl.load(p1 + row2 * (NB * 8) + kc[None, :], mask=kmask, other=0, eviction_policy=EVICT)
                sb = tl.load(p2.to(tl.pointer_type(tl.int32)) + row2 * NB + (kc // 8)[None, :], mask=kmask,
                             other=0, eviction_policy=EVICT)
            else:
                hq = tl.load(p1 + qoff, mask=km4, other=0, eviction_policy=EVICT)
                sa = tl.load(p2.to(tl.pointer_type(tl.int16)) + row2 * (NB * 8) + kc[None, :], mask=kmask,
                             other=0, eviction_policy=EVICT)
                sb = tl.load(p3 + row2 * NB + (kc // 8)[None, :], mask=kmask, other=0.0, eviction_policy=EVICT)
            xb = tl.load(x + xoff, mask=(blk * 256 + kv < b_hi * 256)[None, :], other=0.0)
        wt = _decode(tl.reshape(wq, (BN, C, 4)), tl.reshape(hq, (BN, C, 4)).to(tl.int32), sa, sb, QT, BN, C)
        if DOT_F32:
            # bf16 x in Triton's interpreter, whose bf16 dot is wrong and whose fp32 -> bf16 cast
            # truncates: the tile is rounded to bf16 by integer ops (round to nearest even, what
            # the GPU's cast does) and multiplied in fp32, so the values are the GPU kernel's
            bits = wt.to(tl.int32, bitcast=True)
            wr = ((bits + 0x7FFF + ((bits >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
            acc = tl.dot(wr, tl.trans(xb.to(tl.float32)), acc, input_precision="ieee")
        elif IEEE:
            acc = tl.dot(wt, tl.trans(xb), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt.to(x.dtype.element_ty), tl.trans(xb), acc)
    if not IS_SPLIT:
        _epilogue(acc, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)
    else:
        poff = (pid_s * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
        pm = rmask[:, None] & mmask[None, :]
        tl.store(part + poff, acc, mask=pm)
        if INLINE_REDUCE:
            # the last split of a tile to finish sums all partials in split order (deterministic);
            # a CTA barrier, then one acq_rel ticket per program, orders the partial stores before it
            tl.debug_barrier()
            tile = pid_n * tl.num_programs(0) + pid_m
            ticket = tl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT - 1:
                tot = tl.zeros([BN, BM], dtype=tl.float32)
                for sp in range(SPLIT):
                    o2 = (sp * M + mcol[None, :]).to(tl.int64) * N + rows[:, None]
                    tot += tl.load(part + o2, mask=pm, other=0.0, cache_modifier=".cg")
                _epilogue(tot, rows, rmask, mcol, mmask, bias, resid, out, stride_rm, stride_om,
                          HAS_BIAS, HAS_RESID)
                tl.atomic_xchg(cnt + tile, 0)                          # ready for the next launch (graph replays)


@triton.jit
def _reduce_kernel(part, bias, resid, out, M, N, SPLIT, stride_rm, stride_om,
                   HAS_BIAS: tl.constexpr, HAS_RESID: tl.constexpr, BLOCK: tl.constexpr):
    """out[m, n] = sum over splits of part (SPLIT, M, N) in split order [+ bias] [+ resid]."""
    m = tl.program_id(1)
    n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    nm = n < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for sp in range(SPLIT):
        acc += tl.load(part + (sp * M + m).to(tl.int64) * N + n, mask=nm, other=0.0)
    mc = m + tl.arange(0, 1)
    _epilogue(acc[:, None], n, nm, mc, mc < M, bias, resid, out, stride_rm, stride_om, HAS_BIAS, HAS_RESID)


# ---------------------------------------------------------------- configs

# "<type> <N>x<K> m<bucket>" -> [BN, BM, BB, SPLIT, num_warps, num_stages], measured on the H200
# by minfer/bench/qgemm_sweep.py; shapes not listed take default_config.
_CONFIG_FILE = os.path.join(os.path.dirname(__file__), "qgemm_repack_h200.json")
_TARGET_PROGRAMS = 132 * 2            # two programs per H200 SM before K is split


def load_configs(path: str = _CONFIG_FILE) -> dict:
    try:
        with open(path) as f:
            return {k: tuple(v) for k, v in json.load(f).get("configs", {}).items()}
    except FileNotFoundError:
        return {}


H200_CONFIGS = load_configs()


def m_bucket(m: int) -> int:
    """The config table's M key: the next of 16, 32, 64, 128, 256."""
    for b in (16, 32, 64, 128):
        if m <= b:
            return b
    return 256


def split_for(qtype: int, m: int, n: int, k: int, bn: int, bm: int, bb: int,
              target: int = _TARGET_PROGRAMS) -> int:
    """K splits so that row tiles x M tiles x splits reaches ~target programs (at most 16, at
    least one K step of BB blocks each)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    if tiles >= target:
        return 1
    return max(1, min(triton.cdiv(k // 256, bb), triton.cdiv(target, tiles), 16))


def default_config(qtype: int, m: int, n: int, k: int) -> tuple:
    """[BN, BM, BB, SPLIT, num_warps, num_stages] for a shape the table lacks: one warpgroup on
    64 weight rows, the batch rows in one M tile up to 128 (two at 256), one super-block per
    step; stages so that the x tiles (BM x 256 bf16 each) stay well inside shared memory."""
    bm = min(m_bucket(m), 128)
    bn, bb, warps = 64, 1, 4
    stages = 4 if bm <= 32 else 3 if bm <= 64 else 2
    return bn, bm, bb, split_for(qtype, m, n, k, bn, bm, bb), warps, stages


def config_for(qtype: int, m: int, n: int, k: int, interpret: bool = False) -> tuple:
    if interpret:   # few, large programs: the interpreter's cost is per operation, not per value
        return (32, min(m_bucket(m), 64), 2, 1, 4, 1)
    hit = H200_CONFIGS.get(f"{REPACKED_TYPES[qtype]} {n}x{k} m{m_bucket(m)}")
    return tuple(hit) if hit else default_config(qtype, m, n, k)


# ---------------------------------------------------------------- wrapper

def _planes4(rw: Repacked) -> tuple:
    p = rw.planes
    return p if len(p) == 4 else (p[0], p[1], p[2], p[0])


def qgemm(x: torch.Tensor, rw: Repacked, bias=None, resid=None, out_dtype=None, config=None, ws=None,
          inline_reduce: bool = True, interpret: bool = False) -> torch.Tensor:
    """out (M, N) = x @ W^T [+ bias] [+ resid] for W a repacked Q4_K/Q6_K weight (gemv_repack_layout).

    x (M, K) bf16/fp16 (fp32: exact fp32 weights, IEEE dot; for tests), rows contiguous; bias (N,),
    resid (M, N) added in fp32. config = (BN, BM, BB, SPLIT, num_warps, num_stages) overrides the
    table (sweeps). A split K takes its ticket counters from `ws` (anything with .counters(n) ->
    a zeroed int32 tensor, e.g. gemv_repack.GemvWorkspace: the counters reset themselves, so
    the GEMV and this kernel can share them) or a fresh zeroed buffer."""
    m, k = x.shape
    n = rw.n
    if rw.qtype not in REPACKED_TYPES:
        raise MinferError(f"qgemm_repack: ggml type {rw.qtype} has no repacked planes (Q4_K, Q6_K only)")
    if k != rw.k or x.stride(1) != 1:
        raise MinferError(f"qgemm_repack: x of shape {tuple(x.shape)} (strides {x.stride()}), expected (M, {rw.k}) "
                          f"with contiguous rows")
    if resid is not None and (tuple(resid.shape) != (m, n) or resid.stride(1) != 1):
        raise MinferError(f"qgemm_repack: resid has shape {tuple(resid.shape)}, expected ({m}, {n}) "
                          f"with contiguous rows")
    if bias is not None and tuple(bias.shape) != (n,):
        raise MinferError(f"qgemm_repack: bias has shape {tuple(bias.shape)}, expected ({n},)")
    bn, bm, bb, split, nwarps, stages = tuple(config or config_for(rw.qtype, m, n, k, interpret))
    nb = k // 256
    bps = triton.cdiv(triton.cdiv(nb, max(1, split)), bb) * bb          # whole K steps per split
    split = triton.cdiv(nb, bps)                                        # no empty splits
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    mt = triton.cdiv(m, bm)
    grid = (mt, triton.cdiv(n, bn), split)
    part = torch.empty((split, m, n), dtype=torch.float32, device=x.device) if split > 1 else out
    inline = inline_reduce and split > 1
    cnt = out
    if inline:
        need = grid[0] * grid[1]
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    p0, p1, p2, p3 = _planes4(rw)
    f32 = x.dtype == torch.float32
    _qgemm_kernel[grid](p0, p1, p2, p3, x, out, part, cnt, bias if bias is not None else out,
                        resid if resid is not None else out,
                        m, n, nb, x.stride(0), resid.stride(0) if resid is not None else 0, out.stride(0), bps, split,
                        QT=rw.qtype, BN=bn, BM=bm, BB=bb, EVEN_K=nb % bb == 0, IS_SPLIT=split > 1,
                        INLINE_REDUCE=inline, HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                        EVICT="evict_first" if mt == 1 else "",
                        DOT_F32=interpret and x.dtype == torch.bfloat16, IEEE=f32,
                        num_warps=nwarps, num_stages=stages)
    if split > 1 and not inline:
        blk = 64 if interpret else 1024
        _reduce_kernel[(triton.cdiv(n, blk), m)](part, bias if bias is not None else part,
                                                 resid if resid is not None else part, out, m, n, split,
                                                 resid.stride(0) if resid is not None else 0, out.stride(0),
                                                 HAS_BIAS=bias is not None, HAS_RESID=resid is not None,
                                                 BLOCK=blk, num_warps=4)
    return out
