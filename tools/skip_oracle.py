"""The most a fusion could save (issue 12): the graphed 7B decode step captured again with some
small kernels left out, their outputs frozen (the tensors of their first real call, reused),
and the graph's GPU time compared with the full step's, interleaved in rounds.

A timing oracle, not a path: the frozen outputs make the logits wrong. What it bounds: a
kernel folded into its neighbour (the RMSNorm into the next GEMV's activation load, SwiGLU into
the down GEMV's, rope + KV append into the q/k/v GEMV's epilogue) saves at most what leaving
it out saves here, and less by whatever work the neighbour takes over.
  base      the step as it is
  -norm     the add + RMSNorm + q8 kernels (2 a layer) left out
  addonly   those kernels without the norm: the residual add and q8 of the sum only (the
            norm's sum of squares computed elsewhere, e.g. in the producer's epilogue)
  -swiglu   the SwiGLU + q8 kernel left out
  -rope     the rope + KV append kernel left out
  -3        all three left out
  -combine  the decode attention's combine launch (the key splits' merge) left out: the bound for
            any way of merging the splits without that launch
  -attn     the whole decode attention (its key-split kernel and any combine) left out: the bound for
            any fold of the attention into its neighbours (e.g. o's programs computing their heads'
            attention: perf-log AN7), and what the attention costs in the step at that depth
  combine_warps:N   the combine launch at N warps a program (decode_merge.COMBINE_WARPS; 4 shipped)
  -norm_attn / -norm_ffn   only the norm before q/k/v (before gate+up) left out
  early_attn_norm / early_ffn_norm   those norms launched in PDL mode 2 (the GEMV after them may
            launch before their wait: pdl.py), a real variant (the logits are right)
and real variants, timed the same way (an in-step A/B of configs with the graph's GPU time alone):
  cfg:KEY=BN,BB,SPLIT,W[,PF[,REGS[,LATE]]]   the Gluon GEMV table with one shape's config changed (KEY as in
                               gemv_q8g_h200.json, a + for its space: Q4_K+3584x3584), via MINFER_GEMV_Q8G_TABLE
  env:X=1,Y=2                  switches changed (Engine.set_switches; bench.parse_env's rules)
  planes:KEY=T                 that shape's repacked planes in another layout for this graph (T-row tiles,
                               gemv_repack_layout.to_tiles; 0: row-major), as copies kept alive for the
                               process (a layout switch through the engine would free the planes that the
                               graphs captured before it read)
  bf16_head                    the lm head's GEMV storing bf16 and a conversion launch to float32
                               (as before 2026-12-02, third session)
  short                        the graph over the cache's first two key tiles of rows (128), as the
                               engine replays below that position (Switches.decode_short_graph)
  A&B                          variants A and B together (one table for all cfg: parts)
    python tools/skip_oracle.py Q7.gguf [depth ...] [-- variant ...] [--profile] [--check]
(default depths 16 3354; default variants base -norm addonly -swiglu -rope -3). --profile: also
each variant's graph replayed once under torch's profiler, in prof_decode's chain view (what each
kernel adds to the step's end), to see which kernel a variant slows down. --check: each variant's
graph replayed once and synchronised right after its capture, its name printed before (a CUDA fault
names the variant that made it; 2026-12-05's H100 call died in the timing loop unnamed)."""
import importlib
import json
import statistics
import sys

import torch

from minfer import ops
from minfer.bench.bench import parse_env
from minfer.models.base import Step
from minfer.ops.cuda import decode_merge, gemv_q8_gluon, q8_rows
from minfer.ops.cuda.attention import one_split_rows
from minfer.runtime.engine import Engine
from prof_decode import print_chain, warm  # noqa: E402 -- tools/ is the script's directory

attn_mod = importlib.import_module("minfer.ops.cuda.attention")   # (the package exports a function of that name)


def frozen(fn):
    """fn with its result of the first call per input shape returned again (no launch)."""
    memo = {}

    def f(*a, **k):
        key = tuple(tuple(t.shape) for t in a if isinstance(t, torch.Tensor))
        if key not in memo:
            memo[key] = fn(*a, **k)
        return memo[key]
    return f


def add_only(x, y, weight, eps, out_dtype, interpret=False, pdl=False, one_pass=True, preload=True):
    return q8_rows._q8_launch(x, y, None, None, eps, out_dtype, interpret, pdl=pdl)


def capture(eng, pos: int, rows: int = 0):
    model, ctx = eng.model, eng.ctx
    cache = eng.cache.rows_view(rows) if rows else eng.cache
    inp = torch.tensor([1, pos], dtype=torch.int64, device=model.device)

    def fwd():
        return model.forward(inp[0:1], Step(inp[1:2], None, "all"), cache, ctx)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fwd()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fwd()
    torch.cuda.synchronize()
    return g


