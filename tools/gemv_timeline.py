"""How the Gluon decode GEMVs' programs fill the H200 in the graphed 7B step (issue 12): each
program's start, end and SM (ops/cuda/timeline.py's stamps), per variant of skip_oracle.py.

Why: leaving out the norm before gate+up, or changing the o GEMV's config, makes the step
0.4-0.6 ms slower (perf-log W2, X1), far more than either kernel costs. This shows, per GEMV of
the middle layers: its programs, the SMs they ran on, the most that ran at once on one SM, how
many started only after another of the same launch had ended (a second wave), and its span
against the GEMV before it (start of the first program minus end of the last one before it), and
per weight type (q/k/v with a Q6_K v, the Q4_K and Q6_K downs) and for the lm head the weight
bytes over the time from the release to the last program's end (the per-shape table).
The stamps are the GPU's global timer (ns); the GEMVs in between (norm, rope, attention...) are
not stamped.
    python tools/gemv_timeline.py Q7.gguf [depth] [-- variant ...]   (skip_oracle's variants)"""
import statistics
import sys

import gguf
import torch

from minfer.ops.cuda import timeline
from skip_oracle import each_variant, variant  # noqa: E402 -- tools/ is the script's directory

KINDS = ["qkv", "o", "gate+up", "down"]


def record(eng, pos: int, name: str):
    """The variant's graph captured with stamps, replayed 3 times: [(key, grid, stamps (P, 4))]:
    per program start, end, SM, past its PDL wait (ns)."""
    timeline.RECORDER = rec = timeline.Recorder()
    try:
        g = variant(eng, pos, name)
    finally:
        timeline.RECORDER = None
    launches = rec.launches[len(rec.launches) // 2:]       # the eager warm-up forward's half first
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    return [(k, grid, valid(b.view(-1, 4).cpu(), k)) for k, grid, b in launches]


def valid(st, key: str):
    """The programs whose four stamps look written (an SM below 1024, times in order): a program
    that did not stamp leaves torch.empty's bytes, which once made an SM number of 4e18."""
    ok = (st[:, 2] >= 0) & (st[:, 2] < 1024) & (st[:, 0] > 0) & (st[:, 0] <= st[:, 3]) & (st[:, 3] <= st[:, 1])
    if not bool(ok.all()):
        why = {"SM": ~((st[:, 2] >= 0) & (st[:, 2] < 1024)), "start": ~(st[:, 0] > 0),
               "start>release": st[:, 0] > st[:, 3], "release>end": st[:, 3] > st[:, 1]}
        print(f"  ({key}: {int((~ok).sum())} of {st.shape[0]} programs without valid stamps, left out: "
              + ", ".join(f"{k} {int(v.sum())}" for k, v in why.items() if bool(v.any())) + ")")
    return st[ok]


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


def stats(st, prev) -> dict:
    """One launch: its programs against its first release from the PDL wait (w0)."""
    w0 = int(st[:, 3].min())
    work = (st[:, 1] - st[:, 3]).float() / 1e3
    return dict(progs=st.shape[0], sms=int(st[:, 2].unique().numel()), res=max_resident(st),
                wave2=int((st[:, 0] > int(st[:, 1].min())).sum()),
                release=(w0 - int(prev[:, 1].max())) / 1e3,            # previous GEMV's end -> this one's release
                lead=(w0 - int(st[:, 0].min())) / 1e3,                 # launched this long before its release
                span=(int(st[:, 1].max()) - w0) / 1e3,                 # release -> last program's end
                p50=float(work.median()), p90=float(work.quantile(0.9)), max=float(work.max()))


def stragglers(st, n: int = 6) -> str:
    """The n programs that end last: (program, SM, programs on that SM, start / release / end in us
    from the launch's first release)."""
    w0 = int(st[:, 3].min())
    per_sm = torch.bincount(st[:, 2], minlength=256)
    out = []
    for i in st[:, 1].argsort(descending=True)[:n].tolist():
        a, b, sm, w = (int(v) for v in st[i])
        out.append(f"#{i} sm{sm}x{int(per_sm[sm])} {(a - w0) / 1e3:+.1f}/{(w - w0) / 1e3:+.1f}/{(b - w0) / 1e3:.1f}")
    return ", ".join(out)


def file_bytes(w) -> int:
    """The file's bytes of a weight (the gguf package's block size and bytes per block)."""
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(w.qtype)]
    return w.shape[0] * w.shape[1] // block * nbytes


