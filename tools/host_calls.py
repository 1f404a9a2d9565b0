"""What each host-side call of a graphed decode token costs on this machine's CPU (issue 12:
the 85 us a token between the graph's GPU time and the bench's wall time, tools/host_gap.py).
Each call timed over many repetitions (median per call, in us), the GPU idle or busy as noted:
    python tools/host_calls.py
No model needed: a one-kernel graph stands in for the step's graph."""
import statistics
import time

import torch


def per_call(fn, n=2000, sync=False):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        t1 = time.perf_counter()
        ts.append(t1 - t0)
        if sync:
            torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def main():
    dev = torch.device("cuda")
    inp = torch.zeros(2, dtype=torch.int64, device=dev)
    inp_host = torch.zeros(2, dtype=torch.int64, pin_memory=True)
    arr = inp_host.numpy()
    ev = torch.cuda.Event()
    ev.record()
    torch.cuda.synchronize()
    x = torch.zeros(1024, device=dev)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        x.add_(1)
    logits = torch.zeros(1, 152064, dtype=torch.float32, device=dev)
    out = torch.empty(logits.shape, dtype=torch.float32, pin_memory=True)
    rows = []

    def add(name, us):
        rows.append((name, us))
        print(f"{name:<58} {us:8.2f} us", flush=True)

    add("numpy write of token and position (pinned)", per_call(lambda: (arr.__setitem__(0, 5), arr.__setitem__(1, 9))))
    add("inp.copy_(pinned, non_blocking=True) (H2D 16 B)", per_call(lambda: inp.copy_(inp_host, non_blocking=True), sync=True))
    add("event.record()", per_call(ev.record, sync=True))
    add("event.synchronize() (already complete)", per_call(ev.synchronize))
    add("event.query() (already complete)", per_call(ev.query))
    add("tensor.fill_(int) x2 (two fill kernels)", per_call(lambda: (inp[0:1].fill_(5), inp[1:2].fill_(9)), sync=True))
    add("graph.replay() (one-kernel graph, GPU idle)", per_call(g.replay, sync=True))
    add("torch.empty((1, 152064), pin_memory=True)", per_call(
        lambda: torch.empty((1, 152064), dtype=torch.float32, pin_memory=True)))
    add("out.copy_(logits, non_blocking=True) (D2H 608 KB, call only)", per_call(
        lambda: out.copy_(logits, non_blocking=True), sync=True))

    def d2h_sync():
        out.copy_(logits, non_blocking=True)
        torch.cuda.current_stream().synchronize()
    add("D2H 608 KB + stream synchronize (whole)", per_call(d2h_sync))
    add("torch.cuda.current_stream().synchronize() (idle)", per_call(lambda: torch.cuda.current_stream().synchronize()))

    def im():
        with torch.inference_mode():
            pass
    add("with torch.inference_mode(): pass", per_call(im))
    from minfer.ops import paths
    add("paths.count(...)", per_call(lambda: paths.count("graph.decode.replay")))


if __name__ == "__main__":
    main()
