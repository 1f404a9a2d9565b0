"""Held vs synchronous batch steps (MINFER_BATCH_ASYNC): per-call times of run_once at B=128
with the path counts of the slowest calls.  python tools/diag_async.py Q7.gguf"""
import sys
import time

import torch

from minfer.bench.parallel import run_once
from minfer.ops import paths
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.engine import Engine

eng = Engine.load(sys.argv[1], device="cuda", ctx=641, progress=False)
for a in (False, True, False, True):
    be = BatchEngine.from_engine(eng, max_seqs=128, kv_memory=8 << 30, prefix_cache=False, async_steps=a)
    rng = torch.Generator().manual_seed(0)
    orig = be.step
    log = []

    def timed_step():
        before = dict(paths.snapshot()["counts"])
        n_run, n_wait = len(be.scheduler.running), len(be.scheduler.waiting)
        t0 = time.perf_counter()
        r = orig()
        dt = time.perf_counter() - t0
        after = paths.snapshot()["counts"]
        d = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
        log.append((dt, n_run, n_wait, len(r), d))
        return r
    be.step = timed_step
    for B in (32, 128):
        run_once(be, B, 512, 4, rng)
        log.clear()
        r = run_once(be, B, 512, 48, rng)
        print(f"async={a} B={B}: S_TG {r['s_tg']:.0f} t/s T_TG {r['t_tg']:.3f}s T_PP {r['t_pp']:.3f}s "
              f"calls {len(log)} preemptions {be.scheduler.n_preemptions}", flush=True)
        tot = sum(x[0] for x in log)
        dec = sorted(x[0] for x in log if x[2] == 0)
        print(f"  sum of step() times {tot:.3f}s; decode calls: median {dec[len(dec) // 2] * 1e3:.2f} ms, "
              f"min {dec[0] * 1e3:.2f} ms, max {dec[-1] * 1e3:.2f} ms ({len(dec)})")
    del be
    torch.cuda.empty_cache()
