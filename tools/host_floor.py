"""How much of a bench token is the host's, layer by layer (issue 12): the same graphed 7B decode
step driven five ways, interleaved in rounds, each with the logits landing on the host:
  A  Engine.forward([t], pos)                        (what `minfer bench` times)
  B  DecodeGraph.step(t, pos, pinned=True) + to_host (no Engine: its checks, lock, token list)
  B2 B with host_sync=True and to_host(reuse=True) (Switches.graph_host_reuse)
  C  the inputs written to pinned memory + copy_ + replay + logits copy_ into one pinned buffer
     + synchronize (B's calls without torch.empty, the event or inference_mode)
  D  a graph of its own whose first node copies the token and position from pinned memory:
     the host writes them, replays, copies the logits out, synchronizes (no input copy call)
  E  D with the logits copy captured too: write, replay, synchronize (the floor of two calls)
and the graph's GPU time (events around a replay). Medians of microseconds a token.
    python tools/host_floor.py Q7.gguf [depth]        (default depth 16)"""
import statistics
import sys
import time

import torch

from minfer.models.base import Step
from minfer.runtime.engine import Engine
from prof_decode import warm  # noqa: E402 -- tools/ is the script's directory


def own_graph(model, cache, ctx, vocab: int, with_out: bool):
    """A graph of the decode step with the input copy (and, with_out, the logits copy) inside."""
    dev = model.device
    inp = torch.zeros(2, dtype=torch.int64, device=dev)
    host = torch.zeros(2, dtype=torch.int64, pin_memory=True)
    out = torch.empty((1, vocab), dtype=torch.float32, pin_memory=True)

    def fwd():
        inp.copy_(host, non_blocking=True)
        lg = model.forward(inp[0:1], Step(inp[1:2], None, "all"), cache, ctx)
        if with_out:
            out.copy_(lg, non_blocking=True)
        return lg

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    host[0], host[1] = 1, 20
    with torch.cuda.stream(s):
        fwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lg = fwd()
    return g, host.numpy(), lg, out


@torch.inference_mode()
def main():
    path = sys.argv[1]
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else 16
    eng = Engine.load(path, device="cuda", ctx=4096, progress=False)
    t, pos0 = warm(eng, depth)
    dg = eng._graph
    gd, hd, lgd, _ = own_graph(eng.model, eng.cache, eng.ctx, eng.config.vocab, False)
    ge, he, _, oute = own_graph(eng.model, eng.cache, eng.ctx, eng.config.vocab, True)
    outc = torch.empty((1, eng.config.vocab), dtype=torch.float32, pin_memory=True)
    stream = torch.cuda.current_stream()
    n = 48

    def A(p):
        for i in range(n):
            eng.forward([t], p + i)

    def B(p):
        for i in range(n):
            dg.to_host(dg.step(t, p + i, pinned=True))

    def B2(p):
        for i in range(n):
            dg.to_host(dg.step(t, p + i, pinned=True, host_sync=True), reuse=True)

    def calls(host, graph, logits, copy_in: bool):
        def run(p):
            for i in range(n):
                host[0] = t
                host[1] = p + i
                if copy_in:
                    dg.inp.copy_(dg.inp_host, non_blocking=True)
                graph.replay()
                outc.copy_(logits, non_blocking=True)
                stream.synchronize()
        return run

    C = calls(dg.inp_np, dg.graph, dg.logits, True)
    D = calls(hd, gd, lgd, False)

    def E(p):
        for i in range(n):
            he[0] = t
            he[1] = p + i
            ge.replay()
            stream.synchronize()

    ways = {"A Engine.forward": A, "B DecodeGraph.step + to_host": B,
            "B2 B with host_sync and reuse (Switches.graph_host_reuse)": B2, "C calls only": C,
            "D input copy in the graph": D, "E both copies in the graph": E}
    res = {k: [] for k in ways}
    for _ in range(5):
        for k, f in ways.items():
            eng.tokens = eng.tokens[:pos0]          # every way rewrites positions pos0.. (A checks the list)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            f(pos0)
            torch.cuda.synchronize()
            res[k].append((time.perf_counter() - t0) / n * 1e6)
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gpu = []
    for _ in range(20):
        e0.record()
        dg.graph.replay()
        e1.record()
        e1.synchronize()
        gpu.append(e0.elapsed_time(e1) * 1e3)
    g = statistics.median(gpu)
    print(f"depth {depth}: graph on the GPU {g:.0f} us (events around a replay, median of 20)")
    print("| way | us a token (median of 5 x 48) | tok/s | over the graph, us |")
    print("|---|---:|---:|---:|")
    for k, v in res.items():
        m = statistics.median(v)
        print(f"| {k} | {m:.0f} | {1e6 / m:.1f} | {m - g:.0f} |")


if __name__ == "__main__":
    main()
