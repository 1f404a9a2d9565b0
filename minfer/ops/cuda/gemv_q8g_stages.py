"""The Gluon q8 GEMV's weight words through a ring of shared-memory stages (a config's prefetch field >= 3;
gemv_q8_gluon._tile's PF): each step's words [BN, C, 4] (Q6_K: and its high-bit halfwords) are copied into
the ring by sm_80+'s asynchronous copy (cp.async, 16 / 8 bytes a thread; no registers held while in flight),
PF - 1 steps ahead of the step being multiplied, where the register prefetch (PF 1) holds one step ahead in
registers. Why (perf-log CG1): under Nsight Compute the decode GEMVs' DRAM throughput follows the loads in
flight an SM, and the downs (3-5 steps a split) hold one step ahead only; a second register step costs ~24
registers a thread, past the Q4_K down's one-wave cap of 72.

Every thread copies exactly the elements it later loads (the copy's pointers and the ring's loads share
the layout L3), so a thread waits for its own copy groups only (cp.async.wait_group) and the ring needs no
barrier between the threads. A slot is refilled one step after it was read, by the same thread, whose
dot products of that step consumed the loaded values first. Steps past the split are masked (no bytes
move; the slot is zero-filled and never read)."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from minfer.ops.cuda.gemv_q8g_loads import _offsets


@gluon.jit
def _ring(BN: gl.constexpr, C: gl.constexpr, PF: gl.constexpr, QT: gl.constexpr):
    """PF stages of one step's words (int32) and, for Q6_K, halfwords (int16)."""
    S4: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[2, 1, 0])    # (the stage index outermost)
    ws = gl.allocate_shared_memory(gl.int32, [PF, BN, C, 4], S4)
    if QT == 12:
        hs = ws
    else:
        hs = gl.allocate_shared_memory(gl.int16, [PF, BN, C, 4], S4)
    return ws, hs


@gluon.jit
def _issue(ws, hs, p0, p1, r3, c3, w3, blk, b_hi, slot, NB, QT: gl.constexpr, TM: gl.constexpr):
    """Step blk's words into stage `slot`, as one copy group (committed even when every chunk is past
    b_hi, so each step is one group and wait_group counts steps)."""
    kc3 = blk * 8 + c3
    m = kc3 < b_hi * 8
    woff, _, _ = _offsets(r3, r3, gl.minimum(kc3, NB * 8 - 1), kc3, w3, NB, TM)     # (the words' offsets only)
    async_copy.async_copy_global_to_shared(ws.index(slot), p0 + woff, mask=m, eviction_policy="evict_first")
    if QT != 12:
        async_copy.async_copy_global_to_shared(hs.index(slot), p1 + woff, mask=m, eviction_policy="evict_first")
    async_copy.commit_group()


@gluon.jit
def _take(ws, hs, slot, PF: gl.constexpr, L3: gl.constexpr, QT: gl.constexpr):
    """The words (and Q6_K halfwords) of the step in stage `slot`, once its group has landed: at most PF - 1
    groups (the steps after it) still in flight."""
    async_copy.wait_group(PF - 1)
    wq = ws.index(slot).load(L3)
    if QT == 12:
        hq = wq
    else:
        hq = hs.index(slot).load(L3)
    return wq, hq


@gluon.jit
def _scale_loads(p1, p2, p3, r2, kc2, NB, QT: gl.constexpr, TM: gl.constexpr):
    """One step's scales and d words [BN, C] (gemv_q8g_loads._loads without the words)."""
    _, soff, doff = _offsets(r2, r2, kc2, kc2, 0, NB, TM)                      # (the scales' offsets only)
    if QT == 12:
        sa = gl.load(p1 + soff, eviction_policy="evict_first")          # sc | m << 8
        sb = gl.load(p2 + doff)                                          # d | dmin << 16
    else:
        sa = gl.load(p2 + soff, eviction_policy="evict_first")          # the two int8 scales
        sb = gl.load(p3 + doff)                                          # d (f16)
    return sa, sb
