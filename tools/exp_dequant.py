"""Device experiment: the Q4_K dequant kernels ('run' = _dequant_kernel, 'pair' =
_dequant_q4k_pair_kernel) at the 7B's gate/up shape, against a plain bf16 copy of the same
output size (the bandwidth this access pattern can reach). Rates count bytes read + written.

    python3 tools/exp_dequant.py [--json OUT]"""
import argparse
import json
import os

import torch
import triton

from minfer.ops.cuda import dequant
from minfer.ops.cuda.bench_kernels import random_raw

ap = argparse.ArgumentParser()
ap.add_argument("--json")
args = ap.parse_args()
g = torch.Generator(device="cuda").manual_seed(0)
res, table = {}, []
for n, k in ((37888, 3584), (4608, 3584)):
    raw = random_raw(12, n, k, g)
    out = torch.empty((n, k), dtype=torch.bfloat16, device="cuda")
    src = torch.empty_like(out)
    ms = triton.testing.do_bench(lambda: out.copy_(src), warmup=10, rep=100)
    tb = 2 * out.numel() * 2 / ms / 1e9
    res[f"copy.{n}x{k}"] = tb
    table.append(f"{n}x{k} bf16 copy (read+write {4*out.numel()/1e6:.0f} MB): {tb:.2f} TB/s")
    ref = None
    for mode, tiles in (("run", ((8, 256),)), ("pair", ((8, 256), (16, 256), (32, 256), (16, 512)))):
        os.environ["MINFER_DEQUANT_Q4K"] = mode
        for tile in tiles:
            for nw in (4, 8):
                dequant.dequantize_into(raw, 12, n, k, out, tile=tile, num_warps=nw)
                if ref is None:
                    ref = out.clone()
                same = bool(torch.equal(out, ref))
                ms = triton.testing.do_bench(lambda: dequant.dequantize_into(raw, 12, n, k, out, tile=tile, num_warps=nw),
                                             warmup=10, rep=100)
                tb = (raw.numel() + out.numel() * 2) / ms / 1e9
                res[f"{mode}.{n}x{k}.{tile}.{nw}"] = {"ms": ms, "tbps": tb, "equal_to_run": same}
                table.append(f"{n}x{k} Q4_K {mode:4s} tile {tile} warps {nw}: {ms*1e3:7.1f} us {tb:.2f} TB/s equal {same}")
    os.environ.pop("MINFER_DEQUANT_Q4K")
if args.json:
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
print("\n==== Q4_K dequant variants (H200) ====")
print("\n".join(table))
