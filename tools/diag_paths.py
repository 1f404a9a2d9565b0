"""Which launch paths a fixture's GPU run takes, and every fallback with its reason: the bf16 test's
flow (tests/gpu/test_arch_gpu.py test_arch_gpu_bf16_matches_cpu: a prefill of up to 30 tokens, then 4 graphed
decode steps) at the given contexts, with the decode graphs on and off.

    python tools/diag_paths.py minicpm3 --ctx 32 64
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="+")
    ap.add_argument("--ctx", type=int, nargs="+", default=[64])
    a = ap.parse_args()
    from minfer.ops import paths
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    for name in a.names:
        ids = np.load(ROOT / "tests" / "data" / "arch" / f"{name}.npz")["ids"].tolist()
        for ctx in a.ctx:
            for graph in ("1", "0"):
                sw = Switches.from_env({**os.environ, "MINFER_CUDA_GRAPH": graph})
                eng = Engine.load(ROOT / "tests" / "data" / "arch" / f"{name}.gguf", device="cuda", ctx=ctx,
                                  progress=False, switches=sw)
                paths.reset()
                n = min(30, len(ids) - 4)                # test_arch_gpu.split_ids
                eng.forward(ids[:n], 0)
                print(f"{name} ctx {ctx} graphs {graph}, prefill: {paths.snapshot()['counts']}")
                for i, tok in enumerate(ids[n:n + min(4, ctx - n)]):
                    eng.forward([tok], n + i)
                snap = paths.snapshot()
                print(f"{name} ctx {ctx} graphs {graph}: {snap['counts']}")
                for f in snap["fallbacks"]:
                    print(f"    fallback: {f}")
                for f in snap["switched_off"]:
                    print(f"    switched off: {f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
