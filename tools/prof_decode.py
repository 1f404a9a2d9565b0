"""Where a graphed decode step's GPU time goes (issue 12): torch.profiler's kernel events of a
few replays on the synthetic 7B, per kernel name (count, total, mean) and the idle time between
kernels, with PDL on and off.  python tools/prof_decode.py Q7.gguf"""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from minfer.runtime.engine import Engine
from minfer.switches import Switches


def short(name: str) -> str:
    for key in ("_gemv_q8_kernel", "_q8_kernel", "_rope_kv_kernel", "_decode_attn_kernel", "_combine_kernel",
                "_gemv_kernel", "_rms_norm_kernel", "argmax", "copy", "index", "fill", "elementwise"):
        if key in name:
            return key
    return name[:40]


def run(path, pdl, steps=4):
    eng = Engine.load(path, device="cuda", ctx=512, progress=False, switches=Switches(pdl=pdl))
    prompt = list(range(100, 116))
    t = int(eng.prefill(prompt).argmax())
    pos = len(prompt)
    for _ in range(8):
        t = int(eng.forward([t], pos)[-1].argmax()); pos += 1
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            t = int(eng.forward([t], pos)[-1].argmax()); pos += 1
        torch.cuda.synchronize()
    ev = sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)
    # split into steps at idle gaps > 20 us (the host's argmax read between steps)
    stepsev, cur = [], [ev[0]]
    for a, b in zip(ev, ev[1:]):
        if b.time_range.start - a.time_range.end > 20:
            stepsev.append(cur); cur = []
        cur.append(b)
    stepsev.append(cur)
    s = max(stepsev[1:-1] or stepsev, key=len)
    tot = defaultdict(float); cnt = defaultdict(int)
    for e in s:
        tot[short(e.name)] += e.time_range.elapsed_us(); cnt[short(e.name)] += 1
    span = s[-1].time_range.end - s[0].time_range.start
    busy = sum(e.time_range.elapsed_us() for e in s)
    gaps = sum(max(0, b.time_range.start - a.time_range.end) for a, b in zip(s, s[1:]))
    print(f"PDL={pdl}: {len(s)} kernels in one step, span {span:.0f} us, kernel time {busy:.0f} us, "
          f"idle between kernels {gaps:.0f} us")
    for k in sorted(tot, key=lambda k: -tot[k]):
        print(f"  {k:40s} {cnt[k]:4d} {tot[k]:8.1f} us  {tot[k] / cnt[k]:6.2f} us each")
    del eng
    torch.cuda.empty_cache()


if __name__ == "__main__":
    for pdl in (False, True):
        run(sys.argv[1], pdl)
