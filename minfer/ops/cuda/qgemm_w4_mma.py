"""The batched-decode GEMM over w4 planes (qgemm_w4.py), in Gluon (Triton's explicit-layout
dialect), so that the decoded weights land in the tensor-core operand registers with no
shared-memory round trip. Used by qmatmul for 9..32 rows of the large Q4_K/Q6_K matrices
(`use_w4`, per-shape configs below; Switches.qgemm_w4*), on sm_90 only.

Why Gluon: a Triton kernel over the same planes decoded in ~2 instructions per value, but Triton
moved the decoded tile into the MMA's operand layout through a small shared buffer, 16 times per
K step with two barriers each (SASS of an sm_90 build): 0.25-0.5 TB/s (docs/perf-log.md W1).

Layout: each thread loads exactly the words whose values its MMA A fragments hold (the A
fragment of mma.sync m16n8k16 and of wgmma from registers; PTX ISA, "Matrix Fragments for
mma.m16n8k16"): lane 4g + t holds rows g and g + 8 of a 16-row block and, per 32 values of K,
K offsets 8i + 2t + e (i = 0..3, e = 0, 1). So the "fragment planes" store, per row and 32-value
chunk c, thread t's 8 values as one word (pair i = nibbles i, i + 4: the bf16x2 decode), and per
row and 128 values the 4 chunks' words of one thread side by side (one 16-byte load):
word index = 16 * (c // 4) + 4 * t + c % 4. `convert_layout(..., assert_trivial=True)` proves
at compile time that the decoded tile needs no data movement. The scale planes are those of
qgemm_w4 (Q4_K: {s, -m} per chunk; Q6_K: {s_a, s_b}, the two 16-value scales of the chunk, as
one int32).

K loop: either the weights two steps ahead in registers (x in two shared buffers), or a cp.async
ring of STAGES steps in shared memory (config's 7th value). Split K: partials reduced by the
last program of a tile (atomic ticket, split order: deterministic), counters that reset
themselves (CUDA-graph replays). Unsplit shapes: a persistent grid of programs x occupancy.
"""
from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma

from minfer.errors import MinferError
from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K
from minfer.ops.cuda.qgemm_w4 import W4Planes

BK = gl.constexpr(128)                    # K values per step: 4 chunks, one 16-byte load per row and thread


# ---------------------------------------------------------------- planes

# ---------------------------------------------------------------- the kernel

_PAIR4 = """
    lop3.b32 t, {src}, $10, $11, 0xEA;
    sub.bf16x2 t, t, $11;
    fma.rn.bf16x2 t, t, s2, m2;
    mov.b32 {{{o0}, {o1}}}, t;"""

_ASM_Q4 = gl.constexpr("{\n .reg .b32 t, u, s2, m2;\n"
                       " prmt.b32 s2, $9, 0, 0x1010;\n prmt.b32 m2, $9, 0, 0x3232;"
                       + _PAIR4.format(src="$8", o0="$0", o1="$1")
                       + "\n shr.b32 u, $8, 4;" + _PAIR4.format(src="u", o0="$2", o1="$3")
                       + "\n shr.b32 u, $8, 8;" + _PAIR4.format(src="u", o0="$4", o1="$5")
                       + "\n shr.b32 u, $8, 12;" + _PAIR4.format(src="u", o0="$6", o1="$7")
                       + "\n}")

# Q6_K: pairs 0, 1 (K offsets 2t + e, 8 + 2t + e) take the chunk's first 16-value scale, pairs
# 2, 3 the second; the crumbs of pair i sit at bits 2i / 8 + 2i of the halfword
_PAIR6 = """
    {shift}
    lop3.b32 t, {src}, $11, $12, 0xEA;
    lop3.b32 t, v, $13, t, 0xEA;
    sub.bf16x2 t, t, $12;
    fma.rn.bf16x2 t, t, {s}, {m};
    mov.b32 {{{o0}, {o1}}}, t;"""

