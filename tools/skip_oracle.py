"""The most a fusion could save (issue 12): the graphed 7B decode step captured again with some
small kernels left out, their outputs frozen (the tensors of their first real call, reused),
and the graph's GPU time compared with the full step's, interleaved in rounds.

A timing oracle, not a path: the frozen outputs make the logits wrong. What it bounds: a
kernel folded into its neighbour (the RMSNorm into the next GEMV's activation load, SwiGLU into
the down GEMV's, rope + KV append into the q/k/v GEMV's epilogue) saves at most what leaving
it out saves here, and less by whatever work the neighbour takes over.
  base      the step as it is
  -norm     the add + RMSNorm + q8 kernels (2 a layer) left out
  addonly   those kernels without the norm: the residual add and q8 of the sum only (the
            norm's sum of squares computed elsewhere, e.g. in the producer's epilogue)
  -swiglu   the SwiGLU + q8 kernel left out
  -rope     the rope + KV append kernel left out
  -3        all three left out
    python tools/skip_oracle.py Q7.gguf [depth ...]      (default 16 3354)"""
import statistics
import sys

import torch

from minfer.models.base import Step
from minfer.ops.cuda import q8_rows
from minfer.runtime.engine import Engine
from prof_decode import warm  # noqa: E402 -- tools/ is the script's directory


def frozen(fn):
    """fn with its result of the first call per input shape returned again (no launch)."""
    memo = {}

    def f(*a, **k):
        key = tuple(tuple(t.shape) for t in a if isinstance(t, torch.Tensor))
        if key not in memo:
            memo[key] = fn(*a, **k)
        return memo[key]
    return f


def add_only(x, y, weight, eps, out_dtype, interpret=False, pdl=False, one_pass=True, preload=True):
    return q8_rows._q8_launch(x, y, None, None, eps, out_dtype, interpret, pdl=pdl)


def capture(eng, pos: int):
    model, cache, ctx = eng.model, eng.cache, eng.ctx
    inp = torch.tensor([1, pos], dtype=torch.int64, device=model.device)

    def fwd():
        return model.forward(inp[0:1], Step(inp[1:2], None, "all"), cache, ctx)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fwd()
    torch.cuda.synchronize()
    return g


def variant(eng, pos: int, name: str):
    real_norm, real_swiglu = q8_rows.add_rms_norm_q8, q8_rows.swiglu_q8
    if name in ("-norm", "-3"):
        q8_rows.add_rms_norm_q8 = frozen(real_norm)
    if name == "addonly":
        q8_rows.add_rms_norm_q8 = add_only
    if name in ("-swiglu", "-3"):
        q8_rows.swiglu_q8 = frozen(real_swiglu)
    if name in ("-rope", "-3"):
        eng.cache.write_rotated = lambda layer, q, k, v, step, rope, ctx=None: q
    try:
        return capture(eng, pos)
    finally:
        q8_rows.add_rms_norm_q8, q8_rows.swiglu_q8 = real_norm, real_swiglu
        eng.cache.__dict__.pop("write_rotated", None)


def time_graph(g, n: int = 20) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(n):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(out)


@torch.inference_mode()
def main():
    path = sys.argv[1]
    depths = [int(a) for a in sys.argv[2:]] or [16, 3354]
    eng = Engine.load(path, device="cuda", ctx=4096, progress=False)
    names = ["base", "-norm", "addonly", "-swiglu", "-rope", "-3"]
    for depth in depths:
        _, pos = warm(eng, depth)
        graphs = {k: variant(eng, pos, k) for k in names}
        res = {k: [] for k in names}
        for _ in range(7):
            for k in names:
                res[k].append(time_graph(graphs[k]))
        base = statistics.median(res["base"])
        print(f"depth {depth}: graph on the GPU, us (median of 7 rounds x 20 replays)")
        print("| variant | us | saved vs base, us | base/variant |")
        print("|---|---:|---:|---:|")
        for k in names:
            m = statistics.median(res[k])
            print(f"| {k} | {m:.0f} | {base - m:.0f} | {base / m:.3f} |")
        del graphs


if __name__ == "__main__":
    main()
