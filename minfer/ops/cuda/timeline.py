"""Per-program timestamps of the Gluon decode GEMV (a measuring aid for issue 12, off unless a
tool sets RECORDER): each program stores its start and end on the GPU's global timer (ns) and
the SM it ran on, so a tool can see how a launch's programs fill the SMs, in how many waves, and
how they overlap the launch before and after it (tools/gemv_timeline.py). The engine never sets
RECORDER: with it None the kernel is built without the stamps (TL=False), the same code as
before."""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

RECORDER = None     # a Recorder while a tool records; None: no stamps


@gluon.jit
def stamp(tlb, SLOT: gl.constexpr, NW: gl.constexpr):
    """tlb[4 * program + SLOT] = %globaltimer (ns): SLOT 0 the program's start, 1 its end, 3 past its PDL
    wait; with SLOT 0 also tlb[4 * program + 2] = %smid."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
    i = gl.arange(0, 32 * NW, layout=L)
    t = gl.inline_asm_elementwise("mov.u64 $0, %globaltimer; // $1", "=l,r", [i], dtype=gl.int64, is_pure=False,
                                  pack=1)
    base = tlb + (gl.program_id(0) + gl.program_id(1) * gl.num_programs(0)) * 4
    gl.store(base + SLOT + i * 0, t, mask=i == 0)
    if SLOT == 0:
        sm = gl.inline_asm_elementwise("mov.u32 $0, %smid; // $1", "=r,r", [i], dtype=gl.int32, is_pure=False,
                                       pack=1)
        gl.store(base + 2 + i * 0, sm.to(gl.int64), mask=i == 0)


class Recorder:
    """One int64 buffer (4 words a program: start, end, SM, past the PDL wait) per recorded launch, in launch
    order; torch.empty only (no fill kernel, so a graph captured while recording has the same
    kernels as without)."""

    def __init__(self):
        self.launches = []          # (key, grid, buffer)

    def buffer(self, key: str, grid: tuple, device) -> torch.Tensor:
        buf = torch.empty(grid[0] * grid[1] * 4, dtype=torch.int64, device=device)
        self.launches.append((key, tuple(grid), buf))
        return buf
