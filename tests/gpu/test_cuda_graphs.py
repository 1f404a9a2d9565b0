"""The CUDA-graph decode step computes what the eager engine computes."""

from __future__ import annotations

from minfer.switches import Switches

import pytest
import torch

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch,recipe", [("qwen2", "q4_k_m"), ("llama", "q8_0")])
def test_graph_decode_matches_eager(tmp_path, monkeypatch, arch, recipe):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.cuda_graphs import DecodeGraph
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch=arch)
    path = tmp_path / "m.gguf"
    write_synth(path, p, recipe, seed=2, progress=False)
    eager = Engine.load(str(path), device="cuda", ctx=128, progress=False,
                        switches=Switches(cuda_graph=False))     # the engine's own decode: eager
    graphed = Engine.load(str(path), device="cuda", ctx=128, progress=False)
    prompt = torch.randint(0, p.vocab, (9,), generator=torch.Generator().manual_seed(1)).tolist()
    le = eager.forward(prompt, 0)[-1]
    lg = graphed.forward(prompt, 0)[-1]
    g = DecodeGraph(graphed.model, graphed.cache, graphed.ctx)
    paths.reset()
    te, tg = int(le.argmax()), int(lg.argmax())
    for step in range(24):
        pos = len(prompt) + step
        le = eager.forward([te], pos)[-1]
        lg = g.step(tg, pos)[-1].cpu()
        assert tg == te
        rel = float((lg.double() - le.double()).norm() / le.double().norm())
        assert rel < 1e-4, (step, rel)
        te, tg = int(le.argmax()), int(lg.argmax())
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.capture"] == 1 and counts["graph.decode.replay"] == 24


def test_engine_decode_uses_graph_and_matches_eager(tmp_path, monkeypatch):
    """Engine.forward of one token replays the captured graph by default; MINFER_CUDA_GRAPH=0
    runs it eagerly; both give the same logits and greedy tokens."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=3, progress=False)
    a = Engine.load(str(path), device="cuda", ctx=96, progress=False)
    b = Engine.load(str(path), device="cuda", ctx=96, progress=False, switches=Switches(cuda_graph=False))
    prompt = torch.randint(0, p.vocab, (11,), generator=torch.Generator().manual_seed(2)).tolist()
    ta = tb = int(a.prefill(prompt).argmax())
    assert int(b.prefill(prompt).argmax()) == ta
    paths.reset()
    for step in range(16):
        la = a.forward([ta], len(prompt) + step)[-1]
        lb = b.forward([tb], len(prompt) + step)[-1]
        assert float((la - lb).norm() / lb.norm()) < 1e-4
        ta, tb = int(la.argmax()), int(lb.argmax())
        assert ta == tb
    snap = paths.snapshot()["counts"]
    assert snap["graph.decode.replay"] == 16
    # io graphs (Switches.graph_io): `la` holds the last step's tensor during the next call, so the
    # steps alternate between the two io slots, one capture each
    assert snap["graph.decode.replay.io"] == 16
    assert snap["graph.decode.capture"] == snap["graph.decode.capture.io"] == 2


def _tiny_pair(tmp_path, seed: int, switches_b, switches_a=None, ctx: int = 96):
    """(preset, engine with switches_a (None: the defaults), engine with switches_b) on one
    synthetic tiny qwen2 file, both on CUDA with a `ctx`-token context."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=seed, progress=False)
    a = Engine.load(str(path), device="cuda", ctx=ctx, progress=False, switches=switches_a)
    b = Engine.load(str(path), device="cuda", ctx=ctx, progress=False, switches=switches_b)
    return p, a, b


def test_pinned_io_gives_the_same_logits_and_keeps_each_step(tmp_path):
    """MINFER_PINNED_IO (token and position in one copy from pinned memory, logits into a new
    pinned tensor) decodes bit for bit what two fill kernels and a pageable copy decode, and a
    returned logits tensor is not overwritten by the steps after it."""
    p, a, b = _tiny_pair(tmp_path, 4, Switches(pinned_io=False))
    assert a.switches.pinned_io
    prompt = torch.randint(0, p.vocab, (7,), generator=torch.Generator().manual_seed(5)).tolist()
    ta = tb = int(a.prefill(prompt).argmax())
    assert int(b.prefill(prompt).argmax()) == ta
    kept = []
    for step in range(20):
        la = a.forward([ta], len(prompt) + step)[-1]
        lb = b.forward([tb], len(prompt) + step)[-1]
        assert la.device.type == "cpu" and la.dtype == torch.float32
        assert torch.equal(la, lb), step
        kept.append((la, la.clone()))
        ta, tb = int(la.argmax()), int(lb.argmax())
    assert all(torch.equal(x, y) for x, y in kept)
    assert len({x.data_ptr() for x, _ in kept}) == len(kept)     # each step its own tensor


