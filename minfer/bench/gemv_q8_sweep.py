"""The int8-activation decode GEMV (ops/cuda/gemv_q8.py) beside the bf16 one (gemv_repack.py), per shape.

    python3 -m minfer.bench.gemv_q8_sweep --json OUT.json [--budget-s 120]

Shapes: the Qwen2.5-7B Q4_K_M linears at M = 1 (gemv_sweep.SHAPES). Weights: random valid
blocks repacked on the GPU, rotating copies (>= 192 MB) so no call finds its weight in L2.
Timing: gemv_sweep.graph_time (a CUDA graph of R calls, median replay / R). For each shape the
bf16 GEMV with its table config is timed first (A), then the q8 GEMV per config (B), then the
quantize kernel of the row; rates are weight bytes of the planes per second. The best q8
config per shape is printed as JSON for gemv_q8.CONFIGS.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from minfer.bench.gemv_sweep import COPY_BW, NAME, SHAPES, graph_time, random_raw
from minfer.ops.cuda import gemv_q8 as Q
from minfer.ops.cuda import gemv_repack as G

# (BN, BB, warps, prefetch) x split targets (programs)
CANDIDATES = [(64, 1, 4, True), (64, 1, 4, False), (128, 1, 4, True), (128, 1, 8, True), (32, 1, 2, True),
              (64, 2, 4, True), (32, 2, 4, True)]
TARGETS = [528, 1056]
# --wide: more tile shapes and split targets (the small and the K=18944 shapes)
WIDE = [(32, 2, 4, True), (16, 2, 2, True), (16, 4, 2, True), (32, 4, 4, True), (32, 1, 2, True), (64, 2, 8, True),
        (32, 2, 2, True), (16, 2, 4, True)]
WIDE_TARGETS = [264, 528, 1056, 2112]
# --small: the Triton kernel's shapes in the small models' decode (Qwen2.5-0.5B's down: 896 rows, under the Gluon
# rule's 1,024 floor; 5.1-6.6 us a layer on an H100 with its default config, perf-log AY3)
SMALL = [("down05_q4k", 12, 896, 4864), ("down05_q6k", 14, 896, 4864)]


def _copies(specs, k, gen) -> tuple:
    """(copies, plane bytes of one, the count): rotating repacked copies of random valid blocks, at
    least 192 MB in all so no call finds its planes in L2. specs [(qtype, rows)]: one weight, or
    segments launched together (a copy is then their tuple)."""
    nbytes = sum(n * k // 256 * G.REPACKED_BLOCK_BYTES[qt] for qt, n in specs)
    count = max(2, min(24, -(-192_000_000 // nbytes)))
    rws = [tuple(G.repack(random_raw(qt, n, k, gen), qt, n, k) for qt, n in specs) for _ in range(count)]
    return [r[0] if len(r) == 1 else r for r in rws], nbytes, count


def _split(n, k, bn, target):
    tiles = -(-n // bn)
    return 1 if tiles >= target else max(1, min(k // 256, -(-target // tiles), 32))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    ap.add_argument("--budget-s", type=float, default=150.0)
    ap.add_argument("--calls", type=int, default=48)
    ap.add_argument("--shapes", default="", help="comma list of shape labels (default: all)")
    ap.add_argument("--wide", action="store_true", help="the wider candidate set")
    ap.add_argument("--small", action="store_true",
                    help="the small models' shapes (SMALL) instead of the 7B's (with --gluon too: the Gluon kernel "
                         "on rows under the shape rule's floor)")
    ap.add_argument("--l2", action="store_true",
                    help="only each shape's table config, three ways: cold (rotating copies), warm (one copy, "
                         "in L2 when it fits) and chained with each call prefetching the next copy into L2 "
                         "(ops/cuda/l2_prefetch.py)")
    ap.add_argument("--gluon", action="store_true",
                    help="the Gluon kernel (ops/cuda/gemv_q8_gluon.py) per config beside the Triton kernel's table "
                         "config; --table PATH writes the best Gluon config per shape there")
    ap.add_argument("--table", default=None)
    ap.add_argument("--pdl", action="store_true",
                    help="--gluon: every call launched with PDL (each waits for the one before, its first "
                         "loads in flight before the wait), as in the graphed decode step: the time a "
                         "launch adds to a chain, not a back-to-back launch's own time")
    args = ap.parse_args(argv)
    if args.l2:
        return l2_modes(args)
    if args.gluon:
        return gluon_sweep(args)
    cands, targets = (WIDE, WIDE_TARGETS) if args.wide else (CANDIDATES, TARGETS)
    want = set(args.shapes.split(",")) if args.shapes else None
    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    ws = G.GemvWorkspace("cuda")
    res = {"gpu": torch.cuda.get_device_name(), "rows": [], "best": {}}
    for label, qt, n, k in SMALL if args.small else SHAPES:
        if want and label not in want:
            continue
        rws, rp_bytes, copies = _copies([(qt, n)], k, gen)
        dense = torch.empty(n, k, device="cuda", dtype=torch.float32)
        G.dequantize_into(rws[0], dense)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        q8 = Q.quantize(x)
        ref = x.float() @ dense.T
        calls = max(copies, args.calls)

        def err(y):
            return float((y.float() - ref).norm() / ref.norm())

        def row(kind, cfg, t, e):
            r = {"shape": label, "type": NAME[qt], "n": n, "k": k, "kernel": kind, "config": cfg, "us": t * 1e6,
                 "gbps": rp_bytes / t / 1e9, "pct_copy_bw": 100 * rp_bytes / t / COPY_BW, "rel_err": e}
            res["rows"].append(r)
            print(f"{label:8s} {NAME[qt]} {n:6d}x{k:<6d} {kind:5s} {str(cfg):28s} {t*1e6:8.1f} us {r['gbps']:6.0f} GB/s "
                  f"({r['pct_copy_bw']:.0f}%) err {e:.1e}", flush=True)
            return r

        t = graph_time([lambda i=i: G.gemv(x, rws[i % copies], ws=ws) for i in range(calls)])
        a = row("bf16", "table", t, err(G.gemv(x, rws[0], ws=ws)))
        best = None
        for bn, bb, w, pf in cands:
            for target in targets:
                if time.time() - t0 > args.budget_s:
                    break
                cfg = (bn, bb, _split(n, k, bn, target), w, pf)
                try:
                    t = graph_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], config=cfg, ws=ws) for i in range(calls)])
                    r = row("q8", list(cfg), t, err(Q.gemv_q8(q8, rws[0], config=cfg, ws=ws)))
                except Exception as e:  # noqa: BLE001 -- record and go on
                    print(f"config {cfg} failed: {e!r}"[:300], flush=True)
                    continue
                if r["rel_err"] > 3e-2:
                    print("WRONG RESULT", flush=True)
                    continue
                if best is None or r["us"] < best["us"]:
                    best = r
        tq = graph_time([lambda: Q.quantize(x) for _ in range(calls)])
        print(f"   quantize row of {k}: {tq*1e6:.1f} us", flush=True)
        if best:
            res["best"][f"{NAME[qt]} {n}x{k}"] = {"config": best["config"], "us": best["us"], "gbps": best["gbps"],
                                                 "bf16_us": a["us"], "bf16_gbps": a["gbps"], "quant_us": tq * 1e6,
                                                 "rel_err": best["rel_err"]}
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        del rws, dense
    print(json.dumps({"configs": {k: v["config"] for k, v in res["best"].items()}}))
    print("\n| shape | type | bf16 GEMV GB/s | q8 GEMV GB/s | % of 4.1 TB/s | quantize us | rel err vs bf16 x | config |")
    print("|---|---|---|---|---|---|---|---|")
    for key, b in res["best"].items():
        print(f"| {key} | | {b['bf16_gbps']:.0f} | {b['gbps']:.0f} | {100 * b['gbps'] * 1e9 / COPY_BW:.0f} | "
              f"{b['quant_us']:.1f} | {b['rel_err']:.1e} | {b['config']} |")
    return 0


# Gluon candidates: (BN, BB, warps, prefetch) x split targets (programs; 72-96 registers: 5-7 per SM)
GLUON = [(32, 2, 4, True), (64, 2, 4, True), (32, 1, 4, True), (64, 1, 4, True), (16, 2, 2, True), (64, 2, 8, True),
         (128, 1, 8, True)]
GLUON_TARGETS = [462, 924, 1848]
# --wide: whole or half K per program in one or two steps, every load in flight at once (the small shapes)
GLUON_WIDE = [(8, 16, 4, False), (16, 16, 8, False), (16, 8, 4, False), (32, 8, 8, False), (32, 4, 4, False),
              (16, 4, 2, False), (32, 2, 4, True), (16, 2, 2, True), (32, 4, 4, True), (16, 8, 4, True)]
GLUON_WIDE_TARGETS = [462, 924]


def _gluon_shapes(want, small: bool = False):
    """(label, key, segment specs [(qtype, n)], k): the 7B shapes (or with small the SMALL ones), plus q/k
    in Q4_K with a Q6_K v in one launch (the layers whose attn_v is Q6_K; the same table key as the
    all-Q4_K q/k/v)."""
    out = []
    for label, qt, n, k in SMALL if small else SHAPES:
        if not want or label in want:
            out.append((label, f"{NAME[qt]} {n}x{k}", [(qt, n)], k))
        if label == "qkv" and (not want or "qkv_mixed" in want):
            out.append(("qkv_mixed", f"{NAME[qt]} {n}x{k}", [(qt, n - 512), (14, 512)], k))
    return out


def gluon_sweep(args) -> int:
    from minfer.ops.cuda import gemv_q8_gluon as GL

    t0 = time.time()
    gen = torch.Generator(device="cuda").manual_seed(0)
    want = set(args.shapes.split(",")) if args.shapes else None
    cands, targets = (GLUON_WIDE, GLUON_WIDE_TARGETS) if args.wide else (GLUON, GLUON_TARGETS)
    pdl = 1 if args.pdl else 0
    res = {"gpu": torch.cuda.get_device_name(), "mode": "gluon", "pdl": pdl, "rows": [], "best": {}}
    for label, key, specs, k in _gluon_shapes(want, args.small):
        n = sum(nn for _, nn in specs)
        rws, rp_bytes, copies = _copies(specs, k, gen)
        segs0 = rws[0] if isinstance(rws[0], tuple) else (rws[0],)
        parts = []
        for r in segs0:
            d = torch.empty(r.n, k, device="cuda", dtype=torch.float32)
            G.dequantize_into(r, d)
            parts.append(d)
        dense = torch.cat(parts).double()
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        q8 = Q.quantize(x)
        ref = Q.dequantize_q8(q8, k).double() @ dense.T
        calls = max(copies, args.calls)
        ws = G.GemvWorkspace("cuda")
        qt0 = specs[0][0]

        def err(y):
            return float((y.double() - ref).norm() / ref.norm())

        ta = graph_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], ws=ws, pdl=pdl) for i in range(calls)])
        ea = err(Q.gemv_q8(q8, rws[0], ws=ws, out_dtype=torch.float32))
        print(f"{label:9s} {key:18s} triton {str(list(Q.config_for(qt0, n, k))):22s} "
              f"{ta * 1e6:7.1f} us {rp_bytes / ta / 1e9:6.0f} GB/s err {ea:.1e}", flush=True)
        best = None
        table = GL.config_for(qt0, n, k)
        tried = [tuple(table)] if table else []                       # the table's config, if any
        tried += [(bn, bb, _split(n, k, bn, target), w, pf) for bn, bb, w, pf in cands for target in targets]
        for cfg in dict.fromkeys(tried):                              # in order, each once
            if time.time() - t0 > args.budget_s:
                break
            try:
                t = graph_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], config=cfg, ws=ws, gluon=True, pdl=pdl)
                                for i in range(calls)])
                e = err(Q.gemv_q8(q8, rws[0], config=cfg, ws=ws, gluon=True, out_dtype=torch.float32))
            except Exception as ex:  # noqa: BLE001 -- record and go on
                print(f"config {cfg} failed: {ex!r}"[:300], flush=True)
                continue
            r = {"shape": label, "key": key, "n": n, "k": k, "config": list(cfg), "us": t * 1e6,
                 "gbps": rp_bytes / t / 1e9, "rel_err": e, "triton_us": ta * 1e6, "triton_err": ea}
            res["rows"].append(r)
            if e > max(1e-5, 2 * ea):
                print(f"  {cfg} WRONG RESULT err {e:.1e}", flush=True)
                continue
            if best is None or r["us"] < best["us"]:
                best = r
        if best:
            res["best"][label] = best
            print(f"          gluon best {str(best['config']):22s} {best['us']:7.1f} us {best['gbps']:6.0f} GB/s "
                  f"err {best['rel_err']:.1e}  ({ta * 1e6 / best['us']:.2f}x triton)", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        del rws, dense
    # per table key: the config with the least time summed over the key's shapes (q/k/v: all Q4_K and
    # with a Q6_K v), among those right on all of them; Gluon only if that sum beats Triton's
    verdict = {}
    for key in {r["key"] for r in res["rows"]}:
        rows = [r for r in res["rows"] if r["key"] == key]
        labels = {r["shape"] for r in rows}
        tri = {r["shape"]: r["triton_us"] for r in rows}
        sums = {}
        for r in rows:
            ok = r["rel_err"] <= max(1e-5, 2 * r["triton_err"])
            c = tuple(r["config"])
            sums.setdefault(c, {})[r["shape"]] = r["us"] if ok else float("inf")
        full = {c: sum(v.values()) for c, v in sums.items() if set(v) == labels}
        c = min(full, key=full.get) if full else None
        verdict[key] = c if c is not None and full[c] < sum(tri.values()) else None
        print(f"table {key}: {list(c) if verdict[key] else 'Triton'} ({full.get(c, 0):.1f} vs Triton "
              f"{sum(tri.values()):.1f} us over {sorted(labels)})", flush=True)
    if args.table:
        import os

        table = {"source": "", "configs": {}}
        if os.path.exists(args.table):
            with open(args.table) as f:
                table = json.load(f)
        for key, cfg in verdict.items():
            if cfg is None:
                table["configs"].pop(key, None)
            else:
                table["configs"][key] = list(cfg)
        table["source"] = ((table.get("source") or "") + f"; updated by minfer.bench.gemv_q8_sweep --gluon"
                           f"{' --wide' if args.wide else ''} on the {res['gpu']} for {sorted(verdict)}").lstrip("; ")
        with open(args.table, "w") as f:
            json.dump(table, f, indent=1)
    print("\n| shape | type N x K | Triton GB/s | Gluon GB/s | % of 4.1 TB/s | Gluon / Triton | config |")
    print("|---|---|---:|---:|---:|---:|---|")
    for label, b in res["best"].items():
        tg = b["gbps"] * b["us"] / b["triton_us"]
        print(f"| {label} | {b['key']} | {tg:.0f} | {b['gbps']:.0f} | {100 * b['gbps'] * 1e9 / COPY_BW:.0f} | "
              f"{b['triton_us'] / b['us']:.2f} | {b['config']} |")
    return 0


def l2_modes(args) -> int:
    """--l2: the table config per shape, cold / warm / chained prefetch (module doc of l2_prefetch)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    want = set(args.shapes.split(",")) if args.shapes else None
    res = {"gpu": torch.cuda.get_device_name(), "mode": "l2", "rows": []}
    for label, qt, n, k in SHAPES:
        if want and label not in want:
            continue
        rws, rp_bytes, copies = _copies([(qt, n)], k, gen)
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        q8 = Q.quantize(x)
        cfg = Q.config_for(qt, n, k)
        calls = max(copies, args.calls)
        ws = G.GemvWorkspace("cuda")
        cold = graph_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], ws=ws) for i in range(calls)])
        warm = graph_time([lambda: Q.gemv_q8(q8, rws[0], ws=ws) for _ in range(calls)])
        wpf = G.GemvWorkspace("cuda")
        l2 = (rp_bytes + (1 << 20), 1 << 40, False)      # every launch "small": the next copy whole
        for i in range(2 * copies):                      # learn the cycle of copies
            Q.gemv_q8(q8, rws[i % copies], ws=wpf, l2=l2)
        chained = graph_time([lambda i=i: Q.gemv_q8(q8, rws[i % copies], ws=wpf, l2=l2) for i in range(calls)])
        row = {"shape": label, "type": NAME[qt], "n": n, "k": k, "config": list(cfg), "bytes": rp_bytes,
               "cold_us": cold * 1e6, "warm_us": warm * 1e6, "chained_us": chained * 1e6}
        res["rows"].append(row)
        print(f"{label:8s} {NAME[qt]} {n:6d}x{k:<6d} {rp_bytes / 1e6:7.1f} MB  cold {cold * 1e6:7.1f} us "
              f"{rp_bytes / cold / 1e9:6.0f} GB/s  warm {warm * 1e6:7.1f} us {rp_bytes / warm / 1e9:6.0f} GB/s  "
              f"chained {chained * 1e6:7.1f} us {rp_bytes / chained / 1e9:6.0f} GB/s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(res, f, indent=1)
        del rws
    return 0


if __name__ == "__main__":
    sys.exit(main())