def bf16_head(linear):
    """ops.linear with the lm head's float32 request made the old way: the GEMV's bf16 output,
    then a conversion launch (the variant bf16_head)."""
    def f(x, w, bias=None, ctx=None, out_dtype=None):
        out = linear(x, w, bias, ctx)
        return out if out_dtype is None else out.to(out_dtype)
    return f


def only(fn, weights):
    """fn frozen for the calls whose norm weight is one of `weights`, the real fn for the others."""
    ptrs = {w.data_ptr() for w in weights}
    fz = frozen(fn)

    def f(x, y, weight, *a, **k):
        return (fz if weight.data_ptr() in ptrs else fn)(x, y, weight, *a, **k)
    return f


def early(fn, weights):
    """fn launched in PDL mode 2 (the next kernel may launch before its wait) for the calls whose
    norm weight is one of `weights`."""
    ptrs = {w.data_ptr() for w in weights}

    def f(x, y, weight, *a, **k):
        if weight.data_ptr() in ptrs and k.get("pdl"):
            k["pdl"] = 2
        return fn(x, y, weight, *a, **k)
    return f


def each_variant(argv: list, default_depths=(16,)):
    """(eng, depth, pos, name) over the command line `Q7.gguf [depth ...] [-- variant ...]` of the
    tools that walk variants one at a time (gemv_timeline, route_check): the engine loaded once,
    each depth warmed (prof_decode.warm), base first."""
    cut = argv.index("--") if "--" in argv else len(argv)
    depths = [int(a) for a in argv[1:cut]] or list(default_depths)
    names = ["base"] + [a for a in argv[cut + 1:] if a != "base"]
    eng = Engine.load(argv[0], device="cuda", ctx=4096, progress=False)
    for depth in depths:
        _, pos = warm(eng, depth)
        for name in names:
            yield eng, depth, pos, name


def table_with(changes: dict) -> str:
    """A copy of the shipped Gluon GEMV table with the configs of `changes` (key -> "BN,BB,...")
    replaced; its path."""
    with open(gemv_q8_gluon._TABLE) as f:
        t = json.load(f)
    for key, cfg in changes.items():
        vals = [int(v) for v in cfg.split(",")]
        if len(vals) >= 5:
            vals[4] = vals[4] if vals[4] >= 2 else bool(vals[4])
        t["configs"][key] = vals
    path = f"/tmp/oracle-table-{abs(hash(tuple(sorted(changes.items()))))}.json"
    with open(path, "w") as f:
        json.dump(t, f)
    return path


def variant(eng, pos: int, name: str):
    """The graph of variant `name`: one of the module doc's, or several joined by & (e.g.
    -norm_ffn&env:MINFER_PDL_LATE=2; the cfg: parts make one table)."""
    real_norm, real_swiglu = q8_rows.add_rms_norm_q8, q8_rows.swiglu_q8
    real_linear = ops.linear
    real_merge = attn_mod.merge
    real_attn = attn_mod.decode_attention
    real_cw = decode_merge.COMBINE_WARPS
    base_sw = eng.switches
    swapped = []
    try:
        env, cfgs, lay = {}, {}, {}
        for part in name.split("&"):
            _apply(eng, part, env, cfgs, lay)
        if cfgs:
            env["MINFER_GEMV_Q8G_TABLE"] = table_with(cfgs)
        if env:
            # a table or MINFER_GEMV_TILES change may re-lay planes (plane_layout): the graphs
            # captured before must keep reading live planes, so the current ones stay referenced
            KEEP.extend(w.repacked for w in eng.model.qweights() if getattr(w, "repacked", None) is not None)
            eng.set_switches(base_sw.with_env(env))
        swapped = relayout(eng, lay)
        rows = one_split_rows(eng.config.head_dim) if "short" in name.split("&") else 0
        if rows and pos >= rows:
            print(f"(variant {name} left out at position {pos}: past the short graph's {rows} rows)")
            return None
        return capture(eng, pos, rows)
    finally:
        for w, rw in swapped:
            w.repacked = rw
        q8_rows.add_rms_norm_q8, q8_rows.swiglu_q8 = real_norm, real_swiglu
        ops.linear = real_linear
        attn_mod.merge = real_merge
        attn_mod.decode_attention = real_attn
        decode_merge.COMBINE_WARPS = real_cw
        eng.cache.__dict__.pop("write_rotated", None)
        KEEP.extend(w.repacked for w in eng.model.qweights() if getattr(w, "repacked", None) is not None)
        eng.set_switches(base_sw)


KEEP = []      # planes some captured graph reads (planes: copies; planes an env variant re-laid): kept alive


def relayout(eng, lay: dict) -> list:
    """planes: parts -- each weight of a listed shape (its own planes, not a fused group's view)
    given a copy of its planes in that layout; returns [(weight, its planes before)]."""
    from minfer.ops.cuda import plane_layout
    from minfer.ops.cuda.gemv_repack_layout import REPACKED_TYPES, planes_of, to_rows, to_tiles

    out = []
    for w in eng.model.qweights():
        rw = planes_of(w)
        if rw is None or not plane_layout._owns_planes(rw):
            continue
        t = lay.get(f"{REPACKED_TYPES[rw.qtype]} {rw.n}x{rw.k}")
        if t is None or t == rw.tile_rows:
            continue
        new = to_rows(rw)
        new = to_tiles(new, t) if t else new
        KEEP.append(new)
        out.append((w, rw))
        w.repacked = new
    return out


