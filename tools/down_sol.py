"""How fast can the 7B's down projection's planes be read at all? A speed-of-light check for the
Q4_K down GEMV (3584 x 18944, 38.19 MB of planes), issue 12's slowest shape per byte.

The Gluon q8 GEMV reads the down at 2.7-3.1 TB/s while gate+up (twice the bytes, same kernel)
reads 3.8: is that the access pattern (32 rows x 256 bytes a step, rows 9,472 bytes apart), the
size (38 MB in one wave: the ramp and the tail weigh more), or the kernel's own work (the dp4a,
the split's partials and ticket)? Three load-only Gluon kernels answer it, each with the GEMV's
loads and nothing else (the words, the scales and the d words of a step, the next step in flight
while this one is summed, as gemv_q8_gluon._tile with prefetch 1), in the same harness as the
real GEMV:
  rows   the repacked planes as they are (row-major: a row's K blocks contiguous), the GEMV's
         tiling (BN rows x BB blocks a step, a K split per program);
  tiles  the same bytes and tiling with each program's run of steps contiguous (planes ordered
         [tile][block][row][...]): one 38 MB stream cut into programs;
  empty  the same grid with no blocks: launch and drain only.
Every load-only program sums what it read, and the sums over the grid are checked against torch
(each word read exactly once). Then the real GEMV (gemv_q8, gluon=True) on real repacked planes,
configs from the command line. Rotating copies (>= 192 MB) so nothing is found in L2; each row is
the median time a call over a CUDA graph of calls (gemv_sweep.graph_time), in one process.

    python tools/down_sol.py [--calls 48] [--cfg 32,2,9,4 ...]     (on the GPU)

--shape N,K reads planes of another Q4_K shape (the real GEMV rows then need --cfg / --cfg6 for it, or
none); --sol-pdl 0 1 also times the load-only kernels PDL-chained as the GEMV is (the first step's loads
before griddepcontrol.wait, then launch_dependents; launched with the PDL attribute): the fastest any
kernel with these loads can read the shape in a chain of launches, the ceiling for its row of issue
12's kernel table (tools/gemv_table.py).
"""
from __future__ import annotations

import argparse
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as ac

from minfer.ops.cuda.gemv_q8g_loads import _pdl

N, K = 3584, 18944
NB = K // 256


