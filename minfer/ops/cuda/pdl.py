"""Programmatic dependent launch (PDL) for the one-row decode chain (issue 12).

A decode step is ~250 small kernels in a row; between two of them the GPU drains the first
grid, then starts the second (about 1-2 us each on the H200, ~0.3 ms per token: the gap
between eager kernel time and graph replay in docs/perf-log.md). With PDL (compute capability
9.0+, CUDA's launch attribute "programmatic stream serialization", kept by CUDA-graph capture)
the next kernel is launched while the current one runs and waits inside, at
`griddepcontrol.wait`, for it to finish and flush its memory.

The contract every kernel launched with `launch_pdl=True` here keeps (PDL constexpr):
- before its gdc_wait it reads only memory no earlier kernel of the step writes (weights,
  rope tables) and writes nothing, so running early cannot race with the previous kernel;
- every program executes gdc_wait before it exits, so "previous kernel complete" is
  transitive down the chain (kernel N+2 waits for N+1, which could not finish before N);
- it signals `launch_dependents` after its own wait (mode 1), so at most two grids of the
  chain are resident at once, and the next GEMV's first weight tile (gemv_q8._q8_tile) is in
  flight while this kernel runs. Mode 2 (Switches.pdl_early, off) lets the small kernels
  signal before their wait, one kernel earlier; with two tiles before the wait
  (Switches.pdl_prefetch=2, default 1) both measured slower on the H200 (docs/perf-log.md):
  early grids likely take SM slots and issue slots from the running GEMV (not profiled).
  Switches.pdl_early_sites turns mode 2 on for the named sites only (e.g. rope_kv: the decode
  attention then launches during the q/k/v GEMV and, with decode_attn_kvpre, reads its cached
  keys meanwhile; attn_norm: the add + RMSNorm before q/k/v only, not the one before gate+up;
  combine, the default: the o GEMV launches and loads its first tiles during the attention, perf-log AC1).
  The Gluon GEMV has a mode 3 (Switches.pdl_late, off): it waits first and signals only when
  each program ends, so the next kernel cannot launch while its later programs still need
  SM slots; measured without effect (docs/perf-log.md U4).
Kernels outside this module's callers (torch ops, prefill) launch normally; a normal launch
after a PDL one still waits for it to complete, as stream order says.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from minfer.ops import paths

_capability: dict = {}


@triton.jit
def enter(PDL: tl.constexpr):
    """A PDL kernel's first step: mode 1 waits, then lets the next kernel launch; mode 2 lets it
    launch first (it still cannot pass its own wait before this kernel completes)."""
    if PDL == 2:
        gdc_launch_dependents()
        gdc_wait()
    elif PDL == 1:
        gdc_wait()
        gdc_launch_dependents()


def enabled(sw, device, site: str, early_ok: bool = False, role: str = "") -> int:
    """The PDL mode of the launch at `site`: 0 off, 1 on, 2 on and signalling the next kernel
    before the wait (early_ok sites, Switches.pdl_early for all of them, pdl_early_sites for those
    named, by site or by role: a narrower name for some of a site's calls, e.g. attn_norm for the
    add_rms_norm calls that make the attention's input). On: Switches.pdl, a CUDA device of
    compute capability >= 9.0, not Triton's interpreter. Counted per launch (`pdl.<site>`)."""
    from minfer.ops.cuda.dequant import interpret

    if not getattr(sw, "pdl", False):
        paths.switched_off(f"pdl.{site}", "MINFER_PDL")
        return 0
    dev = torch.device(device)
    if dev.type != "cuda" or interpret():
        return 0
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = _capability.get(idx)
    if cap is None:
        cap = _capability[idx] = torch.cuda.get_device_capability(idx)
    if cap[0] < 9:
        paths.fallback(f"pdl.{site}", f"compute capability {cap[0]}.{cap[1]} < 9.0 has no programmatic launch")
        return 0
    paths.count(f"pdl.{site}")
    if early_ok and (getattr(sw, "pdl_early", False) or site in _named(sw)):
        return 2
    return early(sw, 1, role) if early_ok and role else 1


def _named(sw) -> list:
    return getattr(sw, "pdl_early_sites", "").split(",")


def early(sw, mode: int, role: str) -> int:
    """Mode 1 turned to 2 where Switches.pdl_early_sites names `role` (a narrower name than a
    launch site: attn_norm, some add_rms_norm calls; combine, the decode attention's merge
    launch, which takes the attention's mode otherwise); any other mode as it is."""
    return 2 if mode == 1 and role in _named(sw) else mode


def launch_kw(on: int) -> dict:
    """Extra launch keywords: launch_pdl only when on (the interpreter knows no such option)."""
    return {"launch_pdl": True} if on else {}