@pytest.mark.parametrize("t", [33, 100, 128, 333])
def test_prefill_graph_matches_eager(tmp_path, monkeypatch, t):
    """A short prompt's prefill replays a graph of its padded length; it gives the eager
    prefill's logits and the same greedy continuation (decode after a padded prefill)."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=6, progress=False)
    a = Engine.load(str(path), device="cuda", ctx=512, progress=False)
    b = Engine.load(str(path), device="cuda", ctx=512, progress=False, switches=Switches(prefill_graph=False))
    g = torch.Generator().manual_seed(t)
    paths.reset()
    for rep in range(2):                                   # capture, then replay
        ids = torch.randint(0, p.vocab, (t,), generator=g).tolist()
        la = a.prefill(ids)
        lb = b.prefill(ids)
        assert float((la - lb).norm() / lb.norm()) < 1e-2
        ta, tb = int(la.argmax()), int(lb.argmax())
        assert ta == tb
        for step in range(6):
            la = a.forward([ta], t + step)[-1]
            lb = b.forward([tb], t + step)[-1]
            ta, tb = int(la.argmax()), int(lb.argmax())
            assert ta == tb
        a.reset(); b.reset()
    snap = paths.snapshot()["counts"]
    assert snap["graph.prefill.capture"] == 1 and snap["graph.prefill.replay"] == 2


def test_logits_buffer_reused_only_when_let_go(tmp_path):
    """Switches.graph_host_reuse: a step whose caller dropped the previous logits writes the same
    pinned tensor again (counted graph.decode.logits_reused); a kept tensor, a kept row of it or
    its numpy array is never overwritten, and every step's logits are those of the engine without
    reuse, bit for bit."""
    from minfer.ops import paths

    # (graph_io off: the io graphs copy the logits themselves, test_io_graphs_... below)
    p, a, b = _tiny_pair(tmp_path, 9, Switches(graph_host_reuse=False), switches_a=Switches(graph_io=False))
    assert a.switches.graph_host_reuse
    prompt = torch.randint(0, p.vocab, (7,), generator=torch.Generator().manual_seed(3)).tolist()
    t = int(a.prefill(prompt).argmax())
    assert int(b.prefill(prompt).argmax()) == t
    paths.reset()
    ptrs, kept = [], []
    for step in range(12):
        pos = len(prompt) + step
        la = a.forward([t], pos)
        lb = b.forward([t], pos)
        assert torch.equal(la, lb), step
        ptrs.append(la.data_ptr())
        if step == 4:
            kept.append((la, la.clone()))                    # the tensor itself
        elif step == 6:
            kept.append((la[-1], la[-1].clone()))            # a row of it
        elif step == 8:
            arr = la.numpy()
            kept.append((torch.from_numpy(arr), la.clone()))  # its numpy array
        t = int(lb[-1].argmax())
        del la, lb
    assert all(torch.equal(x, y) for x, y in kept)
    counts = paths.snapshot()["counts"]
    assert counts.get("graph.decode.logits_reused", 0) >= 6, counts
    assert ptrs[1] == ptrs[2] == ptrs[3] == ptrs[4]           # let go of: the same buffer
    assert ptrs[5] != ptrs[4] and ptrs[7] != ptrs[6] and ptrs[9] != ptrs[8]   # kept: a new one after it


def test_io_graphs_give_the_same_logits_and_never_overwrite_a_kept_tensor(tmp_path):
    """Switches.graph_io: Engine.forward's steps replay graphs whose own nodes copy the input in and
    the logits out to a pinned tensor of one of two slots. Bit for bit the logits of the engine
    without it, below and above the short graph's 128 rows; a tensor the caller keeps is never
    overwritten: the next step takes the other slot, and with both kept the plain graph (counted
    graph.decode.io_held); once let go, slot 0 again."""
    from minfer.ops import paths

    # both engines' switches explicit (a MINFER_* setting in the environment would reach only an
    # engine loaded without switches, and split its attention differently: call 5, perf-log Z6)
    p, a, b = _tiny_pair(tmp_path, 12, Switches(graph_io=False), switches_a=Switches(), ctx=200)
    assert a.switches.graph_io
    prompt = torch.randint(0, p.vocab, (120,), generator=torch.Generator().manual_seed(8)).tolist()
    t = int(a.prefill(prompt).argmax())
    assert int(b.prefill(prompt).argmax()) == t
    paths.reset()
    ptrs, kept = [], []
    for step in range(16):                                   # positions 120..135: both graphs
        pos = len(prompt) + step
        la = a.forward([t], pos)
        lb = b.forward([t], pos)
        assert la.device.type == "cpu" and la.dtype == torch.float32
        assert torch.equal(la, lb), step
        ptrs.append(la.data_ptr())
        if step in (10, 11):
            kept.append((la, la.clone()))                    # held over the steps after them
        if step == 12:
            assert all(torch.equal(x, y) for x, y in kept)
            kept = []
        t = int(lb[-1].argmax())
        del la, lb
    counts = paths.snapshot()["counts"]
    assert counts["graph.decode.replay.io"] == 15, counts    # all but step 12 (both slots kept)
    assert counts["graph.decode.io_held"] == 1, counts
    # slot 0: the short graph and the whole cache's; slot 1: the whole cache's (step 11)
    assert counts["graph.decode.capture.io"] == 3, counts
    slot0 = ptrs[0]
    assert all(ptrs[i] == slot0 for i in range(16) if i not in (11, 12))
    assert len({slot0, ptrs[11], ptrs[12]}) == 3


def test_short_graph_below_two_key_tiles_then_the_whole_cache(tmp_path):
    """Switches.decode_short_graph: with a cache of more rows than two key tiles (384 rows here),
    positions below 128 replay a graph captured over the first 128 rows, whose decode attention
    is one key split writing its output (no merge launch), and the positions from 128 on the
    whole-cache graph (captured there).

    Each graph is held at 1e-4 (and the greedy token) to an engine that splits the keys the same
    way over the same cache contents: below 128 the eager engine (one split at those lengths);
    from 128, after a 130-token prompt (no short step before), the engine with the switch off.
    Across 128 after short steps the caches differ in bf16 rounding from the switch-off engine's
    (its attention split the keys three ways below 128), and the tiny synthetic model's logits
    move by ~1e-2 (measured on the H200): held to 5e-2 there. Tokens: the eager run's greedy
    ones, fed to every engine."""
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=11, progress=False)

    def run(switches, prompt, steps, tokens=None):
        eng = Engine.load(str(path), device="cuda", ctx=300, progress=False, switches=switches)
        assert eng.cache.n_ctx > 128
        tok = int(eng.prefill(prompt).argmax())
        paths.reset()
        out = []
        for step in range(steps):
            logits = eng.forward([tokens[step] if tokens else tok], len(prompt) + step)[-1]
            out.append(logits.clone())
            tok = int(logits.argmax())
        return out, paths.snapshot()["counts"], tok

    def rel(x, r):
        return float((x.double() - r.double()).norm() / r.double().norm())

    g = torch.Generator().manual_seed(4)
    prompt = torch.randint(0, p.vocab, (100,), generator=g).tolist()
    eager, _, _ = run(Switches(cuda_graph=False), prompt, 50)      # positions 100..149: across 128
    t0 = int(Engine.load(str(path), device="cuda", ctx=300, progress=False).prefill(prompt).argmax())
    tokens = [t0] + [int(x.argmax()) for x in eager[:-1]]
    off, counts_off, _ = run(Switches(decode_short_graph=False), prompt, 50, tokens)
    got, counts, _ = run(Switches(), prompt, 50, tokens)
    for step, x in enumerate(got):
        if len(prompt) + step < 128:
            assert rel(x, eager[step]) < 1e-4, (len(prompt) + step, rel(x, eager[step]))
            assert int(x.argmax()) == int(eager[step].argmax()), len(prompt) + step
        else:
            assert rel(x, off[step]) < 5e-2, (len(prompt) + step, rel(x, off[step]))
    # each graph in both io slots (the loop's `logits` holds the last step's tensor during a call)
    assert counts["graph.decode.capture"] == counts["graph.decode.capture.io"] == 4
    assert counts["graph.decode.capture.short"] == 2
    assert counts["graph.decode.replay"] == 50 and counts["graph.decode.replay.short"] == 28
    assert counts.get("attention.decode.one_split", 0) > 0
    assert counts_off["graph.decode.capture"] == 2 and "graph.decode.replay.short" not in counts_off
    assert counts_off["graph.decode.replay"] == 50
    # from position 130 on: the whole-cache graph only, the same as the switch-off engine's
    prompt = torch.randint(0, p.vocab, (130,), generator=g).tolist()
    off, _, _ = run(Switches(decode_short_graph=False), prompt, 10)
    tokens = [int(Engine.load(str(path), device="cuda", ctx=300, progress=False).prefill(prompt).argmax())] + \
        [int(x.argmax()) for x in off[:-1]]
    got, counts, _ = run(Switches(), prompt, 10, tokens)
    for step, (x, r) in enumerate(zip(got, off)):
        assert rel(x, r) < 1e-4 and int(x.argmax()) == int(r.argmax()), (130 + step, rel(x, r))
    assert counts["graph.decode.capture"] == 2 and "graph.decode.capture.short" not in counts


def _teacher_forced(a, b, prompt, steps: int):
    """Both engines prefilled with prompt (the same logits), then fed b's greedy token for `steps`
    steps; yields (step, a's logits, b's logits). The path counts are reset after the prefill."""
    from minfer.ops import paths

    la, lb = a.prefill(prompt), b.prefill(prompt)
    assert torch.equal(la, lb)
    t = int(lb.argmax())
    paths.reset()
    for step in range(steps):
        la, lb = a.forward([t], len(prompt) + step)[-1], b.forward([t], len(prompt) + step)[-1]
        yield step, la, lb
        t = int(lb.argmax())


def test_grid_merge_graph_gives_the_combine_bits(tmp_path):
    """Switches.decode_attn_grid_merge in the whole-cache graph (positions 130..149 of a 300-row
    cache: several key splits a KV head): the attention's programs merge the splits after a grid
    barrier instead of a combine launch, and every step's logits are the same bits as the engine's
    with the switch off (decode_merge.py: the same merge arithmetic). The barrier's words are
    shared by all layers and replays, and end each step with no arrivals."""
    from minfer.ops import paths

    p, a, b = _tiny_pair(tmp_path, 13, Switches(decode_attn_grid_merge=False),
                         switches_a=Switches(decode_attn_grid_merge=True), ctx=300)
    prompt = torch.randint(0, p.vocab, (130,), generator=torch.Generator().manual_seed(5)).tolist()
    for step, la, lb in _teacher_forced(a, b, prompt, 20):
        assert torch.equal(la, lb), step
    snap = paths.snapshot()
    assert snap["counts"].get("attention.decode.grid_merge", 0) > 0 and not snap["fallbacks"], snap
    assert snap["counts"]["graph.decode.replay"] == 40
    assert int(a.ctx.workspace.attn_barrier()[0]) == 0


def test_pipe_graphs_decode_as_the_plain_loop(tmp_path):
    """Switches.decode_attn_pipe in both decode graphs (positions 100..149 of a 300-row cache: the short
    graph's one split below 128, key splits after): the attention's cached tiles copied before its PDL
    wait, this step's row (written by the rope + KV kernel just before) after it and folded in last;
    teacher-forced, every step's logits within 5% of the plain loop's and the same greedy token, or (at most
    twice) a near tie: the plain loop's logit of the pipe's token within twice the arms' largest logit
    difference of its own pick (the bf16 rows between the kernels differ in their last bit; perf-log AZ4)."""
    from minfer.ops import paths

    p, a, b = _tiny_pair(tmp_path, 14, Switches(), switches_a=Switches(decode_attn_pipe=True), ctx=300)
    prompt = torch.randint(0, p.vocab, (100,), generator=torch.Generator().manual_seed(6)).tolist()
    ties = []
    for step, la, lb in _teacher_forced(a, b, prompt, 50):
        err = float((la.double() - lb.double()).norm() / lb.double().norm())
        ia, ib = int(la.argmax()), int(lb.argmax())
        gap, diff = float(lb[ib] - lb[ia]), float((la.double() - lb.double()).abs().max())
        assert err < 5e-2 and (ia == ib or gap <= 2 * diff), (step, err, ia, ib, gap, diff)
        if ia != ib:
            ties.append((step, gap, diff))
    print("near ties (step, gap, largest difference):", ties)
    assert len(ties) <= 2, ties
    snap = paths.snapshot()
    assert snap["counts"]["graph.decode.replay.short"] == 2 * 28 and not snap["fallbacks"], snap
