"""The Gluon q8 GEMV's loads and instructions (gemv_q8_gluon.py): the dp4a and Q6_K bit-spread PTX,
the PDL wait / signal, one step's weight loads (row-major or tile-major planes) and activation loads."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy as ac


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
def _woff(r3, kc3, w3, NB, TM: gl.constexpr = 0):
    """The word offsets [BN, C, 4] of rows r3, chunks kc3. TM: the planes are tile-major in TM-row
    tiles (gemv_repack_layout.to_tiles): block b of row r is entry ((r // TM) * NB + b) * TM + r % TM
    of each plane's per-block entries."""
    if TM:
        return (((r3 // TM) * NB + kc3 // 8) * TM + r3 % TM) * 32 + (kc3 % 8) * 4 + w3
    return r3 * (NB * 32) + kc3 * 4 + w3


@gluon.jit
def _sdoff(r2, kc2, NB, TM: gl.constexpr = 0):
    """The scale and d-word offsets [BN, C] of rows r2, chunks kc2 (layouts as _woff's)."""
    if TM:
        e2 = ((r2 // TM) * NB + kc2 // 8) * TM + r2 % TM
        return e2 * 8 + kc2 % 8, e2
    return r2 * (NB * 8) + kc2, r2 * NB + kc2 // 8


@gluon.jit
def _loads(p0, p1, p2, p3, r3, r2, kc3, kc2, w3, NB, QT: gl.constexpr, TM: gl.constexpr = 0):
    """One step's words [BN, C, 4] (Q6_K: and high-bit halfwords), scales and d words [BN, C]
    into registers (offsets: _woff, _sdoff)."""
    woff = _woff(r3, kc3, w3, NB, TM)
    soff, doff = _sdoff(r2, kc2, NB, TM)
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
def _stage_all(p0, p1, p2, p3, r3, r2, c3, c2, w3, NB, b_lo, b_hi, QT: gl.constexpr, TM: gl.constexpr,
               BN: gl.constexpr, C: gl.constexpr, NST: gl.constexpr):
    """Prefetch 3: every step of the split (NST at most) into shared memory, issued before the PDL
    wait. The words (and a Q6_K's high bits), 86-88% of the bytes, go by cp.async (16 / 8 bytes a
    thread and chunk): in flight without registers, so a program holds few and more programs
    (of this launch and the next) share an SM. The scales and d words (2-byte entries, below
    cp.async's 4-byte minimum) are loaded after all the copies are issued and stored; their
    stores wait for the loads, while the kernel before still runs. Steps past the split re-read
    its last chunk (clamped, as _tile's loads): their x chunks are masked to zero. Returns the
    buffers; _staged reads a step back after wait_group(0) and a barrier."""
    SW3: gl.constexpr = gl.SwizzledSharedLayout(vec=4, per_phase=1, max_phase=1, order=[2, 1, 0])
    SW2: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    BC: gl.constexpr = C // 8
    wbuf = gl.allocate_shared_memory(gl.int32, [NST, BN, C, 4], SW3)
    if QT == 12:
        hbuf = wbuf
        ps = p1
        pd = p2
    else:
        hbuf = gl.allocate_shared_memory(p1.dtype.element_ty, [NST, BN, C, 4], SW3)
        ps = p2
        pd = p3
    sbuf = gl.allocate_shared_memory(ps.dtype.element_ty, [NST, BN, C], SW2)
    dbuf = gl.allocate_shared_memory(pd.dtype.element_ty, [NST, BN, C], SW2)
    for i in gl.static_range(NST):
        woff = _woff(r3, gl.minimum((b_lo + i * BC) * 8 + c3, b_hi * 8 - 1), w3, NB, TM)
        ac.async_copy_global_to_shared(wbuf.index(i), p0 + woff, eviction_policy="evict_first")
        if QT == 14:
            ac.async_copy_global_to_shared(hbuf.index(i), p1 + woff, eviction_policy="evict_first")
    ac.commit_group()
    for i in gl.static_range(NST):
        soff, doff = _sdoff(r2, gl.minimum((b_lo + i * BC) * 8 + c2, b_hi * 8 - 1), NB, TM)
        sbuf.index(i).store(gl.load(ps + soff, eviction_policy="evict_first"))
        dbuf.index(i).store(gl.load(pd + doff))
    return wbuf, hbuf, sbuf, dbuf


@gluon.jit
def _staged(bufs, st, L3: gl.constexpr, QT: gl.constexpr):
    """Step st of _stage_all's buffers in _loads' registers and layouts (after wait_group(0) and a
    barrier)."""
    wbuf, hbuf, sbuf, dbuf = bufs
    wq = wbuf.index(st).load(L3)
    if QT == 12:
        hq = wq
    else:
        hq = hbuf.index(st).load(L3)
    L2: gl.constexpr = gl.SliceLayout(2, L3)
    return wq, hq, sbuf.index(st).load(L2), dbuf.index(st).load(L2)


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
