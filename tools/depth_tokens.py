"""Why a tg128 @ d3354 token of `minfer bench` takes longer over its graph than a tg128 token
(issue 12): the bench's own loop (Engine.forward per token, a random token each step, the logits
read on the host) timed token by token after the same prefill, with a context as the bench sizes
it, in four ways, each rep interleaved with the others:
  plain    as `minfer bench` times it (reset, prefill `depth` tokens, synchronize, 128 tokens)
  sleep    the same with 0.5 s idle between the prefill and the first token (the GPU's clocks and
           the host settle: a difference says the prefill's wake slows the tokens after it)
  nogc     the same with Python's garbage collector off during the 128 tokens
  events   CUDA events around each token's forward (its graph and logits copy on the GPU)
  clocks   plain, with a thread reading the GPU's SM clock, power and clock-event reasons through
           NVML (libnvidia-ml, ctypes) every ~1 ms from the prefill's start: what the GPU ran at
           during the prefill and each group of tokens (is the post-prefill slowdown the clock?)
Per way: mean us a token, the means of tokens 0-15 / 16-63 / 64-127, the slowest token, and
(events) the GPU time a token; gc: collections and their time during the tokens (plain).
    python tools/depth_tokens.py Q7.gguf [depth ...]      (default depths: 0 3354)"""
import gc
import statistics
import sys
import time

import numpy as np
import torch

from minfer.runtime.engine import Engine

N = 128


class Clocks:
    """NVML samples (t, SM MHz, power W, clock-event reason bits) from a thread, GPU 0 of NVML's
    order unless CUDA's device 0 is found by its PCI bus id. None when NVML cannot be loaded."""

    def __init__(self):
        import ctypes

        self.ct = ctypes
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        assert self.lib.nvmlInit_v2() == 0
        self.h = ctypes.c_void_p()
        pr = torch.cuda.get_device_properties(0)
        bus = f"{getattr(pr, 'pci_domain_id', 0):08x}:{getattr(pr, 'pci_bus_id', 0):02x}:" \
              f"{getattr(pr, 'pci_device_id', 0):02x}.0".encode()
        if self.lib.nvmlDeviceGetHandleByPciBusId_v2(bus, ctypes.byref(self.h)) != 0:
            assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.h)) == 0
        self.samples, self.stop, self.th = [], None, None     # start() makes the sampling thread

    def read(self):
        c, pw, r = self.ct.c_uint(), self.ct.c_uint(), self.ct.c_ulonglong()
        self.lib.nvmlDeviceGetClockInfo(self.h, 1, self.ct.byref(c))          # NVML_CLOCK_SM
        self.lib.nvmlDeviceGetPowerUsage(self.h, self.ct.byref(pw))           # mW
        self.lib.nvmlDeviceGetCurrentClocksThrottleReasons(self.h, self.ct.byref(r))
        return time.perf_counter(), c.value, pw.value / 1e3, r.value

    def start(self):
        import threading

        self.samples, self.stop = [], threading.Event()

        def run():
            while not self.stop.is_set():
                self.samples.append(self.read())
                time.sleep(0.001)

        self.th = threading.Thread(target=run, daemon=True)
        self.th.start()

    def finish(self):
        self.stop.set()
        self.th.join()
        return self.samples


def _clock_span(samples, t0, t1):
    """Mean SM MHz, mean W, OR of the reason bits over samples in [t0, t1)."""
    sel = [x for x in samples if t0 <= x[0] < t1]
    if not sel:
        return "-"
    bits = 0
    for x in sel:
        bits |= x[3]
    return f"{np.mean([x[1] for x in sel]):.0f} MHz {np.mean([x[2] for x in sel]):.0f} W 0x{bits:x}"


def one(eng, depth, way, rng, vocab, clocks=None):
    ctx = rng.integers(0, vocab, size=depth).tolist()
    ids = rng.integers(0, vocab, size=N).tolist()
    eng.reset()
    if way == "clocks":
        clocks.start()
    tp = time.perf_counter()
    if depth:
        eng.prefill(ctx)
    torch.cuda.synchronize()
    if way == "sleep":
        time.sleep(0.5)
    gcs = []
    ev = []
    if way == "nogc":
        gc.disable()

    def cb(phase, info):
        gcs.append((phase, time.perf_counter(), info.get("generation")))

    gc.callbacks.append(cb)
    ts = [time.perf_counter()]
    try:
        for j, tok in enumerate(ids):
            if way == "events":
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                eng.forward([tok], depth + j)
                e1.record()
                ev.append((e0, e1))
            else:
                eng.forward([tok], depth + j)
            ts.append(time.perf_counter())
    finally:
        gc.callbacks.remove(cb)
        gc.enable()
    torch.cuda.synchronize()
    if way == "clocks":
        smp = clocks.finish()
        spans = [("prefill", tp, ts[0]), ("tokens 0-15", ts[0], ts[16]), ("16-63", ts[16], ts[64]),
                 ("64-127", ts[64], ts[-1])]
        print(f"  clocks, depth {depth}: " + "; ".join(f"{n} {_clock_span(smp, a, b)}" for n, a, b in spans),
              flush=True)
    dt = np.diff(ts) * 1e6
    gpu = [a.elapsed_time(b) * 1e3 for a, b in ev]
    gct = sum(t1 - t0 for (p0, t0, _), (p1, t1, _) in zip(gcs[::2], gcs[1::2])) * 1e6
    return dt, gpu, len(gcs) // 2, gct


def main():
    path = sys.argv[1]
    depths = [int(d) for d in sys.argv[2:]] or [0, 3354]
    n_ctx = max(depths) + N + 1                  # minfer bench's context for these tests
    eng = Engine.load(path, device="cuda", ctx=n_ctx, progress=False)
    vocab = eng.config.vocab
    rng = np.random.default_rng(0)
    ways = ["plain", "sleep", "nogc", "events"]
    try:
        clocks = Clocks()
        ways.append("clocks")
    except (OSError, AssertionError) as e:
        print(f"NVML not available ({e}): no clocks way")
        clocks = None
    for depth in depths:
        one(eng, depth, "plain", rng, vocab)      # warm-up: captures the graphs
        res = {w: [] for w in ways}
        for _ in range(3):
            for w in ways:
                res[w].append(one(eng, depth, w, rng, vocab, clocks))
        print(f"depth {depth} (context {n_ctx}), 3 reps a way, us a token:")
        print("| way | mean | tokens 0-15 | 16-63 | 64-127 | slowest | GPU a token (events) | gc runs / us |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        for w in ways:
            dts = np.concatenate([r[0] for r in res[w]])
            per = np.stack([r[0] for r in res[w]])
            gpu = [g for r in res[w] for g in r[1]]
            gpu_s = f"{statistics.median(gpu):.0f} (mean {np.mean(gpu):.0f})" if gpu else "-"
            gcn = sum(r[2] for r in res[w])
            gct = sum(r[3] for r in res[w])
            print(f"| {w} | {dts.mean():.0f} | {per[:, :16].mean():.0f} | {per[:, 16:64].mean():.0f} | "
                  f"{per[:, 64:].mean():.0f} | {dts.max():.0f} | {gpu_s} | {gcn} / {gct:.0f} |", flush=True)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
