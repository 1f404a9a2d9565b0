import sys, time, torch
from torch.profiler import ProfilerActivity, profile
from minfer.bench.parallel import run_once
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.engine import Engine
from minfer.ops import paths
path = sys.argv[1]
eng = Engine.load(path, device="cuda", ctx=641, progress=False)
for a in (True, False):
    be = BatchEngine.from_engine(eng, max_seqs=128, kv_memory=8 << 30, prefix_cache=False, async_steps=a)
    rng = torch.Generator().manual_seed(0)
    for B in (32, 128):
        run_once(be, B, 512, 4, rng)
        paths.reset()
        r = run_once(be, B, 512, 48, rng)
        c = paths.snapshot()
        print(f"async={a} B={B}: S_TG {r['s_tg']:.0f} t/s T_TG {r['t_tg']:.3f}s steps {be.stats['steps']} graph {be.stats['graph_steps']}",
              {k: v for k, v in c['counts'].items() if 'batch' in k or 'graph' in k}, c['fallbacks'], flush=True)
    # host profile of decode steps at B=128
    V = be.config.vocab
    from minfer.runtime.sampling import SamplingParams
    seqs = [be.add(torch.randint(0, V, (512,), generator=rng).tolist(), SamplingParams(temperature=0), 40, ignore_eos=True) for _ in range(128)]
    while not all(s.n_generated >= 2 for s in seqs):
        be.step()
    torch.cuda.synchronize()
    if a:     # which host calls wait for the device in held steps (torch's sync debug mode)
        import traceback, warnings
        seen = {}
        def show(msg, cat, fn, ln, file=None, line=None):
            st = "".join(traceback.format_stack(limit=9)[:-2])
            seen[st] = seen.get(st, 0) + 1
        old = warnings.showwarning
        warnings.showwarning = show
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        for _ in range(4):
            be.step()
        torch.cuda.set_sync_debug_mode(0)
        warnings.showwarning = old
        for st, n in seen.items():
            print(f"--- sync x{n} at:\n{st}")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(8):
            be.step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / 8
    print(f"async={a} B=128 profiled: {dt * 1e3:.2f} ms/step")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))
    while be.has_work:
        for s in seqs:
            be.cancel(s.seq_id)
        be.step()
    del be
    torch.cuda.empty_cache()
