"""Where a bench token's wall time goes on the host side (issue 12): the bench loop of `minfer bench`
(Engine.forward per token, logits read on the host, the same token fed again), unprofiled, with
wall-clock marks around the graph replay and CUDA events around the graph on the GPU:
    python tools/host_gap.py Q7.gguf [depth ...]      (default depths: 16 3354)
Per token (medians over 64 steps): wall; host time before the replay call (Python, the input
copy); the replay call itself (cudaGraphLaunch); the host's wait for the logits (to_host); the
graph's GPU time (events recorded just before and after the replay); and wall - GPU time, the
part of a token the GPU does not spend in the graph (the logits copy, launch latency, host)."""
import statistics
import sys
import time

import torch

from minfer.runtime.cuda_graphs import DecodeGraph
from minfer.runtime.engine import Engine
from prof_decode import warm  # noqa: E402 -- tools/ is the script's directory

marks: list = []
_step = DecodeGraph._step    # (Engine.forward calls _step: it is inside inference mode already)
_to_host = DecodeGraph.to_host


def step(self, *a, **k):
    """DecodeGraph._step with the replay of the graph the previous step used timed. The patch goes
    on that graph object and comes off the same object: a step that switches graphs (the short
    graph below position 128, the whole-cache one above) is not timed. (Until 2026-12-02 the
    patch came off `self.graph` after the step -- the new graph after a switch -- which left the
    whole-cache graph replaying the short one from then on: its one-split attention over all the
    keys, 3.2 ms a step at d3354; perf-log Y3.)"""
    g = self.graph
    if g is None:
        return _step(self, *a, **k)
    t0 = time.perf_counter()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    replay = g.replay

    def timed():
        e0.record()
        t1 = time.perf_counter()
        replay()
        t2 = time.perf_counter()
        e1.record()
        marks.append({"t0": t0, "t1": t1, "t2": t2, "e0": e0, "e1": e1})

    g.replay = timed
    try:
        return _step(self, *a, **k)
    finally:
        g.replay = replay


def to_host(self, logits, **kw):
    out = _to_host(self, logits, **kw)
    if marks:
        marks[-1]["t3"] = time.perf_counter()
    return out


def run(eng, depth, steps=64):
    t, pos = warm(eng, depth)
    marks.clear()
    starts = []
    for _ in range(steps):
        starts.append(time.perf_counter())
        eng.forward([t], pos)
        pos += 1
    torch.cuda.synchronize()
    starts.append(time.perf_counter())
    wall = [b - a for a, b in zip(starts, starts[1:])]
    ms = marks[-steps:]
    pre = [m["t1"] - s for m, s in zip(ms, starts)]
    call = [m["t2"] - m["t1"] for m in ms]
    wait = [m.get("t3", m["t2"]) - m["t2"] for m in ms]
    gpu = [m["e0"].elapsed_time(m["e1"]) / 1e3 for m in ms]
    med = statistics.median
    w = med(wall)
    print(f"depth {depth}: wall {w * 1e6:.0f} us/token ({1 / w:.1f} tok/s); host before replay {med(pre) * 1e6:.1f} us, "
          f"replay call {med(call) * 1e6:.1f} us, wait for the logits {med(wait) * 1e6:.0f} us, graph on the GPU "
          f"{med(gpu) * 1e6:.0f} us; wall - graph {(w - med(gpu)) * 1e6:.0f} us "
          f"(min {min(a - b for a, b in zip(wall, gpu)) * 1e6:.0f}, max {max(a - b for a, b in zip(wall, gpu)) * 1e6:.0f})",
          flush=True)


if __name__ == "__main__":
    DecodeGraph._step = step
    DecodeGraph.to_host = to_host
    depths = [int(d) for d in sys.argv[2:]] or [16, 3354]
    eng = Engine.load(sys.argv[1], device="cuda", ctx=4096, progress=False)
    for d in depths:
        run(eng, d)
