"""Where a batched decode step's time goes (issue 13), on the synthetic 7B:

1. wall time per BatchEngine.step() of a decode-only batch of B sequences (graph replay);
2. the GPU time of the bucket's graph alone (replayed back to back, CUDA events);
3. the host sections of a step, each timed with the GPU drained first (schedule, graph input
   load, replay+sync, sampling, log-probabilities, events, block commits);
4. the graph's kernels by kind (torch.profiler): dense GEMMs, attention, the rest;
5. per linear shape at M=B: cuBLAS on the bf16 planes against torch._scaled_mm on FP8 e4m3
   (row-wise scales), the bound a plane of half the bytes would give.

    python tools/prof_batch.py Q7.gguf [B ...]        (default B: 32 128)
"""
import sys
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from minfer.runtime import batch_engine as bem
from minfer.runtime.batch_engine import BatchEngine
from minfer.runtime.batch_graphs import _Bucket
from minfer.runtime.engine import Engine
from minfer.runtime.sampling import SamplingParams

T = defaultdict(float)
N = defaultdict(int)


def timed(name, fn, sync=True):
    def w(*a, **k):
        if sync:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        r = fn(*a, **k)
        if sync:
            torch.cuda.synchronize()
        T[name] += time.perf_counter() - t0
        N[name] += 1
        return r
    return w


def kind(name: str) -> str:
    n = name.lower()
    if "gemm" in n or "xmma" in n or "cutlass" in n or "sm90" in n or "ampere" in n:
        return "dense GEMM (cuBLAS)"
    if "attn" in n or "attention" in n:
        return "attention"
    if "gemv" in n or "_q8_" in n:
        return "GEMV"
    return "other: " + name[:48]


def main(path, batches):
    eng = Engine.load(path, device="cuda", ctx=1024, progress=False)
    be = BatchEngine.from_engine(eng, max_seqs=max(batches), kv_memory=int(12 * 2**30), prefix_cache=False)
    print(f"dense planes {be.dense_plane_bytes / 2**30:.2f} GiB", flush=True)
    g = torch.Generator().manual_seed(0)
    V = be.config.vocab
    for B in batches:
        seqs = [be.add(torch.randint(0, V, (512,), generator=g).tolist(), SamplingParams(temperature=0), 200,
                       ignore_eos=True) for _ in range(B)]
        while not all(s.n_generated >= 1 for s in seqs):
            be.step()
        for _ in range(4):
            be.step()
        torch.cuda.synchronize()
        n = 24
        t0 = time.perf_counter()
        for _ in range(n):
            be.step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / n * 1e3
        b = be.graphs._by_size[be.graphs._bucket_for(B)]
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(n):
            b.graph.replay()
        e1.record()
        torch.cuda.synchronize()
        gpu = e0.elapsed_time(e1) / n
        print(f"\nB={B}: wall {wall:.2f} ms/step ({B / wall * 1e3:.0f} t/s), graph alone {gpu:.2f} ms "
              f"({B / gpu * 1e3:.0f} t/s), host+sync {wall - gpu:.2f} ms", flush=True)
        # host sections, the GPU drained before each
        T.clear(); N.clear()
        saved = (be.scheduler.schedule, _Bucket.load, torch.cuda.CUDAGraph.replay, bem.sample_rows,
                 bem.token_logprobs, be._event, be.blocks.commit)
        be.scheduler.schedule = timed("schedule", saved[0])
        _Bucket.load = timed("graph input load (H2D)", saved[1])
        torch.cuda.CUDAGraph.replay = timed("replay + sync (GPU)", saved[2])
        bem.sample_rows = timed("sample_rows", saved[3])
        bem.token_logprobs = timed("token_logprobs (+ .tolist)", saved[4])
        be._event = timed("events (detokenize, stops)", saved[5], sync=False)
        be.blocks.commit = timed("block commits", saved[6], sync=False)
        t0 = time.perf_counter()
        for _ in range(n):
            be.step()
        torch.cuda.synchronize()
        tot = (time.perf_counter() - t0) / n * 1e3
        (be.scheduler.schedule, _Bucket.load, torch.cuda.CUDAGraph.replay, bem.sample_rows,
         bem.token_logprobs, be._event, be.blocks.commit) = saved
        del be.scheduler.schedule, be._event, be.blocks.commit    # back to the class attributes
        print(f"  sections (GPU drained before each; step {tot:.2f} ms):")
        for k in sorted(T, key=lambda k: -T[k]):
            print(f"    {k:32s} {T[k] / n * 1e3:7.3f} ms/step")
        print(f"    {'unaccounted':32s} {tot - sum(T.values()) / n * 1e3:7.3f} ms/step")
        # kernels of one replay
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                b.graph.replay()
            torch.cuda.synchronize()
        tot_k = defaultdict(float); cnt = defaultdict(int)
        evs = [e for e in prof.events() if e.device_type.name == "CUDA"]
        for e in evs:
            tot_k[kind(e.name)] += e.time_range.elapsed_us() / 3
            cnt[kind(e.name)] += 1
        print(f"  kernels per replay {len(evs) // 3}, kernel time {sum(tot_k.values()) / 1e3:.2f} ms:")
        for k in sorted(tot_k, key=lambda k: -tot_k[k])[:12]:
            print(f"    {k:52s} {cnt[k] // 3:4d} {tot_k[k]:8.1f} us")
        while be.has_work:
            for s in seqs:
                be.cancel(s.seq_id)
            be.step()
    # per-shape GEMMs: bf16 planes (cuBLAS) vs FP8 e4m3 row-wise (torch._scaled_mm)
    shapes = {(3584, 3584): "q / o", (512, 3584): "k / v", (18944, 3584): "gate / up", (3584, 18944): "down",
              (152064, 3584): "lm head"}
    print("\nper shape, M rows: bf16 cuBLAS vs FP8 _scaled_mm (us, weight TB/s)")
    for M in batches:
        for (Nn, K), name in shapes.items():
            Wb = torch.randn(Nn, K, device="cuda", dtype=torch.bfloat16) * 0.02
            x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
            W8 = Wb.to(torch.float8_e4m3fn)
            x8 = x.to(torch.float8_e4m3fn)
            sa = torch.ones(M, 1, device="cuda", dtype=torch.float32)
            sb = torch.ones(1, Nn, device="cuda", dtype=torch.float32)

            def bench(f):
                for _ in range(3):
                    f()
                s0, s1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s0.record()
                for _ in range(20):
                    f()
                s1.record()
                torch.cuda.synchronize()
                return s0.elapsed_time(s1) / 20 * 1e3
            tb = bench(lambda: x @ Wb.t())
            try:
                t8 = bench(lambda: torch._scaled_mm(x8, W8.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16))
            except Exception as e:   # noqa: BLE001 (report, go on)
                t8 = float("nan")
                print("   _scaled_mm:", str(e).splitlines()[0][:100])
            print(f"  M={M:4d} {name:10s} {Nn:6d}x{K:5d}: bf16 {tb:7.1f} us {Nn * K * 2 / tb / 1e6:5.2f} TB/s | "
                  f"fp8 {t8:7.1f} us {Nn * K / t8 / 1e6:5.2f} TB/s | {tb / t8:4.2f}x")
            del Wb, W8


if __name__ == "__main__":
    main(sys.argv[1], [int(a) for a in sys.argv[2:]] or [32, 128])