def layer_weights(blk) -> dict:
    """{kind: (label with the types, the file's bytes of its weights)} of one block."""
    def nb(*ws):
        return sum(file_bytes(w) for w in ws)

    def t(w):
        return {12: "Q4_K", 14: "Q6_K"}.get(w.qtype, str(w.qtype))
    qkv = "qkv" + (f" (v {t(blk.attn_v)})" if blk.attn_v.qtype != blk.attn_q.qtype else "")
    return {"qkv": (qkv, nb(blk.attn_q, blk.attn_k, blk.attn_v)), "o": ("o", nb(blk.attn_output)),
            "gate+up": ("gate+up", nb(blk.ffn_gate, blk.ffn_up)),
            "down": (f"down {t(blk.ffn_down)}", nb(blk.ffn_down))}


def describe(launches, layers, blocks=None, head=None):
    """Per GEMV kind (and weight types, with `blocks`), medians over `layers`, and the
    last-ending programs of the middle layer. With `blocks`, also the weight bytes over the
    release-to-last-end time (the GEMV's own time once its input exists); `head`: the lm head's
    weight, for a row of the step's last launch."""
    rows, size = {}, {}
    for li in layers:
        labels = layer_weights(blocks[li]) if blocks is not None else {k: (k, 0) for k in KINDS}
        for j, kind in enumerate(KINDS):
            i = 4 * li + j
            label, nbytes = labels[kind]
            if launches[i][2].shape[0] == 0 or launches[i - 1][2].shape[0] == 0:
                print(f"  (layer {li} {kind}: no valid stamps here or in the launch before; left out)")
                continue
            rows.setdefault(label, []).append(stats(launches[i][2], launches[i - 1][2]))
            size[label] = nbytes
    print("| GEMV | layers | programs | SMs | max/SM | 2nd wave | release after the GEMV before, us | launched before "
          "release, us | release to last end, us | after release p50 / p90 / max, us | MB | GB/s from the release |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    if head is not None:      # the step's last GEMV launch: the lm head, after the last layer's down
        rows["lm head"] = [stats(launches[-1][2], launches[-2][2])]
        size["lm head"] = file_bytes(head)
    for label, rs in rows.items():
        if not rs:
            continue
        m = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
        gbs = f"{size[label] / m['span'] / 1e3:,.0f}" if size[label] and m["span"] > 0 else "-"
        print(f"| {label} | {len(rs)} | {m['progs']:.0f} | {m['sms']:.0f} | {m['res']:.0f} | {m['wave2']:.0f} | "
              f"{m['release']:+.2f} | {m['lead']:.2f} | {m['span']:.2f} | {m['p50']:.2f} / {m['p90']:.2f} / "
              f"{m['max']:.2f} | {size[label] / 1e6:.2f} | {gbs} |")
    mid = layers[len(layers) // 2]
    for j, kind in enumerate(KINDS):
        if launches[4 * mid + j][2].shape[0]:
            print(f"  layer {mid} {kind}, last to end: {stragglers(launches[4 * mid + j][2])}")
    layer = (int(launches[4 * layers[-1] + 4][2][:, 3].min()) - int(launches[4 * layers[0]][2][:, 3].min())) / 1e3
    print(f"  layers {layers[0]}..{layers[-1]}: {layer / len(layers):.2f} us a layer (q/k/v release to release)")


@torch.inference_mode()
def main():
    for eng, depth, pos, name in each_variant(sys.argv[1:]):
        launches = record(eng, pos, name)
        assert len(launches) == 4 * len(eng.model.blocks) + 1, [k for k, _, _ in launches]
        print(f"depth {depth}, {name}: {len(launches)} GEMV launches a step")
        describe(launches, list(range(4, len(eng.model.blocks) - 4)), eng.model.blocks, eng.model.output)


if __name__ == "__main__":
    main()
