"""Block flags between the SwiGLU GEMV and the down projection (Switches.flag_down; issue 12's stretch).

Why: the down's programs start their dot products only after the whole gate+up grid has ended and its memory is
flushed (the PDL wait): ~1.8 us after gate+up's last program on the H200 (the 7B's timeline, perf-log AM), a launch
boundary on the critical path of every layer. The down's split s needs only the 256-value blocks [b_lo, b_hi) of h,
and each of those is made by 256 / BN of gate+up's tile pairs. So the pair that makes a chunk of h counts it into
its block's flag, and a down program waits for its own blocks' flags instead of the whole grid.

The protocol (the same bits as the PDL wait's: only when the down's programs may start changes):
- Flags: an int32 buffer of the workspace, zero between launches, one counter a 128-byte line (STRIDE ints apart,
  so the arrivals and polls of different blocks meet in different L2 lines): lines [0, 128) count the 256-value
  blocks of h, lines [128, 256) are the down splits' reader tickets.
- Arrive (_flag_arrive, the pair's second program in gemv_q8g_norm._glu_pair, after h's q8 stores): a CTA barrier,
  then one release atomic adding the pair's chunks (BN / 32) to its block's counter. The barrier orders every
  thread's stores before the one thread's release (perf-log CD1: without it the PTX left 127 threads' stores
  unordered before thread 0's release).
- Wait (_flag_wait, the down's program in place of griddepcontrol.wait): acquire loads (ld.acquire.gpu, not
  read-modify-write atomics, which serialize on a line) of its blocks' counters, one lane a block, with a 128 ns
  sleep between rounds, until every one holds 8; the q8 row is then loaded past L1 (.cg). Then the PDL
  signal, as the plain launch gives it after its wait. The down's other inputs (the residual, written by o) were
  complete before gate+up's programs passed their own wait, and the down launches only after every gate+up program
  has signalled, after that wait.
- Reset (_flag_done): each down program takes a ticket on its split's reader counter after the wait; the one
  taking the last (every row tile of the split has passed) zeroes the split's block counters and the ticket, at its
  end. The next gate+up to arrive is the next layer's, which runs after this down's grid has ended.
- No deadlock: the down is launched only when every gate+up program has signalled (PDL mode 1 signals after the
  wait), so every producer is resident or done before any consumer spins; without PDL the flags are full first.

Host side: the SwiGLU launch marks the flags pending in the workspace; the down's flag launch consumes them. A
pending mark the down did not consume (a down on another path) is zeroed by a plain memset before the next
SwiGLU launch that uses them (counted as a `gemv_q8.flag_down` fallback), so a stale count never lets a program
through early."""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

BLOCKS = 128          # h's 256-value blocks a buffer counts (F <= 32,768)
TICKETS = 128         # down splits
STRIDE = 32           # ints between two counters: one 128-byte L2 line each
CNT_OFF = 8192        # the flag down's tile tickets start here in the workspace's counters (the pairs' below)


