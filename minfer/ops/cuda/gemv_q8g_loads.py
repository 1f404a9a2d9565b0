"""The Gluon q8 GEMV's loads and instructions (gemv_q8_gluon.py): the dp4a and Q6_K bit-spread PTX,
the PDL wait / signal, one step's weight loads (row-major or tile-major planes) and activation loads."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _dp4a(a, b, c):
    """c + sum over the 4 bytes of a (unsigned) times those of b (signed), per int32 lane."""
    return gl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c], dtype=gl.int32,
                                     is_pure=True, pack=1)


# Q6_K word w (nibble p: value 4p + w's low 4 bits) and its halfword h (crumb p: the high 2
# bits): lo = bytes of values p = 0, 2, 4, 6 as 6-bit numbers, hi = p = 1, 3, 5, 7. h's bytes
# are spread to [h0, h0, h1, h1] (prmt), so crumb 2b (2b + 1) of byte b's nibble pair lands at
# bits 4..5 of byte b after a shift by 4 / 0 (2 / -2), masked per byte pair.
_Q6_WORDS = gl.constexpr("""{
 .reg .b32 x2, t;
 prmt.b32 x2, $3, 0, 0x1100;
 and.b32 $0, $2, 0x0F0F0F0F;
 shl.b32 t, x2, 4;
 lop3.b32 $0, $0, t, 0x00300030, 0xF8;
 lop3.b32 $0, $0, x2, 0x30003000, 0xF8;
 shr.u32 t, $2, 4;
 and.b32 $1, t, 0x0F0F0F0F;
 shl.b32 t, x2, 2;
 lop3.b32 $1, $1, t, 0x00300030, 0xF8;
 shr.u32 t, x2, 2;
 lop3.b32 $1, $1, t, 0x30003000, 0xF8;
}""")


@gluon.jit
def _q6_words(w, h):
    return gl.inline_asm_elementwise(_Q6_WORDS, "=r,=r,r,r", [w, h], dtype=(gl.int32, gl.int32), is_pure=True, pack=1)


@gluon.jit
def _pdl(x):
    """griddepcontrol.wait, then launch_dependents (pdl.py's mode 1); x: any tensor, for the shape."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0 $1", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0 $1", "=r,r", [x], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _pdl_wait(x):
    """griddepcontrol.wait only (PDL mode 3: the dependents are signalled at the end, _pdl_signal)."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // $0 $1", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _pdl_signal(x):
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // $0 $1", "=r,r", [x], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _offsets(r3, r2, kc3, kc2, w3, NB, TM: gl.constexpr = 0):
    """(words [BN, C, 4], scales [BN, C], d words [BN, C]) offsets of chunks kc3 / kc2 of rows r3 / r2 in the
    planes, row-major or tile-major (_loads' doc); gemv_q8g_stages takes the parts it loads."""
    if TM:
        e3 = ((r3 // TM) * NB + kc3 // 8) * TM + r3 % TM
        e2 = ((r2 // TM) * NB + kc2 // 8) * TM + r2 % TM
        woff = e3 * 32 + (kc3 % 8) * 4 + w3
        soff = e2 * 8 + kc2 % 8
        doff = e2
    else:
        woff = r3 * (NB * 32) + kc3 * 4 + w3
        soff = r2 * (NB * 8) + kc2
        doff = r2 * NB + kc2 // 8
    return woff, soff, doff


@gluon.jit
def _loads(p0, p1, p2, p3, r3, r2, kc3, kc2, w3, NB, QT: gl.constexpr, TM: gl.constexpr = 0):
    """One step's words [BN, C, 4] (Q6_K: and high-bit halfwords), scales and d words [BN, C].
    TM: the planes are tile-major in TM-row tiles (gemv_repack_layout.to_tiles): block b of row r
    is entry ((r // TM) * NB + b) * TM + r % TM of each plane's per-block entries."""
    woff, soff, doff = _offsets(r3, r2, kc3, kc2, w3, NB, TM)
    wq = gl.load(p0 + woff, eviction_policy="evict_first")
    if QT == 12:
        hq = wq
        sa = gl.load(p1 + soff, eviction_policy="evict_first")          # sc | m << 8
        sb = gl.load(p2 + doff)                                          # d | dmin << 16
    else:
        hq = gl.load(p1 + woff, eviction_policy="evict_first")
        sa = gl.load(p2 + soff, eviction_policy="evict_first")          # the two int8 scales
        sb = gl.load(p3 + doff)                                          # d (f16)
    return wq, hq, sa, sb


@gluon.jit
def _xloads(xq, xf, blk, b_hi, xc, xw, ci):
    """The q8 row's words [1, C, 4] (values 0-3 and 4-7 of each byte quad) and chunk scales [1, C]
    (d, the half sums) of step blk; chunks past b_hi (an odd tail, a step past the split) count zero."""
    kx = blk * 8 + xc
    xm = kx < b_hi * 8
    xlo = gl.expand_dims(gl.load(xq + kx * 8 + xw, mask=xm, other=0), 0)
    xhi = gl.expand_dims(gl.load(xq + kx * 8 + 4 + xw, mask=xm, other=0), 0)
    kc = blk * 8 + ci
    km = kc < b_hi * 8
    xd = gl.expand_dims(gl.load(xf + kc * 4, mask=km, other=0.0), 0)
    xs0 = gl.expand_dims(gl.load(xf + kc * 4 + 1, mask=km, other=0.0), 0)
    xs1 = gl.expand_dims(gl.load(xf + kc * 4 + 2, mask=km, other=0.0), 0)
    return xlo, xhi, xd, xs0, xs1


@gluon.jit
def _l2_heads(hp, HPF: gl.constexpr, NW: gl.constexpr):
    """The first blocks of every row tile of the next GEMV's planes into L2 (l2_prefetch.L2Plan.heads;
    Switches.l2_heads): hp = (tiles, then for each plane its address, tile bytes and head bytes), HPF planes;
    thread i of program p issues `cp.async.bulk.prefetch.L2.global` (sm_90's bulk prefetch: an
    address and size in 16-byte units, no completion to wait for) for tiles p + nprog * (i + j *
    threads). Nothing is written: the weights are never written, so this may run before the wait."""
    _l2_plane(hp[0], hp[1], hp[2], hp[3], NW)
    if HPF > 1:
        _l2_plane(hp[0], hp[4], hp[5], hp[6], NW)
    if HPF > 2:
        _l2_plane(hp[0], hp[7], hp[8], hp[9], NW)
    if HPF > 3:
        _l2_plane(hp[0], hp[10], hp[11], hp[12], NW)


@gluon.jit
def _l2_plane(tiles, base, run, head, NW: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    i = gl.arange(0, 32 * NW, layout=L)
    pid = gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)
    nprog = gl.num_programs(0) * gl.num_programs(1)
    for j in range(0, tiles, nprog * 32 * NW):
        t = (j + pid + i * nprog).to(gl.int64)
        go = (t < tiles).to(gl.int32)
        a = base + t * run
        n = (head + t * 0).to(gl.int32)
        gl.inline_asm_elementwise(
            "{ .reg .pred p; setp.ne.s32 p, $1, 0; @p cp.async.bulk.prefetch.L2.global [$2], $3; mov.u32 $0, 0; }",
            "=r,r,l,r", [go, a, n], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _split_gather(part, pid_n, N, SPLIT, NSTRIDE, SP2: gl.constexpr, BN: gl.constexpr, NW: gl.constexpr,
                  LR: gl.constexpr):
    """The sum over the SPLIT partial rows of row tile pid_n (part[s * NSTRIDE + row]) in split order, in layout LR
    (Switches.split_gather): one [SP2, BN] load whose layout gives each thread every split of one row (SP2: SPLIT
    rounded up to a power of two, the rest masked to 0.0), so its loads are independent of the additions and go
    out together -- the loop over the runtime count took 4 dependent L2 rounds for 8 splits (perf-log BA2). The
    in-thread reduction adds the elements left to right: ((p0 + p1) + p2) ..., the loop's 0 + p0 + p1 ... (the
    same value but for an all -0.0 row's sign), plus the masked +0.0s."""
    LP: gl.constexpr = gl.BlockedLayout([SP2, 1], [1, 32], [1, NW], [0, 1])
    sp = gl.expand_dims(gl.arange(0, SP2, layout=gl.SliceLayout(1, LP)), 1)             # [SP2, 1]
    rows = gl.expand_dims(pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(0, LP)), 0)  # [1, BN]
    v = gl.load(part + sp * NSTRIDE + rows, mask=(sp < SPLIT) & (rows < N), other=0.0, cache_modifier=".cg")
    return gl.convert_layout(gl.sum(v, axis=0), LR)


def split_const(split: int, gather: int, regs: int):
    """The kernel's IS_SPLIT constexpr: False without a K split; with one, the split count's power of two when
    _split_gather sums the partials (gather 1; gather 2 only in a build without a register cap, where the gather's
    registers cannot spill: the 7B's Q4_K down spills 32 bytes at its 72-register cap, perf-log BA3), else True (the loop).
    `gather` is Switches.split_gather, whose values (0, 1, 2) the Switches checks when it is made."""
    if split <= 1:
        return False
    return 1 << (split - 1).bit_length() if gather == 1 or (gather == 2 and not regs) else True


@gluon.jit
def _mixed_tile(pid_n, TA, SF: gl.constexpr):
    """(whether program pid_n is on the first weight, its tile there, its tile in the second) of a
    two-weight launch (TA first-weight tiles); SF: the second weight's tiles take the lowest ids."""
    if SF:
        tb = gl.num_programs(0) - TA            # the second weight's tiles, first
        first = pid_n >= tb
        ia = pid_n - tb
        ib = pid_n
    else:
        first = pid_n < TA
        ia = pid_n
        ib = pid_n - TA
    return first, ia, ib


def _pf(prefetch) -> bool | int:
    """The kernel's PF constexpr: 2 (both steps before the wait), 3+ (that many shared-memory stages,
    gemv_q8g_stages) or the on / off of before."""
    return int(prefetch) if int(prefetch) >= 2 else bool(prefetch)


def _prefetch2_error(n: int, nb: int, what: str):
    from minfer.errors import MinferError

    raise MinferError(f"gemv_q8 Gluon config for {n}x{nb * 256}: prefetch 2 (every step loaded before the PDL "
                      f"wait) needs splits of at most two steps; this launch has {what}")


def _opts(pdl, regs: int) -> dict:
    """The launch options beside num_warps: PDL's launch attribute, the register cap."""
    return ({"launch_pdl": True} if pdl else {}) | ({"maxnreg": int(regs)} if regs else {})
