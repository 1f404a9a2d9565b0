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
from skip_oracle import each_variant, variant  # noqa: E402 -- tools/ is the script's directory


@torch.inference_mode()
def main():
    for eng, depth, pos, name in each_variant(sys.argv[1:]):
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
