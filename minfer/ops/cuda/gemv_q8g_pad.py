"""An occupancy cap for the Gluon q8 GEMV (a config's twelfth field, `per_sm`): shared memory a
program reserves only so that at most that many of its programs fit an SM.

Why (perf-log AI3): with norm_into_gemv = 4 nothing runs between o and gate+up, so gate+up's 1,184
programs launch (PDL) while o's one 237-register program holds each of 112 SMs; with registers
allowing 10 an SM they pile onto the 20 free SMs and the layer waits for the unevenly placed ones
(X1). Capped at 9, the grid is one even wave (1,188 slots) wherever its programs land first.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

@gluon.jit
def _occupancy_pad(P0: gl.constexpr, P1: gl.constexpr, P2: gl.constexpr, NW: gl.constexpr):
    """Shared memory whose only use is to cap the programs an SM (a config's twelfth field,
    `per_sm`; _pads): P0..P2 bytes (powers of two of at least 1 KB; P1, P2 0: a 128-byte token
    instead, within _pads' margin) allocated, 32 words stored into each; _pad_kept reads them back at the program's end,
    so the three live together (apart, the allocator would overlay them)."""
    LP: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
    A1: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    z = gl.zeros([32], gl.int32, layout=LP)
    a = gl.allocate_shared_memory(gl.int32, [P0 // 4], A1)
    b = gl.allocate_shared_memory(gl.int32, [P1 // 4 if P1 else 32], A1)
    c = gl.allocate_shared_memory(gl.int32, [P2 // 4 if P2 else 32], A1)
    a.slice(0, 32).store(z)
    b.slice(0, 32).store(z)
    c.slice(0, 32).store(z)
    return a, b, c


@gluon.jit
def _pad_kept(pads, out, pid_n, NW: gl.constexpr):
    """The pads' words read back and stored under a mask no program meets (pid_n >= 0 always): the
    allocations stay live to the end; a few shared loads, no global store."""
    LP: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
    a, b, c = pads
    t = a.slice(0, 32).load(LP) + b.slice(0, 32).load(LP) + c.slice(0, 32).load(LP)
    i = gl.arange(0, 32, layout=LP)
    gl.store(out + i, t.to(out.dtype.element_ty), mask=(i < 0) | (pid_n < 0))


# sm_90 (H100 / H200): shared memory an SM, and reserved by the driver for each resident program
# (CUDA's sharedMemPerMultiprocessor and reservedSharedMemPerBlock)
SM_SHARED, BLOCK_RESERVED = 233472, 1024


def per_sm(cfg) -> int:
    """A config's twelfth field: at most this many of its programs an SM (0: no cap): 1,184 programs
    9 an SM on 132 SMs stay one even wave when launched beside a kernel still holding SMs (AI3)."""
    return int(cfg[11]) if len(cfg) > 11 else 0


def _pads(cap: int, what: str) -> tuple:
    """(PAD0, PAD1, PAD2): up to three powers of two (>= 1 KB) of shared memory a program so that
    `cap` programs fit an SM and cap + 1 do not (the kernel's own few hundred bytes left room for)."""
    if not cap:
        return 0, 0, 0
    hi = SM_SHARED // cap - BLOCK_RESERVED - 512
    lo = SM_SHARED // (cap + 1) - BLOCK_RESERVED
    pads, p = [], 1 << 17
    while p >= 1024 and len(pads) < 3:
        if sum(pads) + p <= hi:
            pads.append(p)
        p //= 2
    if not lo < sum(pads) <= hi:
        from minfer.errors import MinferError

        raise MinferError(f"gemv_q8 Gluon config for {what}: no shared-memory pad of three powers of two caps it "
                          f"at {cap} programs an SM")
    return tuple(pads + [0] * (3 - len(pads)))