@gluon.jit
def _sol_start(NB, BPS, BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr, TM: gl.constexpr):
    """The first step's offsets of this program (tile pid_n, split pid_s) in the words, scales and d
    planes, its chunk indices (kc3 [BN, C, 1], kc2 [1, C]) and its last block b_hi, in
    gemv_q8_gluon._loads' layout; TM: the planes tile-major."""
    C: gl.constexpr = BB * 8
    TC: gl.constexpr = 16 if C >= 16 else C
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[32 // TC, TC, 1],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    LX: gl.constexpr = gl.SliceLayout(0, L3)
    pid_n = gl.program_id(0)
    b_lo = gl.program_id(1) * BPS
    b_hi = gl.minimum(b_lo + BPS, NB)
    rl2 = gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, L2)), 1)
    rl3 = gl.expand_dims(rl2, 2)
    c2 = gl.expand_dims(gl.arange(0, C, layout=gl.SliceLayout(0, L2)), 0)
    c3 = gl.expand_dims(c2, 2)
    w3 = gl.expand_dims(gl.expand_dims(gl.arange(0, 4, layout=gl.SliceLayout(0, LX)), 0), 0)
    kc3 = b_lo * 8 + c3
    kc2 = b_lo * 8 + c2
    if TM:
        wo = ((pid_n * NB + kc3 // 8) * BN + rl3) * 32 + (kc3 % 8) * 4 + w3
        so = ((pid_n * NB + kc2 // 8) * BN + rl2) * 8 + kc2 % 8
        do = (pid_n * NB + kc2 // 8) * BN + rl2
    else:
        wo = (pid_n * BN + rl3) * (NB * 32) + kc3 * 4 + w3
        so = (pid_n * BN + rl2) * (NB * 8) + kc2
        do = (pid_n * BN + rl2) * NB + kc2 // 8
    return wo, so, do, kc3, kc2, b_lo, b_hi


@gluon.jit
def _sol_kernel(w, s, d, out, NB, BPS, BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr, TM: gl.constexpr,
                PDL: gl.constexpr = 0):
    """Program (tile pid_n, split pid_s): blocks [pid_s * BPS, + BPS) of rows pid_n * BN ..; per step
    the words [BN, C, 4] (int32), the scales [BN, C] (int16) and the d words [BN, C] (int32, one a
    block, read by its 8 chunks) -- gemv_q8_gluon._loads' shapes and layout; TM: the planes in
    tile-major order. out[program] = the sum of all it read (int64). PDL: griddepcontrol.wait and
    launch_dependents after the first step's loads are issued (gemv_q8_gluon._tile's order)."""
    C: gl.constexpr = BB * 8
    TC: gl.constexpr = 16 if C >= 16 else C
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[32 // TC, TC, 1],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    wo, so, do, kc3, kc2, b_lo, b_hi = _sol_start(NB, BPS, BN, BB, NW, TM)
    acc = gl.zeros([BN, C, 4], gl.int32, layout=L3)
    acs = gl.zeros([BN, C], gl.int32, layout=L2)
    m3 = kc3 < b_hi * 8
    m2 = kc2 < b_hi * 8
    nw = gl.load(w + wo, mask=m3, other=0, eviction_policy="evict_first")
    ns = gl.load(s + so, mask=m2, other=0, eviction_policy="evict_first")
    nd = gl.load(d + do, mask=m2 & (kc2 % 8 == 0), other=0)
    if PDL:
        _pdl(gl.arange(0, C, layout=gl.SliceLayout(0, L2)))
    # one step: BB blocks; in tile-major order a block of BN rows is BN * 32 words
    WSTEP: gl.constexpr = BB * BN * 32 if TM else BB * 32
    SSTEP: gl.constexpr = BB * BN * 8 if TM else BB * 8
    DSTEP: gl.constexpr = BB * BN if TM else BB
    for blk in range(b_lo, b_hi, BB):
        cw = nw
        cs = ns
        cd = nd
        wo += WSTEP
        so += SSTEP
        do += DSTEP
        kc3 += BB * 8
        kc2 += BB * 8
        m3 = kc3 < b_hi * 8
        m2 = kc2 < b_hi * 8
        nw = gl.load(w + wo, mask=m3, other=0, eviction_policy="evict_first")
        ns = gl.load(s + so, mask=m2, other=0, eviction_policy="evict_first")
        nd = gl.load(d + do, mask=m2 & (kc2 % 8 == 0), other=0)
        acc += cw
        acs += cs.to(gl.int32) + cd
    tot = gl.sum(gl.sum(gl.sum(acc.to(gl.int64), axis=2), axis=1), axis=0) + \
        gl.sum(gl.sum(acs.to(gl.int64), axis=1), axis=0)
    gl.store(out + gl.program_id(0) + gl.program_id(1) * gl.num_programs(0), tot)


@gluon.jit
def _sol_async_kernel(w, s, d, out, NB, BPS, BN: gl.constexpr, BB: gl.constexpr, NW: gl.constexpr,
                      TM: gl.constexpr, ST: gl.constexpr):
    """_sol_kernel with the words (86% of the bytes) fetched by cp.async into a ring of ST
    shared-memory steps (no registers held while in flight: ST - 1 steps ahead), the scales and d
    words through registers one step ahead as before. Each thread reads back the words it copied
    (the same layout both ways), so the ring needs no barrier, only wait_group."""
    C: gl.constexpr = BB * 8
    TC: gl.constexpr = 16 if C >= 16 else C
    L3: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 1, 4], threads_per_warp=[32 // TC, TC, 1],
                                        warps_per_cta=[NW, 1, 1], order=[2, 1, 0])
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    SW: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=1, order=[2, 1, 0])
    ring = gl.allocate_shared_memory(gl.int32, [ST, BN, C, 4], SW)
    wo, so, do, kc3, kc2, b_lo, b_hi = _sol_start(NB, BPS, BN, BB, NW, TM)
    acc = gl.zeros([BN, C, 4], gl.int32, layout=L3)
    acs = gl.zeros([BN, C], gl.int32, layout=L2)
    WSTEP: gl.constexpr = BB * BN * 32 if TM else BB * 32
    SSTEP: gl.constexpr = BB * BN * 8 if TM else BB * 8
    DSTEP: gl.constexpr = BB * BN if TM else BB
    for i in gl.static_range(ST - 1):                       # steps 0 .. ST - 2 in flight
        ac.async_copy_global_to_shared(ring.index(i), w + wo + i * WSTEP, mask=kc3 + i * BB * 8 < b_hi * 8)
        ac.commit_group()
    m2 = kc2 < b_hi * 8
    ns = gl.load(s + so, mask=m2, other=0, eviction_policy="evict_first")
    nd = gl.load(d + do, mask=m2 & (kc2 % 8 == 0), other=0)
    for blk in range(b_lo, b_hi, BB):
        it = (blk - b_lo) // BB
        # step it + ST - 1 enters the ring, into the slot step it - 1 left
        ac.async_copy_global_to_shared(ring.index((it + ST - 1) % ST), w + wo + (ST - 1) * WSTEP,
                                       mask=kc3 + (ST - 1) * BB * 8 < b_hi * 8)
        ac.commit_group()
        cs = ns
        cd = nd
        so += SSTEP
        do += DSTEP
        kc2 += BB * 8
        m2 = kc2 < b_hi * 8
        ns = gl.load(s + so, mask=m2, other=0, eviction_policy="evict_first")
        nd = gl.load(d + do, mask=m2 & (kc2 % 8 == 0), other=0)
        ac.wait_group(ST - 1)                                # this step's group has landed
        cw = ring.index(it % ST).load(L3)
        wo += WSTEP
        kc3 += BB * 8
        acc += cw                                            # (masked chunks were zero-filled)
        acs += cs.to(gl.int32) + cd
    ac.wait_group(0)
    tot = gl.sum(gl.sum(gl.sum(acc.to(gl.int64), axis=2), axis=1), axis=0) + \
        gl.sum(gl.sum(acs.to(gl.int64), axis=1), axis=0)
    gl.store(out + gl.program_id(0) + gl.program_id(1) * gl.num_programs(0), tot)


def _grid(bn: int, bb: int, split: int) -> tuple:
    from minfer.ops.cuda.gemv_repack import splits
    bps, sp = splits(NB, split, bb)
    return bps, (N // bn, sp)


def sol_calls(planes: list, cfg: tuple, tm: bool, empty: bool = False, stages: int = 0, pdl: int = 0) -> tuple:
    """(calls over the rotating copies, the check): cfg (BN, BB, SPLIT, warps); stages: the words
    through a cp.async ring of that many steps (_sol_async_kernel), 0: through registers; pdl: the
    register kernel PDL-chained (_sol_kernel's PDL, the launch attribute)."""
    bn, bb, split, nw = cfg
    bps, grid = _grid(bn, bb, split)
    out = torch.empty(grid[0] * grid[1], dtype=torch.int64, device="cuda")
    calls = []
    nb = NB if not empty else 0
    for (w, s, d) in planes:
        if stages:
            calls.append(lambda w=w, s=s, d=d: _sol_async_kernel[grid](w, s, d, out, nb, bps, bn, bb, nw, tm, stages,
                                                                        num_warps=nw))
        else:
            calls.append(lambda w=w, s=s, d=d: _sol_kernel[grid](w, s, d, out, nb, bps, bn, bb, nw, tm, PDL=pdl,
                                                                  num_warps=nw, **({"launch_pdl": True} if pdl else {})))

    def check():
        w, s, d = planes[0]
        calls[0]()
        torch.cuda.synchronize()
        got = int(out.sum().item()) % (1 << 32)
        want = (int(w.to(torch.int64).sum().item()) + int(s.to(torch.int64).sum().item())
                + int(d.to(torch.int64).sum().item())) % (1 << 32)
        return 0 if empty else got - want
    return calls, check


def real(qt: int, specs: list, a, timed, copies: int, gen) -> int:
    """The real GEMV (gemv_q8, Gluon) on random repacked planes of the down shape in type qt, each
    config on the row-major planes and on the same planes tile-major (to_tiles with its BN rows):
    the outputs must be the same bits. 1 on a wrong result."""
    from minfer.bench.gemv_sweep import random_raw
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack_layout import REPACKED_BLOCK_BYTES, to_tiles

    rws = [G.repack(random_raw(qt, N, K, gen), qt, N, K) for _ in range(copies)]
    nbytes = N * NB * REPACKED_BLOCK_BYTES[qt]
    name = G.REPACKED_TYPES[qt]
    ws = G.GemvWorkspace("cuda")
    q8 = Q.quantize(torch.randn(1, K, device="cuda", dtype=torch.bfloat16, generator=gen))
    tms = {}
    for spec in specs:
        cfg = tuple(int(v) for v in spec.split(","))
        bn = cfg[0]
        if bn not in tms:
            tms = {bn: [to_tiles(r, bn) for r in rws]}
        # the same GEMV on the planes in tile-major order: the same output bits
        y0 = Q.gemv_q8(q8, rws[0], config=cfg, ws=ws, gluon=True, out_dtype=torch.float32)
        y1 = Q.gemv_q8(q8, tms[bn][0], config=cfg, ws=ws, gluon=True, out_dtype=torch.float32)
        if not torch.equal(y0, y1):
            print(f"  {name} tile-major {cfg}: WRONG RESULT ({int((y0 != y1).sum())} of {y0.numel()} values differ)")
            return 1
        for pdl in a.pdl:
            timed(f"{name} gemv_q8 gluon {list(cfg)} pdl {pdl}",
                  [lambda i=i, p=pdl: Q.gemv_q8(q8, rws[i], config=cfg, ws=ws, gluon=True, pdl=p)
                   for i in range(copies)], nbytes)
            timed(f"{name} gemv_q8 gluon {list(cfg)} pdl {pdl} tile-major",
                  [lambda i=i, p=pdl, t=tms[bn]: Q.gemv_q8(q8, t[i], config=cfg, ws=ws, gluon=True, pdl=p)
                   for i in range(copies)], nbytes)
    return 0


def main(argv=None) -> int:
    global N, K, NB
    from minfer.bench.gemv_sweep import graph_time
    from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=48)
    ap.add_argument("--sol", nargs="*", default=["32,2,9,4", "32,1,12,4", "16,2,9,2", "64,2,9,8"],
                    help="load-only tilings BN,BB,SPLIT,warps")
    ap.add_argument("--stages", type=int, nargs="*", default=[],
                    help="also the load-only kernels with the words through a cp.async ring of this many steps")
    ap.add_argument("--cfg", nargs="*", default=["32,2,9,4", "32,1,12,4", "16,2,9,2", "32,2,5,4", "64,2,9,8"],
                    help="real GEMV configs (gemv_q8_gluon fields)")
    ap.add_argument("--cfg6", nargs="*", default=["16,2,4,4", "32,2,5,4"], help="the same for the Q6_K down")
    ap.add_argument("--pdl", type=int, nargs="*", default=[0, 1], help="PDL modes of the real GEMV's launches")
    ap.add_argument("--shape", default="3584,18944", help="N,K of the Q4_K planes (default: the 7B's down)")
    ap.add_argument("--sol-pdl", type=int, nargs="*", default=[0], help="PDL modes of the load-only kernels (0, 1)")
    a = ap.parse_args(argv)
    N, K = (int(v) for v in a.shape.split(","))
    NB = K // 256
    gen = torch.Generator(device="cuda").manual_seed(0)
    nbytes = N * NB * (128 + 16 + 4)
    copies = max(2, -(-192_000_000 // nbytes))
    planes = []
    for _ in range(copies):
        w = torch.randint(-2**31, 2**31 - 1, (N * NB * 32,), dtype=torch.int32, device="cuda", generator=gen)
        s = torch.randint(-2**15, 2**15 - 1, (N * NB * 8,), dtype=torch.int16, device="cuda", generator=gen)
        d = torch.randint(-2**31, 2**31 - 1, (N * NB,), dtype=torch.int32, device="cuda", generator=gen)
        planes.append((w, s, d))
    mb = nbytes / 1e6
    print(f"{N}x{K} Q4_K planes: {mb:.2f} MB (words {N * NB * 128 / 1e6:.2f}, scales {N * NB * 16 / 1e6:.2f}, "
          f"d {N * NB * 4 / 1e6:.2f}); {copies} rotating copies; {torch.cuda.get_device_name()}")
    rows = []

    def timed(label, calls, nb_=nbytes):
        t = graph_time([calls[i % len(calls)] for i in range(max(a.calls, len(calls)))])
        rows.append((label, t * 1e6, nb_ / t / 1e9))
        print(f"  {label:40s} {t * 1e6:7.2f} us {nb_ / t / 1e9:7.0f} GB/s", flush=True)

    for spec in a.sol:
        cfg = tuple(int(v) for v in spec.split(","))
        for tm in (False, True):
            for st, pdl in [(0, p) for p in a.sol_pdl] + [(st, 0) for st in a.stages]:
                calls, check = sol_calls(planes, cfg, tm, stages=st, pdl=pdl)
                what = (f"load-only {'tiles' if tm else 'rows '} {list(cfg)}" + (f" cp.async ring {st}" if st else "")
                        + (" PDL-chained" if pdl else ""))
                bad = check()
                if bad:
                    print(f"  {what}: WRONG SUM ({bad})")
                    return 1
                timed(f"{what} grid {_grid(*cfg[:3])[1]}", calls)
        for pdl in a.sol_pdl:
            calls, _ = sol_calls(planes, cfg, False, empty=True, pdl=pdl)
            timed(f"empty grid {_grid(*cfg[:3])[1]}" + (" PDL-chained" if pdl else ""), calls)
    del planes
    for qt, specs in ((Q4_K, a.cfg), (Q6_K, a.cfg6)):
        if specs and real(qt, specs, a, timed, copies, gen):
            return 1
    print("\n| what | us | GB/s |\n|---|---:|---:|")
    for label, us, gbps in rows:
        print(f"| {label} | {us:.2f} | {gbps:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