_ASM_Q6 = gl.constexpr("{\n .reg .b32 t, u, v, hh, sa, sb, ma, mb;\n"
                       " prmt.b32 sa, $10, 0, 0x1010;\n prmt.b32 sb, $10, 0, 0x3232;\n"
                       " mul.rn.bf16x2 ma, sa, $14;\n mul.rn.bf16x2 mb, sb, $14;\n"
                       " cvt.u32.u16 hh, $9;\n prmt.b32 hh, hh, 0, 0x4140;"
                       + _PAIR6.format(shift="shl.b32 v, hh, 4;", src="$8", s="sa", m="ma", o0="$0", o1="$1")
                       + "\n shr.b32 u, $8, 4;"
                       + _PAIR6.format(shift="shl.b32 v, hh, 2;", src="u", s="sa", m="ma", o0="$2", o1="$3")
                       + "\n shr.b32 u, $8, 8;"
                       + _PAIR6.format(shift="mov.b32 v, hh;", src="u", s="sb", m="mb", o0="$4", o1="$5")
                       + "\n shr.b32 u, $8, 12;"
                       + _PAIR6.format(shift="shr.b32 v, hh, 2;", src="u", s="sb", m="mb", o0="$6", o1="$7")
                       + "\n}")


@gluon.constexpr_function
def _words_layout(BN, NW):
    """[BN, 4 (t), 4 (chunk)] words: lanes 4g + t, warps on 16-row blocks, rows g + 8 and the
    further row blocks and the 4 chunks in registers (the chunks fastest: one 16-byte load)."""
    reg = [[0, 0, 1], [0, 0, 2], [8, 0, 0]]
    r = 16 * NW
    while r < BN:
        reg.append([r, 0, 0])
        r *= 2
    warps = []
    w = 16
    while w < 16 * NW:
        warps.append([w, 0, 0])
        w *= 2
    return gl.DistributedLinearLayout(reg_bases=reg, lane_bases=[[0, 1, 0], [0, 2, 0], [1, 0, 0], [2, 0, 0], [4, 0, 0]],
                                      warp_bases=warps, block_bases=[], shape=[BN, 4, 4])


@gluon.jit
def _join8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[..., 2, 2, 2] with v_p at [..., p // 4, p // 2 % 2, p % 2]."""
    return gl.join(gl.join(gl.join(v0, v4), gl.join(v2, v6)), gl.join(gl.join(v1, v5), gl.join(v3, v7)))


@gluon.jit
def _decode(w, h, s, HIGH: gl.constexpr, BN: gl.constexpr, a_l: gl.constexpr):
    """The [BN, BK] bf16 A operand of one K step from its words, in the mma A layout (no data
    moves between threads: assert_trivial)."""
    if HIGH:
        v = gl.inline_asm_elementwise(_ASM_Q6, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,r,r,r,r,r",
                                      [w, h, s, 0x000F000F, 0x43004300, 0x00300030, -1040137728],
                                      dtype=(gl.int16,) * 8, is_pure=True, pack=1)
    else:
        v = gl.inline_asm_elementwise(_ASM_Q4, "=h,=h,=h,=h,=h,=h,=h,=h,r,r,r,r", [w, s, 0x000F000F, 0x43004300],
                                      dtype=(gl.int16,) * 8, is_pure=True, pack=1)
    # output p = 2i + e of word (row, t, c) is K offset 32c + 8i + 2t + e
    j = _join8(v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7])         # [BN, t, c, i // 2, i % 2, e]
    j = gl.permute(j, [0, 2, 3, 4, 1, 5])                               # [BN, c, i // 2, i % 2, t, e]
    a = gl.reshape(j, [BN, BK]).to(gl.bfloat16, bitcast=True)
    return gl.convert_layout(a, a_l, assert_trivial=True)