@gluon.jit
def _flag_arrive(fl, j, BN: gl.constexpr):
    """The pair j's BN values of h (and their q8 form) are stored: count its chunks into its block."""
    gl.thread_barrier()
    gl.atomic_add(fl + ((j * BN) // 256) * 32, BN // 32, sem="release", scope="gpu")


@gluon.jit
def _flag_wait(fl, b_lo, b_hi, pid_s, NW: gl.constexpr):
    """Spin until blocks [b_lo, b_hi) of h each hold their 8 chunks; returns the split's reader ticket."""
    LF: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
    i = gl.arange(0, 32 * NW, layout=LF)
    m = i < b_hi - b_lo
    ptr = fl + (b_lo + gl.where(m, i, 0)) * 32                       # (lanes past the split re-read block b_lo)
    lo = gl.min(gl.where(m, _ld_acquire(ptr), 8), axis=0)
    while lo < 8:
        _nanosleep(i)
        lo = gl.min(gl.where(m, _ld_acquire(ptr), 8), axis=0)
    return gl.atomic_add(fl + (128 + pid_s) * 32, 1, sem="relaxed", scope="gpu")


@gluon.jit
def _ld_acquire(p):
    return gl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [p], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def _nanosleep(x):
    gl.inline_asm_elementwise("nanosleep.u32 128; // $0 $1", "=r,r", [x], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _flag_done(fl, tk, b_lo, b_hi, pid_s, NW: gl.constexpr):
    """The split's last reader (every row tile past its wait) zeroes the split's counters and its ticket."""
    if tk == gl.num_programs(0) - 1:
        LF: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32], warps_per_cta=[NW], order=[0])
        i = gl.arange(0, 32 * NW, layout=LF)
        gl.atomic_xchg(fl + (b_lo + i) * 32, gl.zeros([32 * NW], gl.int32, layout=LF), mask=i < b_hi - b_lo,
                       sem="relaxed", scope="gpu")
        gl.atomic_xchg(fl + (128 + pid_s) * 32, 0, sem="relaxed", scope="gpu")


def flags_of(ws) -> torch.Tensor:
    """The workspace's flag buffer (made zeroed on first use, on the counters' device)."""
    fl = getattr(ws, "flags", None)
    if fl is None:
        fl = ws.flags = torch.zeros((BLOCKS + TICKETS) * STRIDE, dtype=torch.int32, device=ws.cnt.device)
        ws.flags_pending = False
    return fl


def arrive_flags(ws, f: int, bn: int, paired: bool):
    """The flag buffer for a SwiGLU launch of F = f values in bn-row pairs, or None (with why) where the protocol
    does not apply; a pending mark no down consumed is zeroed first (a memset, counted as a fallback)."""
    from minfer.ops import paths

    why = None
    if ws is None:
        why = "no workspace to hold the flags"
    elif paired:
        why = "the paired SwiGLU (Switches.gemv_swiglu 2) has no ticketed epilogue to arrive from"
    elif f % 256 or f // 256 > BLOCKS or bn > 256 or 256 % bn or f // bn > CNT_OFF:
        why = f"h of {f} values in {bn}-row pairs does not fill whole 256-value blocks of at most {BLOCKS}"
    if why:
        paths.fallback("gemv_q8.flag_down", why)
        return None
    fl = flags_of(ws)
    if ws.flags_pending:
        paths.fallback("gemv_q8.flag_down", "the last SwiGLU's flags were not consumed by a flag down: zeroed")
        fl.zero_()
    ws.flags_pending = True
    return fl


def counts(fl: torch.Tensor) -> torch.Tensor:
    """The counters of a flag buffer (one a line), blocks then tickets."""
    return fl.view(-1, STRIDE)[:, 0]


def settle(ws, q8):
    """After a down that did not wait on q8's flags (the layer's last GEMV on another path: the model's last layer,
    whose norm is the output norm): zero them now, in stream order after it (a memset; counted), so a CUDA graph's
    next replay finds them zero."""
    from minfer.ops import paths

    if getattr(q8, "flags", None) is not None and getattr(ws, "flags_pending", False):
        paths.fallback("gemv_q8.flag_down", "the down did not wait on the flags (another path): zeroed after it")
        q8.flags.zero_()
        ws.flags_pending = False


def wait_flags(ws, q8, split: int, cfg_ok: str | None):
    """The flag buffer for the down launch reading q8 (the SwiGLU's output), or None: q8 carries no flags, or the
    launch cannot wait on them (cfg_ok: why; counted as a fallback, the pending mark left for the memset)."""
    from minfer.ops import paths

    fl = getattr(q8, "flags", None)
    if fl is None:
        return None
    why = cfg_ok or (f"{split} splits exceed the {TICKETS} reader tickets" if split > TICKETS else None)
    if why:
        paths.fallback("gemv_q8.flag_down", why)
        return None
    ws.flags_pending = False
    paths.count("gemv_q8.flag_down")
    return fl


class FlagQ8(tuple):
    """(hq, hf) of the SwiGLU GEMV with its flag buffer and the buffers its programs may still use while the down
    runs (the stacked rows' parked sums, its own q8 input): held until the down is launched, so the caching
    allocator gives none of them to the down (which may run beside the gate+up programs) or to anything before."""
    flags: torch.Tensor
    keep: tuple
