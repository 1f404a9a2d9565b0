"""Measure minfer.quants speed on one CPU core and print a markdown report.

    python -m minfer.quants.bench_cpu [--mb 100] [--repeat 3] [--quant-mfloats 4]

Dequantize: a tensor of random blocks of about --mb megabytes (input bytes) per type, best
of --repeat runs; reports input MB/s, output float32 GB/s and the time for 100 MB of input.
Quantize: --quant-mfloats million Gaussian floats per type; reports Mfloat/s and the
projected time for 100M floats. numpy's elementwise loops run on one thread, so this is a
single-core number (numpy elementwise loops are single-threaded; process CPU time is used so
that other jobs on a shared machine do not count, though they still share caches).
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from datetime import datetime, timezone

import numpy as np

DEQUANT_TYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                  "IQ4_NL", "IQ4_XS", "MXFP4"]
QUANT_TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                  "IQ4_NL", "IQ4_XS", "MXFP4"]


def _best(fn, repeat: int) -> float:
    """Best CPU seconds of this process over `repeat` runs. CPU time, not wall time: on a
    shared box the wall clock also counts the time other jobs held the core."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        best = min(best, time.process_time() - t0)
    return best


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def bench_dequantize(mb: float, repeat: int) -> list[str]:
    import gguf

    import minfer.quants as mq

    rng = np.random.default_rng(0)
    rows = ["| type | input MB | best CPU s | input MB/s | output GB/s | s per 100 MB input |", "|---|---|---|---|---|---|"]
    for name in DEQUANT_TYPES:
        qt = gguf.GGMLQuantizationType[name]
        bs, ts = mq.block_size(qt), mq.type_size(qt)
        n_blocks = int(mb * 1e6) // ts
        raw = rng.integers(0, 256, size=n_blocks * ts, dtype=np.uint8)
        if name in ("F16", "BF16", "F32"):  # keep float payloads finite (no NaN slow paths)
            vals = rng.standard_normal(n_blocks * bs).astype(np.float32)
            raw = mq.quantize(vals, qt).reshape(-1)
        shape = (n_blocks * bs,)
        dt = _best(lambda: mq.dequantize(raw, qt, shape), repeat)
        mbps = raw.nbytes / dt / 1e6
        rows.append(
            f"| {name} | {raw.nbytes / 1e6:.0f} | {dt:.3f} | {mbps:.0f} | {n_blocks * bs * 4 / dt / 1e9:.2f} | {100 / mbps:.2f} |"
        )
        del raw
    return rows


def bench_quantize(mfloats: float, repeat: int) -> list[str]:
    import gguf

    import minfer.quants as mq

    x = np.random.default_rng(1).standard_normal((int(mfloats * 1e6) // 4096, 4096)).astype(np.float32)
    rows = ["| type | Mfloat | best CPU s | Mfloat/s | s per 100M floats |", "|---|---|---|---|---|"]
    for name in QUANT_TYPES:
        qt = gguf.GGMLQuantizationType[name]
        dt = _best(lambda: mq.quantize(x, qt), repeat)
        rate = x.size / dt / 1e6
        rows.append(f"| {name} | {x.size / 1e6:.1f} | {dt:.3f} | {rate:.1f} | {100 / rate:.1f} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100.0, help="input megabytes per dequantized tensor (default 100)")
    p.add_argument("--repeat", type=int, default=3, help="runs per measurement, best one kept (default 3)")
    p.add_argument("--quant-mfloats", type=float, default=4.0, help="million floats per quantize run (default 4)")
    p.add_argument("--no-dequant", action="store_true", help="skip the dequantize table")
    p.add_argument("--no-quant", action="store_true", help="skip the quantize table")
    args = p.parse_args(argv)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"machine: {_cpu_name()}, {os.cpu_count()} cores, load average at start {load:.2f}")
    print(f"python {platform.python_version()}, numpy {np.__version__}\n")
    if not args.no_dequant:
        print(f"## dequantize (random blocks, ~{args.mb:.0f} MB input per type, best of {args.repeat})\n")
        print("\n".join(bench_dequantize(args.mb, args.repeat)), flush=True)
    if not args.no_quant:
        print(f"\n## quantize ({args.quant_mfloats:g}M Gaussian floats, rows of 4096, best of {args.repeat})\n")
        print("\n".join(bench_quantize(args.quant_mfloats, args.repeat)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
