"""Which kernel each GEMV of the graphed 7B step takes under a skip_oracle variant (issue 12): the
step captured once per variant with the timeline recorder on, then the Gluon launches it
recorded (by shape) and the launch-path counters (minfer.ops.paths) of that capture, with any
fallback. Made because the warps-along-K q/k/v variant's timeline found no q/k/v launch
(bench/results/raw/2026-12-03, call 9) while its oracle time was 50 us better: a variant that
quietly leaves the Gluon kernel must show here.
    python tools/route_check.py Q7.gguf [depth] [-- variant ...]"""
import collections
import sys

import torch

from minfer.ops import paths
from minfer.ops.cuda import timeline
from minfer.runtime.engine import Engine
from prof_decode import warm  # noqa: E402 -- tools/ is the script's directory
from skip_oracle import variant  # noqa: E402


@torch.inference_mode()
def main():
    args = sys.argv[1:]
    cut = args.index("--") if "--" in args else len(args)
    path, depths = args[0], [int(a) for a in args[1:cut]] or [16]
    names = ["base"] + [a for a in args[cut + 1:] if a != "base"]
    eng = Engine.load(path, device="cuda", ctx=4096, progress=False)
    for depth in depths:
        _, pos = warm(eng, depth)
        for name in names:
            paths.reset()
            timeline.RECORDER = rec = timeline.Recorder()
            try:
                variant(eng, pos, name)
            finally:
                timeline.RECORDER = None
            snap = paths.snapshot()
            keys = collections.Counter(k for k, _, _ in rec.launches)
            print(f"depth {depth}, {name}: Gluon launches recorded (warm-up forward + capture): {dict(keys)}")
            for p, n in sorted(snap["counts"].items()):
                if p.startswith(("gemv_q8", "qmatmul")):
                    print(f"  {p}: {n}")
            for p, n in snap["fallbacks"].items():
                print(f"  FALLBACK {p}: {n}")
            for p, n in snap["switched_off"].items():
                print(f"  OFF {p}: {n}")


if __name__ == "__main__":
    main()
