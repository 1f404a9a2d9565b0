"""The decode GEMV's shapes under Nsight Compute (issue 12, perf-log CE0): why a one-wave split-K down reads
~2.9 TB/s where gate+up, the same kernel, reads ~3.9.

Each shape of the 7B (q/k/v, o, gate+up, the Q4_K and Q6_K downs) is launched the way the engine launches
it (qmatmul._q8_kw under the default Switches, the shipped Gluon config and tile layout) on rotating copies
of random valid planes, warmed outside the profiled range, then CALLS eager launches inside
torch.cuda.profiler.start() / stop(), each launch checked first to take the Gluon kernel. Run under ncu:

    ncu --clock-control none --profile-from-start off --kernel-name regex:gemv_q8g \\
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
        --section Occupancy --section LaunchStats --csv --page raw \\
        python tools/ncu_gemv.py [--calls 2] [--shapes down4,gu]  > ncu.csv
    python tools/ncu_gemv.py --summarize ncu.csv        (anywhere: a table of the metrics that matter)

ncu replays each profiled launch with its caches flushed (its default --cache-control all), so every row is
a cold-L2 kernel, as in the step. The shape order is printed to stderr so the CSV's launches can be named.
"""
from __future__ import annotations

import argparse
import sys

import torch

from gemv_table import SHAPES as TABLE_SHAPES, SHORT  # noqa: E402 -- tools/ is the script's directory

# the kernel table's shapes (tools/gemv_table.py), by its keys: (label, [(qtype, rows)], K)
SHAPES = {key: shape for key, shape in zip(SHORT, TABLE_SHAPES) if key in ("qkv", "o", "gu", "down4", "down6")}


KEEP = [                                     # (ncu raw metric, short name), in the table's order
    ("gpu__time_duration.sum", "us"),
    ("dram__bytes_read.sum", "DRAM MB read"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % peak"),
    ("lts__t_sector_hit_rate.pct", "L2 hit %"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM % peak"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %"),
    ("sm__cycles_active.avg", "SM active cycles"),
    ("gpc__cycles_elapsed.max", "elapsed cycles"),
    ("launch__registers_per_thread", "regs"),
    ("launch__grid_size", "grid"),
    ("launch__block_size", "block"),
    ("launch__occupancy_limit_registers", "blocks/SM by regs"),
    ("smsp__inst_executed.sum", "instructions"),
]


def summarize(path: str) -> int:
    """Print a markdown table of KEEP and the six largest warp-stall reasons of each profiled launch in an
    `ncu --csv --page raw` file (first line names, second units, then one line a launch)."""
    import csv

    with open(path, newline="") as f:
        lines = [ln for ln in f if ln.startswith('"')]       # ncu's own "==PROF==" lines are not CSV
    rows = list(csv.reader(lines))
    if len(rows) < 3:
        print(f"{path}: no profiled launches (only {len(rows)} CSV lines)")
        return 1
    head, units, data = rows[0], rows[1], rows[2:]
    col = {h: i for i, h in enumerate(head)}
    name_i = col.get("Kernel Name", col.get("kernel_name", 0))
    stall = [h for h in head if "issue_stalled" in h and h.endswith("per_warp_active.pct")] or \
            [h for h in head if "issue_stalled" in h and h.endswith(".ratio")]
    print("| launch | kernel | " + " | ".join(s for _, s in KEEP) + " | largest stalls |")
    print("|---|---|" + "---:|" * len(KEEP) + "---|")
    for j, r in enumerate(data):
        vals = []
        for m, _ in KEEP:
            v = r[col[m]] if m in col else "-"
            u = units[col[m]] if m in col else ""
            if m == "gpu__time_duration.sum" and v not in ("-", ""):
                f_ = float(v.replace(",", ""))
                v = f"{f_ / 1000 if u == 'nsecond' else f_ * 1000 if u == 'msecond' else f_:.2f}"
            elif m == "dram__bytes_read.sum" and v not in ("-", ""):
                f_ = float(v.replace(",", ""))
                v = f"{f_ * {'byte': 1e-6, 'Kbyte': 1e-3, 'Mbyte': 1, 'Gbyte': 1e3}.get(u, float('nan')):.2f}"
            vals.append(v)

        def num(h):
            try:
                return float(r[col[h]].replace(",", ""))
            except ValueError:
                return 0.0
        top = sorted(stall, key=num, reverse=True)[:6]
        st = ", ".join(f"{h.split('issue_stalled_')[1].split('_per_')[0]} {num(h):.2f}" for h in top)
        print(f"| {j} | {r[name_i][:28]} | " + " | ".join(vals) + f" | {st} |")
    return 0


def main(argv=None) -> int:
    if argv is None and len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        return summarize(sys.argv[2])
    from minfer.bench.gemv_q8_sweep import _copies
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack_layout import to_tiles
    from minfer.ops.cuda.plane_layout import tile_rows_for
    from minfer.ops.cuda.qmatmul import _q8_kw
    from minfer.switches import Switches

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=2, help="profiled launches a shape")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma list of {', '.join(SHAPES)}")
    a = ap.parse_args(argv)
    keys = [s for s in a.shapes.split(",") if s]
    for s in keys:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown {s!r} (one of {', '.join(SHAPES)})")
    sw = Switches.from_env()
    probe = torch.empty(1, device="cuda")
    kw = _q8_kw(sw, probe)
    kw.pop("l2", None)
    gen = torch.Generator(device="cuda").manual_seed(0)
    prepared = []
    for s in keys:
        label, specs, k = SHAPES[s]
        n = sum(r for _, r in specs)
        rws, _, copies = _copies(specs, k, gen)
        tr = tile_rows_for(specs[0][0], n, k, sw.gemv_q8g_table)
        rws = [to_tiles(r, tr) for r in rws] if tr else rws
        q8 = Q.quantize(torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen))
        ws = G.GemvWorkspace("cuda")
        paths.reset()
        for i in range(3):
            Q.gemv_q8(q8, rws[i % copies], ws=ws, **kw)
        torch.cuda.synchronize()
        snap = paths.snapshot()
        if snap["counts"].get("gemv_q8.gluon", 0) != 3 or snap["fallbacks"]:
            print(f"{label}: not the Gluon kernel: {snap}", file=sys.stderr)
            return 1
        prepared.append((f"{label} {s}", rws, copies, q8, ws, tr))
    torch.cuda.profiler.start()
    for label, rws, copies, q8, ws, tr in prepared:
        print(f"profiled: {label} x {a.calls} (tile rows {tr})", file=sys.stderr, flush=True)
        for i in range(a.calls):
            Q.gemv_q8(q8, rws[(3 + i) % copies], ws=ws, **kw)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
