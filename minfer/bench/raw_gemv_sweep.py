"""The raw-block decode GEMV (ops/cuda/gemv.py) at the small models' one-row shapes: byte reads against
halfword reads (Switches.gemv_raw_halfwords), per one-pass tile (BN) and warp count.

    python3 -m minfer.bench.raw_gemv_sweep [--json OUT.json] [--calls 48]

Shapes: Qwen2.5-0.5B Q4_K_M's raw linears at M = 1 (hidden 896: q/k/v stacked, o, gate+up stacked in Q5_0,
v and the lm head in Q8_0) and SmolLM2-135M's (576) gate+up. Weights: random blocks on the GPU with finite
f16 scales, rotating copies (>= 192 MB in all) so no call finds its weight in L2. Timing:
gemv_sweep.graph_time (a CUDA graph of the calls, median replay / calls). Rates: the raw bytes read per
second and their share of 4.1 TB/s (ANCHORS.md's H200 copy bandwidth).
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from minfer.bench.gemv_sweep import COPY_BW, graph_time
from minfer.ops.cuda import gemv as G
from minfer.ops.cuda.dequant import LAYOUT

Q4_0, Q5_0, Q8_0 = 2, 6, 8
NAME = {Q4_0: "Q4_0", Q5_0: "Q5_0", Q8_0: "Q8_0"}
# (label, type, N, K)
SHAPES = [("0.5B gate+up", Q5_0, 9728, 896), ("0.5B q/k/v", Q5_0, 1152, 896), ("0.5B o", Q5_0, 896, 896),
          ("0.5B v", Q8_0, 128, 896), ("0.5B lm head", Q8_0, 151936, 896), ("135M gate+up", Q5_0, 3072, 576),
          ("Q4_0 896 rows", Q4_0, 4864, 896)]
TILES = [(None, 4), (4, 4), (8, 4), (8, 8), (16, 8)]       # (BN or the rule's, warps)


def random_raw(qt: int, n: int, k: int, gen) -> torch.Tensor:
    """uint8 (n, row bytes): random blocks whose f16 scale (the first two bytes) is small and finite."""
    _, qk, ts = LAYOUT[qt]
    nb = k // qk
    raw = torch.randint(0, 256, (n, nb, ts), dtype=torch.uint8, device="cuda", generator=gen)
    raw[:, :, 0:2] = (torch.randn(n, nb, 1, device="cuda", generator=gen) * 0.01).half().view(torch.uint8)
    return raw.view(n, nb * ts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="write the rows here")
    ap.add_argument("--calls", type=int, default=48, help="calls captured in one graph")
    args = ap.parse_args(argv)
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1, 1024, device="cuda", dtype=torch.bfloat16)
    rows = []
    print(f"{torch.cuda.get_device_name()}; {args.calls} calls a graph; rates of the raw bytes")
    print("| shape | type | N x K | BN | warps | bytes | us | TB/s | halfwords us | TB/s | B/A |")
    print("|---|---|---|---:|---:|---|---:|---:|---:|---:|---:|")
    for label, qt, n, k in SHAPES:
        one = G.one_pass_tile(1, n, k)
        w0 = random_raw(qt, n, k, gen)
        nbytes = w0.numel()
        copies = [w0] + [random_raw(qt, n, k, gen) for _ in range(max(1, (192 << 20) // nbytes))]
        xs = x[:, :k].contiguous()
        for bn, warps in TILES:
            tile = None if bn is None else (bn, one[1] if one else 256)
            res = {}
            for hw in (False, True):
                fns = [lambda c=c, hw=hw: G.gemv(xs, c, qt, n, k, one_pass=True, pdl=0, halfwords=hw, tile=tile,
                                                 num_warps=warps) for c in copies[:args.calls]]
                while len(fns) < args.calls:
                    fns += fns[:args.calls - len(fns)]
                res[hw] = graph_time(fns)
            a, b = res[False], res[True]
            r = {"shape": label, "type": NAME[qt], "n": n, "k": k, "bn": bn or (one[0] if one else 8), "warps": warps,
                 "bytes": nbytes, "us_byte": a * 1e6, "us_halfword": b * 1e6, "b_over_a": a / b}
            rows.append(r)
            print(f"| {label} | {NAME[qt]} | {n}x{k} | {r['bn']}{'' if bn else ' (rule)'} | {warps} | {nbytes / 1e6:.2f} MB "
                  f"| {a * 1e6:.2f} | {nbytes / a / 1e12:.2f} | {b * 1e6:.2f} | {nbytes / b / 1e12:.2f} | {a / b:.3f} |")
        del copies
        torch.cuda.empty_cache()
    print(f"(copy bandwidth {COPY_BW / 1e12:.1f} TB/s: ANCHORS.md)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
