"""Where a graphed decode step's time goes (issue 12): torch.profiler's kernel events of a few
steps on the synthetic 7B, fed as `minfer bench` feeds them (Engine.forward per token, logits
read on the host, the same token fed again: no host argmax), per kernel name (count, total, mean), the idle time between kernels inside a
step, and the GPU's idle time BETWEEN steps (the host's part of a token: logits read, Python,
inputs, graph launch); at a short context and after a long one.
    python tools/prof_decode.py Q7.gguf [depth ...]      (default depths: 16 3354)"""
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from minfer.runtime.engine import Engine


def short(name: str) -> str:
    for key in ("_gemv_q8_kernel", "_q8_kernel", "_rope_kv_kernel", "_decode_attn_kernel", "_combine_kernel",
                "_gemv_kernel", "_rms_norm_kernel", "argmax", "Memcpy HtoD", "Memcpy DtoH", "copy", "index",
                "fill", "elementwise"):
        if key in name:
            return key
    return name[:40]


def warm(eng, depth):
    """A context of `depth` tokens prefilled and 8 decode steps run (graph captured): (token, position)
    of the next step, fed as `minfer bench` feeds them (the same token again)."""
    eng.reset()
    prompt = [100 + (i * 7919) % 50000 for i in range(depth)]
    t = int(eng.prefill(prompt).argmax())
    pos = len(prompt)
    for _ in range(8):
        eng.forward([t], pos); pos += 1
    return t, pos


def run(eng, depth, steps=6):
    t, pos = warm(eng, depth)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(32):
        eng.forward([t], pos); pos += 1
    wall = (time.perf_counter() - t0) / 32 * 1e6
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.forward([t], pos); pos += 1
        torch.cuda.synchronize()
    ev = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
    # steps end with the logits' DtoH copy
    stepsev, cur = [], []
    for e in ev:
        cur.append(e)
        if "Memcpy DtoH" in e.name:
            stepsev.append(cur); cur = []
    between = [b[0].time_range.start - a[-1].time_range.end for a, b in zip(stepsev, stepsev[1:])]
    s = stepsev[len(stepsev) // 2]
    tot = defaultdict(float); cnt = defaultdict(int)
    for e in s:
        tot[short(e.name)] += e.time_range.elapsed_us(); cnt[short(e.name)] += 1
    span = s[-1].time_range.end - s[0].time_range.start
    gaps = sum(max(0, b.time_range.start - a.time_range.end) for a, b in zip(s, s[1:]))
    print(f"depth {depth}: wall {wall:.0f} us per token ({1e6 / wall:.1f} tok/s) unprofiled; one step: {len(s)} "
          f"kernels/copies, span {span:.0f} us (first kernel to logits on the host), idle inside {gaps:.0f} us; "
          f"GPU idle between steps {', '.join(f'{g:.0f}' for g in between)} us")
    for k in sorted(tot, key=lambda k: -tot[k]):
        print(f"  {k:40s} {cnt[k]:4d} {tot[k]:8.1f} us  {tot[k] / cnt[k]:6.2f} us each")
    print("  (with PDL a kernel's duration includes its wait for the previous one: the sum exceeds the span)")
    print_chain(s)


def print_chain(s, layer_len: int = 10):
    """The chain's view of one step's events s (sorted by start): each kernel waits for the
    previous one to finish (PDL's wait), so end[i] - end[i-1] is what kernel i adds to the step,
    its launch and loads before the wait excluded. Per kernel kind, then one layer's run."""
    cnt = defaultdict(int)
    for e in s:
        cnt[short(e.name)] += 1
    marg = defaultdict(float)
    rows = []
    for a, b in zip(s, s[1:]):
        d = b.time_range.end - a.time_range.end
        marg[short(b.name)] += d
        rows.append((short(b.name), d, b.time_range.elapsed_us()))
    print(f"  chain: end-to-end increments per kernel kind (sum {sum(marg.values()):.0f} us = the span less the first)")
    for k in sorted(marg, key=lambda k: -marg[k]):
        print(f"  {k:40s} {cnt[k]:4d} {marg[k]:8.1f} us  {marg[k] / cnt[k]:6.2f} us each")
    mid = len(rows) // 2
    mid -= mid % layer_len
    print("  one layer's run of kernels (name, increment of the step's end, own duration), us:")
    for name, d, own in rows[mid:mid + layer_len + 2]:
        print(f"    {name:40s} {d:7.2f} {own:7.2f}")


if __name__ == "__main__":
    depths = [int(d) for d in sys.argv[2:]] or [16, 3354]
    eng = Engine.load(sys.argv[1], device="cuda", ctx=4096, progress=False)
    for d in depths:
        run(eng, d)
