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
- it signals `launch_dependents` only after its own wait, so at most two grids of the chain
  are resident at once.
Kernels outside this module's callers (torch ops, prefill) launch normally; a normal launch
after a PDL one still waits for it to complete, as stream order says.
"""

from __future__ import annotations

import torch

from minfer.ops import paths

_capability: dict = {}


def enabled(sw, device, site: str) -> bool:
    """Whether the launch at `site` uses PDL: Switches.pdl on, a CUDA device of compute
    capability >= 9.0, and not Triton's interpreter. Counted per launch (`pdl.<site>`)."""
    from minfer.ops.cuda.dequant import interpret

    if not getattr(sw, "pdl", False):
        paths.switched_off(f"pdl.{site}", "MINFER_PDL")
        return False
    dev = torch.device(device)
    if dev.type != "cuda" or interpret():
        return False
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    cap = _capability.get(idx)
    if cap is None:
        cap = _capability[idx] = torch.cuda.get_device_capability(idx)
    if cap[0] < 9:
        paths.fallback(f"pdl.{site}", f"compute capability {cap[0]}.{cap[1]} < 9.0 has no programmatic launch")
        return False
    paths.count(f"pdl.{site}")
    return True


def launch_kw(on: bool) -> dict:
    """Extra launch keywords: launch_pdl only when on (the interpreter knows no such option)."""
    return {"launch_pdl": True} if on else {}
