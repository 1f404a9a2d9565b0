"""Issue 12's per-shape kernel table: each linear shape of the Qwen2.5-7B Q4_K_M at M = 1 on the
decode GEMV the engine ships, as a kernel (on the GPU).

    python tools/gemv_table.py [--calls 48] [--json OUT.json] [--try o=32,16,1,8,0,128 ...]

For each shape (q/k/v all Q4_K, q/k/v with a Q6_K v in one launch, o, gate+up, down Q4_K, down
Q6_K, lm head): random valid blocks repacked on the GPU, in rotating copies (>= 192 MB, so no call
finds its planes in L2), stored in the layout the engine gives them (plane_layout.tile_rows_for:
tile-major where the Gluon table's config asks), and launched the way the engine launches a
decode GEMV (qmatmul._q8_kw under the default Switches: PDL mode, prefetch, the Gluon table).
Checks before timing:
  - the launch took the Gluon kernel (the path counters: `gemv_q8.gluon` counted, no fallback);
  - the output against an independent float64 product of the dequantized planes
    (gemv_repack.dequantize_into) and the dequantized q8 row: relative error <= 1e-5;
  - on a tile-major shape, the same bits as the same planes row-major.
Times: gemv_sweep.graph_time (one CUDA graph of the calls walking the copies, median replay over the
calls), without PDL and PDL-chained (each launch's programs start during the one before, as in the
step); and the kernel's own time (kernel_time: CUPTI's start-to-end stamps of eager launches, each
alone on the GPU, the weights cold in L2), which leaves out what a launch costs before its first
program runs and between kernels. Beside each shipped row, its one-step floor: the same config,
build and grid on planes of one step a K split (K = 256 x BB x the split count; one block where K is not split), PDL-chained -- what a launch
of that grid costs with almost nothing to read -- and the rate past it, (file bytes - the floor's) /
(chained time - the floor's): how fast the launch reads its further steps (perf-log AK3, AK8).
--try SHAPE=CONFIG times another Gluon config of a shape (keys: SHORT below) the same way,
after the same checks, beside the shipped one. Each row gives the kernel's registers a thread and
programs an SM (by registers: the measure of how much of the next launch a PDL chain can place on
the SMs while this one runs). Rates: the GGUF file's weight bytes (Q4_K 144, Q6_K 210 bytes a 256-block) per second; the
repacked planes hold 148 / 210. The step's own measure (from each GEMV's release, with its
neighbours' overlap) is tools/gemv_timeline.py.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

FILE_BLOCK = {12: 144, 14: 210}          # ggml's Q4_K / Q6_K block bytes (ggml-common.h block_q4_K / block_q6_K)
COPY_BW = 4.2e12                         # the H200's measured copy rate (ANCHORS.md)
SHAPES = [                               # label, segments [(qtype, rows)], K
    ("q/k/v", [(12, 4608)], 3584),
    ("q/k/v, v Q6_K", [(12, 4096), (14, 512)], 3584),
    ("o", [(12, 3584)], 3584),
    ("gate+up", [(12, 37888)], 3584),
    ("down", [(12, 3584)], 18944),
    ("down", [(14, 3584)], 18944),
    ("lm head", [(14, 152064)], 3584),
]
NAME = {12: "Q4_K", 14: "Q6_K"}
SHORT = ["qkv", "qkvm", "o", "gu", "down4", "down6", "lm"]       # --try keys, in SHAPES' order


def main(argv=None) -> int:
    from minfer.bench.gemv_q8_sweep import _copies
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.qmatmul import _q8_kw
    from minfer.switches import Switches

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--calls", type=int, default=48, help="calls per graph (>= the copies)")
    ap.add_argument("--json", default="", help="write the rows here")
    ap.add_argument("--try", dest="tries", action="append", default=[], metavar="SHAPE=CONFIG",
                    help=f"another Gluon config to time for a shape ({', '.join(SHORT)}), comma-separated ints "
                         "in the table's field order (booleans 0 / 1); repeatable")
    ap.add_argument("--only-tried", action="store_true", help="only the shapes named by --try")
    ap.add_argument("--warm", action="store_true",
                    help="also time each launch on one copy of its weights (resident in the 50 MB L2 when its "
                         "planes fit): whether the kernel is bound by HBM (warm much faster) or by its own "
                         "instructions and latency (warm about as fast)")
    a = ap.parse_args(argv)
    tries = {}
    for t in a.tries:
        key, _, val = t.partition("=")
        if key not in SHORT or not val:
            ap.error(f"--try {t!r}: expected SHAPE=CONFIG with SHAPE one of {', '.join(SHORT)}")
        tries.setdefault(key, []).append(tuple(int(v) for v in val.split(",")))
    gen = torch.Generator(device="cuda").manual_seed(0)
    sw = Switches.from_env()
    probe = torch.empty(1, device="cuda")
    kw = _q8_kw(sw, probe)
    # (q/k/v signals the attention at its end when the rope-fused attention follows: qmatmul._group_q8)
    kw_qkv = _q8_kw(sw, probe, late=sw.decode_attn_rope)
    if kw["l2"]:
        print("the default switches ask for L2 prefetch ranges, which only the Triton kernel runs: "
              "this table is the Gluon kernel's")
        return 1
    kw.pop("l2")
    kw_qkv.pop("l2")
    kw0 = kw
    rows, bad = [], 0
    print(f"{torch.cuda.get_device_name()}; launch as the engine: {kw}")
    for (label, specs, k), short in zip(SHAPES, SHORT):
        if a.only_tried and short not in tries:
            continue
        n = sum(r for _, r in specs)
        qts = [qt for qt, _ in specs]
        rws, plane_bytes, copies = _copies(specs, k, gen)
        file_bytes = sum(r * k // 256 * FILE_BLOCK[qt] for qt, r in specs)
        segs0 = rws[0] if isinstance(rws[0], tuple) else (rws[0],)
        shipped = GL.config_for(qts[0], n, k, sw.gemv_q8g_table)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        q8 = Q.quantize(x)
        dense = torch.cat([_dense(r, k, G) for r in segs0]).double()
        ref = Q.dequantize_q8(q8, k).double() @ dense.T
        del dense
        ws = G.GemvWorkspace("cuda")
        kw = kw_qkv if label.startswith("q/k/v") else kw0
        row_major = rws
        for ci, cfg in enumerate([shipped] + tries.get(short, [])):
            r = _time_one(a, label, short, specs, k, n, qts, cfg, ci == 0, row_major, copies, q8, ref,
                          ws, kw, file_bytes, plane_bytes, sw)
            if r is None:
                bad += 1
            else:
                if ci == 0:
                    r.update(_floor(specs, n, k, cfg, r["tile_rows"], kw, gen, file_bytes, r["us_pdl"], a.calls))
                rows.append(r)
        del rws, row_major
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "launch": {k_: str(v) for k_, v in kw0.items()},
                       "rows": rows}, f, indent=1)
    print("\n| shape | type | N x K | config | layout | regs, programs an SM | MB (file) | us, no PDL | "
          "us, PDL-chained | us, kernel | GB/s, no PDL | GB/s, PDL-chained | GB/s, kernel | % of 4.2 TB/s (chained / kernel) | "
          "one-step floor, us (K) | GB/s past the floor |")
    print("|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['shape']}{'' if r['shipped'] else ' (tried)'} | {'+'.join(dict.fromkeys(r['types']))} | "
              f"{r['n']} x {r['k']} | {r['config']} | "
              f"{'tiles of ' + str(r['tile_rows']) if r['tile_rows'] else 'rows'} | {r['regs']}, {r['per_sm']} | "
              f"{r['file_mb']:.2f} | {r['us_no_pdl']:.2f} | {r['us_pdl']:.2f} | {r['us_kernel']:.2f} | "
              f"{r['gbps_no_pdl']:.0f} | {r['gbps_pdl']:.0f} | {r['gbps_kernel']:.0f} | "
              f"{100 * r['gbps_pdl'] * 1e9 / COPY_BW:.0f} / {100 * r['gbps_kernel'] * 1e9 / COPY_BW:.0f} | "
              + (f"{r['floor_us']:.2f} ({r['floor_k']}) | {r['gbps_past_floor']:.0f} |" if "floor_us" in r else "- | - |"))
    return 1 if bad else 0


def _time_one(a, label, short, specs, k, n, qts, cfg, shipped, row_major, copies, q8, ref, ws, kw, file_bytes,
              plane_bytes, sw):
    """One config of one shape: checked (the Gluon path, float64, tile-major = row-major bits), then
    timed without PDL and PDL-chained; the row, or None after printing what failed. shipped: cfg is
    the table's, launched as the engine takes it (no explicit config, the engine's tile layout)."""
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_repack_layout import to_tiles
    from minfer.ops.cuda.plane_layout import tile_rows_for
    from minfer.bench.gemv_sweep import graph_time

    config = None if shipped else cfg
    if shipped:
        tr = tile_rows_for(qts[0], n, k, sw.gemv_q8g_table) if len(specs) == 1 else 0
    else:
        tr = int(cfg[0]) if len(specs) == 1 and len(cfg) > 9 and cfg[9] else 0
    rws = [to_tiles(r, tr) for r in row_major] if tr else row_major
    GL._gemv_q8g_kernel.device_caches.clear()       # (the variants load again, from Triton's disk cache)
    before = _compiled(GL._gemv_q8g_kernel)
    what = f"{label} {'+'.join(NAME[q] for q in dict.fromkeys(qts))} {n}x{k} {list(cfg)}"
    try:
        paths.reset()
        y = Q.gemv_q8(q8, rws[0], ws=ws, out_dtype=torch.float32, config=config, **kw)
        torch.cuda.synchronize()
    except Exception as ex:  # noqa: BLE001 -- a tried config the kernel refuses: say so, go on
        print(f"  {what}: launch failed: {ex!r}"[:400], flush=True)
        return None
    snap = paths.snapshot()
    err = float((y.double() - ref).norm() / ref.norm())
    problems = []
    if snap["counts"].get("gemv_q8.gluon", 0) != 1 or snap["fallbacks"]:
        problems.append(f"not the Gluon kernel: {snap}")
    if not err <= 1e-5:
        problems.append(f"relative error {err:.2e} against the float64 product")
    if tr:
        y0 = Q.gemv_q8(q8, row_major[0], ws=ws, out_dtype=torch.float32, config=config, **kw)
        if not torch.equal(y0, y):
            problems.append(f"tile-major and row-major differ in {int((y0 != y).sum())} values")
    if problems:
        print(f"  {what}: " + "; ".join(problems), flush=True)
        return None
    calls = max(copies, a.calls)
    t = {}
    for pdl in (0, 1):
        kwp = dict(kw, pdl=pdl if kw["pdl"] else 0, pdl_prefetch=kw["pdl_prefetch"] if pdl else 1)
        t[pdl] = graph_time([lambda i=i, kwp=kwp: Q.gemv_q8(q8, rws[i % copies], ws=ws, config=config, **kwp)
                             for i in range(calls)])
    # the kernels' own durations (CUPTI's start-to-end on the GPU, eager launches, weights cold in L2)
    ku, kn, knames = kernel_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], ws=ws, config=config, **kw)
                                  for i in range(calls)])
    if a.warm:
        # one copy: after the first call its planes are in L2 if they fit (a measuring aid, not the step)
        r_w = graph_time([lambda: Q.gemv_q8(q8, rws[0], ws=ws, config=config, **kw) for _ in range(calls)])
        k_w, _, _ = kernel_time([lambda: Q.gemv_q8(q8, rws[0], ws=ws, config=config, **kw) for _ in range(calls)])
    # registers: the variants this config loaded (PDL-chained and not)
    new = [c for key, c in _compiled(GL._gemv_q8g_kernel).items() if key not in before]
    regs = max((_regs(c) for c in new), default=0)
    threads = 32 * int(cfg[3])
    per_sm = min(65536 // (regs * threads), 2048 // threads, 32) if regs else 0
    r = {"shape": label, "key": short, "shipped": shipped, "types": [NAME[q] for q in qts], "n": n, "k": k,
         "config": list(cfg), "tile_rows": tr, "regs": regs, "per_sm": per_sm, "file_mb": file_bytes / 1e6,
         "plane_mb": plane_bytes / 1e6, "rel_err": err, "us_no_pdl": t[0] * 1e6, "us_pdl": t[1] * 1e6,
         "gbps_no_pdl": file_bytes / t[0] / 1e9, "gbps_pdl": file_bytes / t[1] / 1e9,
         "us_kernel": ku * 1e6, "gbps_kernel": file_bytes / ku / 1e9, "kernels_a_call": kn, "kernel_names": knames}
    if a.warm:
        r.update(us_warm_pdl=r_w * 1e6, us_warm_kernel=k_w * 1e6)
    print(f"  {what:70s} tiles {tr:2d} regs {regs:3d} ({per_sm} an SM)  {r['us_no_pdl']:7.2f} / "
          f"{r['us_pdl']:7.2f} / {r['us_kernel']:7.2f} us  {r['gbps_no_pdl']:5.0f} / {r['gbps_pdl']:5.0f} / "
          f"{r['gbps_kernel']:5.0f} GB/s (no PDL / PDL-chained / kernel)  err {err:.1e}"
          + (f"  warm (one copy, {plane_bytes / 1e6:.1f} MB of planes): {r['us_warm_pdl']:.2f} chained / "
             f"{r['us_warm_kernel']:.2f} alone" if a.warm else ""), flush=True)
    return r


def _floor(specs, n, k, cfg, tr, kw, gen, file_bytes, us_pdl, calls) -> dict:
    """The shipped config's one-step floor: the same launch (config, layout, so the same build and grid)
    on random planes of K' = one step of BB blocks a split (one block where K is not split): each
    program's steps cut to one, PDL-chained over two copies (small enough for L2: a floor), checked against the float64
    product first. {} when K' is not below K."""
    from minfer.bench.gemv_sweep import graph_time, random_raw
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8 as Q
    from minfer.ops.cuda import gemv_repack as G
    from minfer.ops.cuda.gemv_repack import splits
    from minfer.ops.cuda.gemv_repack_layout import to_tiles

    bb = int(cfg[1])
    _, sp = splits(k // 256, int(cfg[2]), bb)
    k1 = 256 * (sp * bb if sp > 1 else 1)      # one step a split (a split's blocks are whole steps); one block unsplit
    if k1 >= k:
        return {}
    if splits(k1 // 256, int(cfg[2]), bb)[1] != sp:
        print(f"  (floor of {n}x{k} {list(cfg)}: {sp} one-block splits do not keep the grid; left out)")
        return {}
    copies = []
    for _ in range(2):
        segs = tuple(G.repack(random_raw(qt, r, k1, gen), qt, r, k1) for qt, r in specs)
        segs = tuple(to_tiles(s, tr) for s in segs) if tr else segs
        copies.append(segs[0] if len(segs) == 1 else segs)
    q8 = Q.quantize(torch.randn(1, k1, device="cuda", dtype=torch.bfloat16, generator=gen))
    ws = G.GemvWorkspace("cuda")
    paths.reset()
    y = Q.gemv_q8(q8, copies[0], ws=ws, out_dtype=torch.float32, config=tuple(cfg), **kw)
    segs0 = copies[0] if isinstance(copies[0], tuple) else (copies[0],)
    dense = torch.cat([_dense(r, k1, G) for r in segs0]).double()
    ref = Q.dequantize_q8(q8, k1).double() @ dense.T
    err = float((y.double() - ref).norm() / ref.norm())
    snap = paths.snapshot()
    if err > 1e-5 or snap["counts"].get("gemv_q8.gluon", 0) != 1 or snap["fallbacks"]:
        print(f"  (floor of {n}x{k} {list(cfg)} at K {k1}: err {err:.1e}, paths {snap}; left out)")
        return {}
    t = graph_time([lambda i=i: Q.gemv_q8(q8, copies[i % 2], ws=ws, config=tuple(cfg), **kw) for i in range(calls)])
    fb1 = sum(r * k1 // 256 * FILE_BLOCK[qt] for qt, r in specs)
    past = (file_bytes - fb1) / max(us_pdl * 1e-6 - t, 1e-9) / 1e9
    print(f"    one-step floor (K {k1}, the same grid): {t * 1e6:.2f} us chained; past it {past:.0f} GB/s", flush=True)
    return {"floor_us": t * 1e6, "floor_k": k1, "floor_file_mb": fb1 / 1e6, "gbps_past_floor": past}


def kernel_time(fns, warm: int = 3) -> tuple[float, int, list[str]]:
    """The GPU's own time of each call's kernels: fns launched eagerly (the host is far slower than the
    kernels, so each call runs alone on an idle GPU), recorded by the CUDA profiler (CUPTI's kernel
    start and end stamps), each call's kernels' durations summed; (median seconds a call, kernels a
    call, their names). The launch's cost before its first program starts and the gap to the next
    launch are not in it -- that is the graphs' measure (graph_time); this is the kernel's."""
    import statistics

    from torch.profiler import ProfilerActivity, profile

    for f in fns[:warm]:
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for f in fns:
            f()
        torch.cuda.synchronize()
    ks = trace_kernels(prof)
    if not ks or len(ks) % len(fns):
        raise RuntimeError(f"the profiler recorded {len(ks)} kernels for {len(fns)} calls")
    per = len(ks) // len(fns)
    durs = [sum(float(e["dur"]) for e in ks[i * per:(i + 1) * per]) for i in range(len(fns))]
    names = list(dict.fromkeys(e["name"][:60] for e in ks[:per]))
    return statistics.median(durs) * 1e-6, per, names


def trace_kernels(prof) -> list[dict]:
    """The GPU kernels a torch.profiler run recorded (its chrome trace's kernel events: name, CUPTI's
    start ts and duration dur in us), in start order; a profile exports once."""
    import os
    import tempfile

    fd, path = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(path)
        with open(path) as fh:
            trace = json.load(fh)
    finally:
        os.unlink(path)
    return sorted((e for e in trace.get("traceEvents", []) if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def _compiled(fn) -> dict:
    """The compiled variants of a (Gluon) JIT function on every device: {cache key: kernel}."""
    out = {}
    for dev, entry in fn.device_caches.items():
        for key, kern in entry[0].items():
            out[(dev, key)] = kern
    return out


def _regs(kern) -> int:
    """Registers a thread of a compiled kernel (loading it if needed)."""
    kern._init_handles()
    return int(kern.n_regs)


def _dense(rw, k, G) -> torch.Tensor:
    d = torch.empty(rw.n, k, device="cuda", dtype=torch.float32)
    G.dequantize_into(rw, d)
    return d


if __name__ == "__main__":
    sys.exit(main())