def _apply(eng, name: str, env: dict, cfgs: dict, lay: dict):
    """One part of a variant: patches the kernels left out, or adds to its env / table changes."""
    real_norm, real_swiglu = q8_rows.add_rms_norm_q8, q8_rows.swiglu_q8
    blocks = eng.model.blocks
    if name in ("-norm", "-3"):
        q8_rows.add_rms_norm_q8 = frozen(real_norm)
    if name == "-norm_attn":
        q8_rows.add_rms_norm_q8 = only(real_norm, [b.attn_norm for b in blocks[1:]])
    if name == "-norm_ffn":
        q8_rows.add_rms_norm_q8 = only(real_norm, [b.ffn_norm for b in blocks])
    if name == "early_attn_norm":
        q8_rows.add_rms_norm_q8 = early(real_norm, [b.attn_norm for b in blocks[1:]])
    if name == "early_ffn_norm":
        q8_rows.add_rms_norm_q8 = early(real_norm, [b.ffn_norm for b in blocks])
    if name == "addonly":
        q8_rows.add_rms_norm_q8 = add_only
    if name in ("-swiglu", "-3"):
        q8_rows.swiglu_q8 = frozen(real_swiglu)
    if name in ("-rope", "-3"):
        eng.cache.write_rotated = lambda layer, q, k, v, step, rope, ctx=None: q
    if name.startswith("combine_warps:"):
        decode_merge.COMBINE_WARPS = int(name.split(":")[1])
    if name == "-combine":
        attn_mod.merge = frozen(attn_mod.merge)
    if name == "-attn":       # attention() calls this module global (ops/cuda/attention.py)
        attn_mod.decode_attention = frozen(attn_mod.decode_attention)
    if name == "bf16_head":
        ops.linear = bf16_head(ops.linear)
    if name.startswith("cfg:"):
        key, cfg = name[4:].replace("+", " ").split("=")
        cfgs[key] = cfg
    if name.startswith("env:"):
        env.update(parse_env(name[4:]))
    if name.startswith("planes:"):
        key, t = name[7:].replace("+", " ").split("=")
        lay[key] = int(t)


def profile_graph(g):
    """One replay of g under torch's profiler: its kernels sorted by start."""
    from torch.profiler import ProfilerActivity, profile

    g.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        g.replay()
        torch.cuda.synchronize()
    return sorted([e for e in prof.events() if e.device_type.name == "CUDA"], key=lambda e: e.time_range.start)


def time_graph(g, n: int = 20) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    out = []
    for _ in range(n):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        out.append(e0.elapsed_time(e1) * 1e3)
    return statistics.median(out)


@torch.inference_mode()
def main():
    path = sys.argv[1]
    args = [a for a in sys.argv[2:] if a not in ("--profile", "--check")]
    prof = "--profile" in sys.argv[2:]
    cut = args.index("--") if "--" in args else len(args)
    depths = [int(a) for a in args[:cut]] or [16, 3354]
    names = ["base"] + [a for a in args[cut + 1:] if a != "base"] if cut < len(args) else \
        ["base", "-norm", "addonly", "-swiglu", "-rope", "-3"]
    eng = Engine.load(path, device="cuda", ctx=4096, progress=False)
    for depth in depths:
        _, pos = warm(eng, depth)
        graphs = {}
        check = "--check" in sys.argv[2:]
        for k in names:
            if check:   # a variant that faults is named: the fault kills the process after this line
                print(f"(capturing {k} at depth {depth} ...)", flush=True)
            graphs[k] = variant(eng, pos, k)
            if graphs[k] is not None and check:
                graphs[k].replay()
                torch.cuda.synchronize()
                print(f"(replayed {k} once: ok)", flush=True)
        names_d = [k for k in names if graphs[k] is not None]
        res = {k: [] for k in names_d}
        for _ in range(7):
            for k in names_d:
                res[k].append(time_graph(graphs[k]))
        base = statistics.median(res["base"])
        print(f"depth {depth}: graph on the GPU, us (median of 7 rounds x 20 replays)")
        print("| variant | us | saved vs base, us | base/variant |")
        print("|---|---:|---:|---:|")
        for k in names_d:
            m = statistics.median(res[k])
            sd = statistics.stdev(res[k])
            print(f"| {k} | {m:.0f} (sd {sd:.0f}) | {base - m:.0f} | {base / m:.3f} |")
        if prof:
            for k in names_d:
                print(f"depth {depth}, {k}: one replay under the profiler")
                print_chain(profile_graph(graphs[k]))
        del graphs


if __name__ == "__main__":
    main()