@gluon.jit
def _w4_mma_kernel(qw, qh, sp, x, out, part, cnt, bias, M, N, K, stride_w, stride_s, stride_xm, stride_om,
                   steps_per_split, SPLIT, MT, UNITS,
                   HIGH: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, NW: gl.constexpr,
                   IS_SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr):
    """Persistent: program p runs units p, p + P, ... of (row tile, M tile, K split), K split
    fastest (the splits of one tile run side by side and share x in L2): acc [BN, BM] =
    W[rows, K range] @ x[mcols, K range]^T, by Hopper's wgmma: A from the decoded registers, B =
    x^T read by the tensor cores from shared memory (mma.sync, with B loaded into every warp's
    registers, measured within 5% either way and was dropped: perf-log W2)."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, BM, 16])
    xs_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BM, BK], gl.bfloat16)
    # STAGES > 0: words, scales and x of STAGES steps in shared memory (cp.async ring); 0: the
    # weights two steps ahead in registers, x in two buffers
    NB: gl.constexpr = STAGES if STAGES > 0 else 2
    xs = gl.allocate_shared_memory(gl.bfloat16, [NB, BM, BK], xs_l)
    # (a shared layout's rank is the tile's: the leading stage axis is an index)
    plain4: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0])
    plain3: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    if STAGES > 0:
        ws_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4, 4], plain4)
        ss_s = gl.allocate_shared_memory(gl.int32, [STAGES, BN, 4], plain3)
        hs_s = gl.allocate_shared_memory(gl.int16, [STAGES if HIGH else 1, BN, 4, 4], plain4)
    else:                                   # (unused: the register loop allocates nothing more)
        ws_s = xs
        ss_s = xs
        hs_s = xs
    if IS_SPLIT:
        # one unit per program: a loop over units keeps the split epilogue's addresses live
        # through the K loop (233 registers in the sm_90 build, against 128 without)
        u = gl.program_id(0)
        _unit(qw, qh, sp, x, out, part, cnt, bias, M, N, K, stride_w, stride_s, stride_xm, stride_om,
              steps_per_split, SPLIT, MT, (u // SPLIT) % MT, u // (SPLIT * MT), u % SPLIT, xs, ws_s, ss_s, hs_s, mma,
              HIGH, BN, BM, NW, IS_SPLIT, HAS_BIAS, STAGES)
    else:
        for u in range(gl.program_id(0), UNITS, gl.num_programs(0)):
            pid_m = u % MT
            pid_n = u // MT
            _unit(qw, qh, sp, x, out, part, cnt, bias, M, N, K, stride_w, stride_s, stride_xm, stride_om,
                  steps_per_split, SPLIT, MT, pid_m, pid_n, 0, xs, ws_s, ss_s, hs_s, mma, HIGH, BN, BM, NW,
                  IS_SPLIT, HAS_BIAS, STAGES)


@gluon.jit
def _unit(qw, qh, sp, x, out, part, cnt, bias, M, N, K, stride_w, stride_s, stride_xm, stride_om,
          steps_per_split, SPLIT, MT, pid_m, pid_n, pid_s, xs, ws_s, ss_s, hs_s, mma: gl.constexpr,
          HIGH: gl.constexpr, BN: gl.constexpr, BM: gl.constexpr, NW: gl.constexpr,
          IS_SPLIT: gl.constexpr, HAS_BIAS: gl.constexpr, STAGES: gl.constexpr):
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    w_l: gl.constexpr = _words_layout(BN, NW)
    x_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16], warps_per_cta=[NW, 1],
                                         order=[1, 0])
    r_l: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, w_l))
    t_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(2, w_l))
    c_l: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(1, w_l))
    # rows past N (batch rows past M) read the last valid one: no masks on the hot loads
    # (int32 offsets: the wrapper checks every plane and x has fewer than 2^31 elements)
    rows = gl.minimum(pid_n * BN + gl.arange(0, BN, layout=r_l), N - 1)
    tt = gl.arange(0, 4, layout=t_l)
    cc = gl.arange(0, 4, layout=c_l)
    r3 = gl.expand_dims(gl.expand_dims(rows, 1), 2)                    # [BN, 1, 1]
    t3 = gl.expand_dims(gl.expand_dims(tt, 0), 2)                      # [1, 4, 1]
    c3 = gl.expand_dims(gl.expand_dims(cc, 0), 1)                      # [1, 1, 4]
    woff = r3 * stride_w + t3 * 4 + c3                                 # [BN, 4, 4] words of step 0
    soff = r3 * stride_s + t3 * 0 + c3                                 # its chunks' scales
    xm = gl.arange(0, BM, layout=gl.SliceLayout(1, x_l))
    xk = gl.arange(0, BK, layout=gl.SliceLayout(0, x_l))
    xrow = gl.minimum(pid_m * BM + xm, M - 1)
    xoff = gl.expand_dims(xrow * stride_xm, 1) + gl.expand_dims(xk, 0)
    acc = gl.zeros([BN, BM], gl.float32, layout=mma)
    k_lo = pid_s * steps_per_split * BK
    k_hi = gl.minimum(k_lo + steps_per_split * BK, K)
    kl = k_hi - BK
    if STAGES > 0:
        acc = _ring(qw, qh, sp, x, woff, xoff, rows, stride_s, k_lo, k_hi, kl, xs, ws_s, ss_s, hs_s, acc, a_l,
                    w_l, HIGH, BN, STAGES)
    else:
        acc = _regs(qw, qh, sp, x, woff, soff, xoff, k_lo, k_hi, kl, xs, acc, a_l, HIGH, BN)
    o_l: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1], threads_per_warp=[32, 1], warps_per_cta=[NW, 1],
                                         order=[0, 1])
    acc = gl.convert_layout(acc, o_l)
    orow = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, o_l))
    ocol = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, o_l))
    om = gl.expand_dims(orow < N, 1) & gl.expand_dims(ocol < M, 0)
    ooff = gl.expand_dims(ocol.to(gl.int64) * stride_om, 0) + gl.expand_dims(orow, 1)
    if IS_SPLIT:
        poff = gl.expand_dims((pid_s * M + ocol).to(gl.int64) * N, 0) + gl.expand_dims(orow, 1)
        gl.store(part + poff, acc, mask=om)
        # the last split of a tile to finish sums all partials in split order (deterministic); a
        # CTA barrier, then one acq_rel ticket per program, orders the partial stores before it
        gl.thread_barrier()
        tile = pid_n * MT + pid_m
        ticket = gl.atomic_add(cnt + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:
            tot = gl.zeros([BN, BM], gl.float32, layout=o_l)
            for sp_ in range(SPLIT):
                o2 = gl.expand_dims((sp_ * M + ocol).to(gl.int64) * N, 0) + gl.expand_dims(orow, 1)
                tot += gl.load(part + o2, mask=om, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                tot += gl.expand_dims(gl.load(bias + orow, mask=orow < N, other=0.0).to(gl.float32), 1)
            gl.store(out + ooff, tot.to(out.dtype.element_ty), mask=om)
            gl.atomic_xchg(cnt + tile, 0)                                 # ready for the next launch (graph replays)
    else:
        if HAS_BIAS:
            acc += gl.expand_dims(gl.load(bias + orow, mask=orow < N, other=0.0).to(gl.float32), 1)
        gl.store(out + ooff, acc.to(out.dtype.element_ty), mask=om)


@gluon.jit
def _load_step(qw, qh, sp, woff, soff, k, HIGH: gl.constexpr):
    """Step k's words, scales and (Q6_K) high bits into registers (h is w when there are none)."""
    kw = gl.multiple_of(k // 8, 16)
    w = gl.load(qw + woff + kw)
    s = gl.load(sp + soff + gl.multiple_of(k // 32, 4))
    h = w
    if HIGH:
        h = gl.load(qh + woff + kw)
    return w, s, h


@gluon.jit
def _regs(qw, qh, sp, x, woff, soff, xoff, k_lo, k_hi, kl, xs, acc, a_l: gl.constexpr, HIGH: gl.constexpr,
          BN: gl.constexpr):
    """The K loop with the weights two steps ahead in registers and x one step ahead in shared
    memory (cp.async into the other of two buffers); the last steps re-read themselves."""
    w, s, h = _load_step(qw, qh, sp, woff, soff, k_lo, HIGH)
    w1, s1, h1 = _load_step(qw, qh, sp, woff, soff, gl.minimum(k_lo + BK, kl), HIGH)
    gl.thread_barrier()                                                # the previous unit's readers are done
    async_copy.async_copy_global_to_shared(xs.index(0), x + xoff + gl.multiple_of(k_lo, BK))
    async_copy.commit_group()
    buf = 0
    for k0 in range(k_lo, k_hi, BK):
        w2, s2, h2 = _load_step(qw, qh, sp, woff, soff, gl.minimum(k0 + 2 * BK, kl), HIGH)
        async_copy.async_copy_global_to_shared(xs.index(1 - buf), x + xoff + gl.multiple_of(gl.minimum(k0 + BK, kl), BK))
        async_copy.commit_group()
        a = _decode(w, h, s, HIGH, BN, a_l)
        async_copy.wait_group(1)                                       # this step's x has landed
        gl.thread_barrier()
        fence_async_shared()
        acc = warpgroup_mma(a, xs.index(buf).permute([1, 0]), acc)
        gl.thread_barrier()                                            # before the next copy overwrites it
        buf = 1 - buf
        w = w1
        s = s1
        h = h1
        w1 = w2
        s1 = s2
        h1 = h2
    async_copy.wait_group(0)
    return acc


@gluon.jit
def _issue(wdst, sdst, hdst, xdst, qw, qh, sp, x, woff, soff2, xoff, k, HIGH: gl.constexpr):
    """cp.async of step k's words, scales (and high bits), and x into one ring stage."""
    kw = gl.multiple_of(k // 8, 16)
    async_copy.async_copy_global_to_shared(wdst, qw + woff + kw)
    async_copy.async_copy_global_to_shared(sdst, sp + soff2 + gl.multiple_of(k // 32, 4))
    if HIGH:
        async_copy.async_copy_global_to_shared(hdst, qh + woff + kw)
    async_copy.async_copy_global_to_shared(xdst, x + xoff + gl.multiple_of(k, BK))


@gluon.jit
def _ring(qw, qh, sp, x, woff, xoff, rows, stride_s, k_lo, k_hi, kl, xs, ws_s, ss_s, hs_s, acc,
          a_l: gl.constexpr, w_l: gl.constexpr, HIGH: gl.constexpr, BN: gl.constexpr, STAGES: gl.constexpr):
    """The K loop over a STAGES-deep cp.async ring in shared memory (words, scales, high bits and
    x of a step per stage; no prefetch registers): step j + STAGES - 1 is issued, step j waited
    for, read and multiplied; the stage read at step j - 1 is the one overwritten."""
    s_l: gl.constexpr = gl.SliceLayout(1, w_l)                          # [BN, 4 chunks], lanes t broadcast
    sr = gl.convert_layout(rows, gl.SliceLayout(1, s_l))
    sc = gl.arange(0, 4, layout=gl.SliceLayout(0, s_l))
    soff2 = gl.expand_dims(sr * stride_s, 1) + gl.expand_dims(sc, 0)
    nsteps = (k_hi - k_lo) // BK
    gl.thread_barrier()                                                # the previous unit's readers are done
    for i in gl.static_range(STAGES - 1):
        _issue(ws_s.index(i), ss_s.index(i), hs_s.index(i if HIGH else 0), xs.index(i), qw, qh, sp, x, woff,
               soff2, xoff, gl.minimum(k_lo + i * BK, kl), HIGH)
        async_copy.commit_group()
    for j in range(nsteps):
        st = (j + STAGES - 1) % STAGES
        _issue(ws_s.index(st), ss_s.index(st), hs_s.index(st if HIGH else 0), xs.index(st), qw, qh, sp, x, woff,
               soff2, xoff, gl.minimum(k_lo + (j + STAGES - 1) * BK, kl), HIGH)
        async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)                              # step j has landed (this thread's copies)
        gl.thread_barrier()                                            # (everyone's)
        cur = j % STAGES
        w = ws_s.index(cur).load(w_l)
        s = gl.expand_dims(ss_s.index(cur).load(s_l), 1)
        h = w
        if HIGH:
            h = hs_s.index(cur).load(w_l)
        a = _decode(w, h, s, HIGH, BN, a_l)
        fence_async_shared()
        acc = warpgroup_mma(a, xs.index(cur).permute([1, 0]), acc)
        gl.thread_barrier()                                            # before step j + STAGES overwrites it
    async_copy.wait_group(0)
    return acc


_TARGET_PROGRAMS = 132 * 3
_SMS = 132                                # H200 SMs: the persistent grid is _SMS x occupancy programs


def split_for(m: int, n: int, k: int, bn: int, bm: int) -> int:
    """K splits so that tiles x splits reaches ~_TARGET_PROGRAMS (at most 16, two K steps each)."""
    tiles = triton.cdiv(n, bn) * triton.cdiv(m, bm)
    return 1 if tiles >= _TARGET_PROGRAMS else max(1, min(k // (2 * BK.value), triton.cdiv(_TARGET_PROGRAMS, tiles), 16))


def default_config(m: int, n: int, k: int) -> tuple:
    """(BN, BM, SPLIT, num_warps, programs per SM, register cap): 64 weight rows and all batch
    rows (up to 64) per program, K split until ~3 programs per H200 SM, 128 registers (4
    programs of 4 warps fit on an SM)."""
    bn, bm, nw = 64, min(64, max(16, triton.next_power_of_2(m))), 4
    return bn, bm, split_for(m, n, k, bn, bm), nw, 4, 128


# "<type> <N>x<K>" -> (BN, BM, SPLIT, num_warps, programs per SM, register cap) at 16 < M <= 32,
# from tools/w4_bench.py on the H200 (device calls 5-6 of 2026-12-01; the shapes of the 7B where
# this kernel beat cuBLAS over the dense bf16 plane: gate+up 1.27x, down in Q4_K 1.10x, the lm
# head 1.18x). M <= 16 takes BM = 16 and the default split.
H200_CONFIGS = {
    "Q4_K 37888x3584": (64, 32, 3, 4, 4, 128),
    "Q4_K 3584x18944": (64, 32, 6, 4, 4, 128),
    "Q6_K 152064x3584": (64, 32, 1, 4, 4, 128),
}
# with the cp.async ring (Switches.qgemm_w4_ring), "<type> <N>x<K> m<16|32>" where it measured
# faster in device call 10: gate+up at M=32 59.9 us (the table's config: 65.5 in call 6), the lm
# head at M=16 194 us (214.5); the other shapes keep the register loop above
H200_RING_CONFIGS = {
    "Q4_K 37888x3584 m32": (64, 32, 1, 4, 5, 0, 3),
    "Q6_K 152064x3584 m16": (64, 16, 1, 4, 5, 0, 3),
}
_NAMES = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
LARGE_N = 32768          # shapes not measured: rows enough to fill the GPU without a K split


def use_w4(qtype: int, n: int, k: int) -> bool:
    """Whether a (group) weight of this shape takes this kernel for batched rows: a measured
    shape, or a large-N one (the lm heads). The 7B's q/k/v (0.5x), o (0.55x) and Q6_K down
    (0.93x) stay on cuBLAS over the dense plane (device calls 5-6)."""
    return qtype in _NAMES and k % BK.value == 0 and (f"{_NAMES[qtype]} {n}x{k}" in H200_CONFIGS or n >= LARGE_N)


def config_for(qtype: int, m: int, n: int, k: int, ring: bool = False) -> tuple:
    if ring:
        hit = H200_RING_CONFIGS.get(f"{_NAMES.get(qtype)} {n}x{k} m{16 if m <= 16 else 32}")
        if hit is not None:
            return hit
    hit = H200_CONFIGS.get(f"{_NAMES.get(qtype)} {n}x{k}")
    if hit is not None and m > 16:
        return hit
    return default_config(m, n, k)


def qgemm_w4_mma(x: torch.Tensor, p: W4Planes, bias=None, out_dtype=None, config=None, ws=None,
                 ring: bool = False) -> torch.Tensor:
    """out (M, N) = x @ W^T [+ bias] over w4 planes (qgemm_w4.make_w4); x (M, K) bf16 with
    contiguous rows. config = (BN, BM, SPLIT, num_warps[, programs per SM, register cap])
    overrides the default (SPLIT 0: the default split); a split K takes its ticket counters from ws (.counters(n)) or a fresh buffer."""
    m, k = x.shape
    n = p.n
    if k != p.k or x.stride(1) != 1 or x.dtype != torch.bfloat16 or k % BK.value:
        raise MinferError(f"qgemm_w4_mma: x {tuple(x.shape)} {x.dtype}, expected bf16 (M, {p.k}) with contiguous "
                          f"rows and K % {BK.value} == 0")
    if bias is not None and tuple(bias.shape) != (n,):
        raise MinferError(f"qgemm_w4_mma: bias has shape {tuple(bias.shape)}, expected ({n},)")
    dflt = config_for(p.qtype, m, n, k, ring)
    cfg = tuple(config or dflt) + (4, 128, 0)[len(config or dflt) - 4:]
    bn, bm, split, nw, occ, maxreg, stages = cfg
    if split == 0:
        split = split_for(m, n, k, bn, bm)
    steps = k // BK.value
    sps = triton.cdiv(steps, max(1, split))
    split = triton.cdiv(steps, sps)                                     # no empty splits
    out = torch.empty((m, n), dtype=out_dtype or x.dtype, device=x.device)
    mt = triton.cdiv(m, bm)
    units = mt * triton.cdiv(n, bn) * split
    grid = (units if split > 1 else min(units, _SMS * occ),)
    part, cnt = out, out
    if split > 1:
        part = torch.empty((split, m, n), dtype=torch.float32, device=x.device)
        need = units // split
        cnt = ws.counters(need) if ws is not None else torch.zeros(need, dtype=torch.int32, device=x.device)
    if max(t.numel() for t in p.planes) >= 2**31 or x.numel() >= 2**31:
        raise MinferError(f"qgemm_w4_mma: a {n}x{k} weight or {m}x{k} input past 2^31 elements (int32 offsets)")
    high = p.qtype == Q6_K
    qw = p.planes[0]
    qh = p.planes[1] if high else qw
    sp = p.planes[2] if high else p.planes[1]
    _w4_mma_kernel[grid](qw, qh, sp, x, out, part, cnt, bias if bias is not None else out, m, n, k,
                         qw.stride(0), sp.stride(0), x.stride(0), out.stride(0), sps, split, mt, units,
                         HIGH=high, BN=bn, BM=bm, NW=nw, IS_SPLIT=split > 1, HAS_BIAS=bias is not None,
                         STAGES=stages, num_warps=nw, **({"maxnreg": maxreg} if maxreg else {}))
    return out
