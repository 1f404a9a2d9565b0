"""How the Gluon decode GEMVs' programs fill the H200 in the graphed 7B step (issue 12): each
program's start, end and SM (ops/cuda/timeline.py's stamps), per variant of skip_oracle.py.

Why: leaving out the norm before gate+up, or changing the o GEMV's config, makes the step
0.4-0.6 ms slower (perf-log W2, X1), far more than either kernel costs. This shows, per GEMV of
the middle layers: its programs, the SMs they ran on, the most that ran at once on one SM, how
many started only after another of the same launch had ended (a second wave), and its span
against the GEMV before it (start of the first program minus end of the last one before it).
The stamps are the GPU's global timer (ns); the GEMVs in between (norm, rope, attention...) are
not stamped.
    python tools/gemv_timeline.py Q7.gguf [depth] [-- variant ...]   (skip_oracle's variants)"""
import statistics
import sys

import torch

from minfer.ops.cuda import timeline
from minfer.runtime.engine import Engine
from prof_decode import warm  # noqa: E402 -- tools/ is the script's directory
from skip_oracle import variant  # noqa: E402

KINDS = ["qkv", "o", "gate+up", "down"]


def record(eng, pos: int, name: str):
    """The variant's graph captured with stamps, replayed 3 times: [(key, grid, stamps (P, 3) int64)]."""
    timeline.RECORDER = rec = timeline.Recorder()
    try:
        g = variant(eng, pos, name)
    finally:
        timeline.RECORDER = None
    launches = rec.launches[len(rec.launches) // 2:]       # the eager warm-up forward's half first
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    return [(k, grid, b.view(-1, 4)[:, :3].cpu()) for k, grid, b in launches]


def max_resident(st) -> int:
    """The most programs of one launch running at once on one SM."""
    best = 0
    for sm in st[:, 2].unique():
        iv = st[st[:, 2] == sm]
        ev = sorted([(int(a), 1) for a in iv[:, 0]] + [(int(b), -1) for b in iv[:, 1]], key=lambda e: (e[0], e[1]))
        cur = 0
        for _, d in ev:
            cur += d
            best = max(best, cur)
    return best


def describe(launches, layers):
    """Per GEMV kind, over `layers`: medians of programs, SMs, max resident per SM, second-wave
    programs, span (us), gap after the previous GEMV's last end (us), program duration p50/p90."""
    rows = {k: [] for k in KINDS}
    for li in layers:
        for j, kind in enumerate(KINDS):
            i = 4 * li + j
            st = launches[i][2]
            prev = launches[i - 1][2]
            t0, t1 = int(st[:, 0].min()), int(st[:, 1].max())
            first_end = int(st[:, 1].min())
            dur = (st[:, 1] - st[:, 0]).float()
            rows[kind].append(dict(
                progs=st.shape[0], sms=int(st[:, 2].unique().numel()), res=max_resident(st),
                wave2=int((st[:, 0] > first_end).sum()), span=(t1 - t0) / 1e3,
                gap=(t0 - int(prev[:, 1].max())) / 1e3, last_start=(int(st[:, 0].max()) - t0) / 1e3,
                p50=float(dur.median()) / 1e3, p90=float(dur.quantile(0.9)) / 1e3))
    print("| GEMV | programs | SMs | max/SM | 2nd wave | span us | gap us | last start us | prog p50 / p90 us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for kind, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        print(f"| {kind} | {med['progs']:.0f} | {med['sms']:.0f} | {med['res']:.0f} | {med['wave2']:.0f} | "
              f"{med['span']:.2f} | {med['gap']:+.2f} | {med['last_start']:.2f} | {med['p50']:.2f} / {med['p90']:.2f} |")
    layer = (int(launches[4 * layers[-1] + 4][2][:, 0].min()) - int(launches[4 * layers[0]][2][:, 0].min())) / 1e3
    print(f"  layers {layers[0]}..{layers[-1]}: {layer / len(layers):.2f} us a layer (qkv start to qkv start)")


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
            launches = record(eng, pos, name)
            assert len(launches) == 4 * len(eng.model.blocks) + 1, [k for k, _, _ in launches]
            print(f"depth {depth}, {name}: {len(launches)} GEMV launches a step")
            describe(launches, list(range(4, len(eng.model.blocks) - 4)))


if __name__ == "__main__":
    main()
