"""`minfer bench` on the CPU with a tiny synthetic model: the JSON record's fields, the
roofline numbers recomputed here from the tensor table read by the independent gguf
package, the A/B interleaving, warm-up exclusion, the torch peer against the engine, and
the plot input. No test asserts a time."""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
import torch

from minfer.bench import bench as B
from minfer.bench.presets import PRESETS
from minfer.cli import main as cli
from minfer.errors import MinferError


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny.gguf"
    assert cli(["synth", str(out), "--preset", "tiny", "--no-progress"]) == 0
    return str(out)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "tiny-llama.gguf"
    assert cli(["synth", str(out), "--preset", "tiny", "--arch", "llama", "--recipe", "q8_0",
                "--no-progress"]) == 0
    return str(out)


def test_make_tests_llama_bench_order():
    names = [t.name for t in B.make_tests([16, 32], [4], [0, 8])]
    assert names == ["pp16", "pp32", "tg4", "pp16 @ d8", "pp32 @ d8", "tg4 @ d8"]
    assert [t.name for t in B.make_tests([0], [4], [0])] == ["tg4"]
    with pytest.raises(MinferError):
        B.make_tests([0], [0], [0])


def test_bench_json_record(tiny, tmp_path, capsys):
    out = tmp_path / "run.json"
    assert cli(["bench", "-m", tiny, "--device", "cpu", "-p", "16", "-n", "3", "-d", "0,8", "-r", "2",
                "-o", "json", "--out", str(out), "--no-progress"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec == json.loads(out.read_text())
    assert rec["format"] == "minfer-bench/1"
    m = rec["machine"]
    for k in ("date", "python", "torch", "triton", "numpy", "cpu", "commit", "dirty", "minfer", "env"):
        assert k in m, k
    assert m["gpu"] is None
    assert [r["test"] for r in rec["results"]] == ["pp16", "tg3", "pp16 @ d8", "tg3 @ d8"]

    # geometry and bytes from the independent reader
    r = gguf.GGUFReader(tiny)
    tensors = {t.name: t for t in r.tensors}
    assert rec["model"]["size_bytes"] == sum(int(t.n_bytes) for t in r.tensors)
    assert rec["model"]["n_params"] == sum(int(t.n_elements) for t in r.tensors)
    p = PRESETS["tiny"]
    L, H, hd, D, F, V = p.n_layers, p.n_head, p.head_dim, p.hidden, p.ffn, p.vocab
    layer_params = L * (H * hd * D * 2 + 2 * p.n_kv_head * hd * D + 3 * F * D)
    emb = tensors["token_embd.weight"]
    tg_bytes = (sum(int(t.n_bytes) for n, t in tensors.items() if n.startswith("blk."))
                + int(tensors["output.weight"].n_bytes) + int(tensors["output_norm.weight"].n_bytes)
                + int(emb.n_bytes) // V)
    for res in rec["results"]:
        n, d = res["n_prompt"] or res["n_gen"], res["depth"]
        assert res["reps"] == 2 and len(res["samples_s"]) == 2 and all(s > 0 for s in res["samples_s"])
        ts = [n / s for s in res["samples_s"]]
        assert res["samples_ts"] == pytest.approx(ts)
        assert res["avg_ts"] == pytest.approx(np.mean(ts))
        assert res["stdev_ts"] == pytest.approx(np.std(ts, ddof=1))
        assert res["peak_mem_bytes"] is None and res["runner"] == "minfer"
        if res["kind"] == "pp":
            flops = 2 * n * layer_params + 2 * V * D + 4 * L * H * hd * (n * d + n * (n + 1) / 2)
            assert res["tflops"] == pytest.approx(flops / np.mean(res["samples_s"]) / 1e12)
            assert res["gbps"] is None and res["n_gen"] == 0
        else:
            assert res["gbps"] == pytest.approx(tg_bytes * np.mean(ts) / 1e9)
            assert res["tflops"] is None and res["n_prompt"] == 0

    md = out.with_suffix(".md").read_text()
    assert m["date"] in md and str(m["commit"]) in md and "| pp16 @ d8 |" in md.replace("  ", " ")
    assert "tg3" in md and "t/s" in md


def test_bench_table(tiny_llama, capsys):
    assert cli(["bench", "-m", tiny_llama, "--device", "cpu", "-p", "8", "-n", "2", "-r", "1",
                "--no-progress"]) == 0
    out = capsys.readouterr().out
    header = [line for line in out.splitlines() if line.startswith("| model")][0]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "model", "size", "params", "backend", "test", "t/s", "TFLOP/s", "GB/s", "peak mem"]
    rows = [line for line in out.splitlines() if line.startswith("| llama")]
    assert len(rows) == 2 and "Q8_0" in rows[0] and "pp8" in rows[0] and "tg2" in rows[1]
    assert "±" in rows[0]


class FakeRunner:
    """Records which switches each call saw; no model. Its engine is a stand-in that keeps a
    Switches the way Engine.set_switches does."""
    name = "fake"

    def __init__(self):
        from minfer.switches import Switches

        self.calls: list[tuple[str, bool]] = []
        self.base = self.sw = Switches()

    def configure(self, changes):
        self.sw = self.base.with_env(changes)
        return dict(changes)

    def reset(self):
        pass

    def prefill(self, ids, start_pos):
        self.calls.append(("prefill", self.sw.gemv))

    def decode(self, tok, pos):
        self.calls.append(("decode", self.sw.gemv))


def test_warmup_excluded():
    r = FakeRunner()
    res = B.measure(r, B.Test("pp", 4, 0), 3, np.random.default_rng(0), 100, B.Timer("cpu"))
    assert len(r.calls) == 4 and len(res.samples_s) == 3


def test_ab_interleaves_switches_not_env(monkeypatch):
    monkeypatch.setenv("MINFER_GEMV", "1")
    r = FakeRunner()
    t = B.Test("pp", 4, 0)
    stats = None
    ab = B.run_ab(r, [t], B.parse_env("MINFER_GEMV=1"), B.parse_env("MINFER_GEMV=0"), 4, 2,
                  np.random.default_rng(0), 100, B.Timer("cpu"), stats, log=lambda m: None)
    seen = ["a" if v else "b" for _, v in r.calls]
    # A A A B B B / B B B A A A (a warm-up, excluded, then 2 reps each), alternating per pair
    assert seen == (["a"] * 3 + ["b"] * 6 + ["a"] * 3) * 2
    assert os.environ["MINFER_GEMV"] == "1"                   # the environment is never written
    assert r.sw == r.base                                     # the runner's own switches restored
    assert len(ab["pairs"]) == 4
    for row in ab["pairs"]:
        assert row["ratio"] == pytest.approx(row["b_ts"] / row["a_ts"])
    ratios = [row["ratio"] for row in ab["pairs"]]
    s = ab["summary"][0]
    assert s["n_pairs"] == 4 and s["ratio_mean"] == pytest.approx(np.mean(ratios))
    assert s["ratio_sd"] == pytest.approx(np.std(ratios, ddof=1))
    assert (s["ratio_min"], s["ratio_max"]) == (min(ratios), max(ratios))
    assert [x["env"]["ab_side"] for x in ab["results"]] == ["A", "B", "B", "A"] * 2
    with pytest.raises(MinferError, match="at least 4"):
        B.run_ab(r, [t], {"X": "1"}, {"X": "2"}, 3, 1, np.random.default_rng(0), 100, B.Timer("cpu"),
                 stats, log=lambda m: None)


def test_parse_env():
    assert B.parse_env("A=1 B=x=y") == {"A": "1", "B": "x=y"}
    assert B.parse_env("A=1,C") == {"A": "1", "C": None}
    # a comma before a lower-case word continues the value (a list-valued switch)
    assert B.parse_env("MINFER_PDL_EARLY_SITES=rope_kv,decode_attention MINFER_X=1") == {
        "MINFER_PDL_EARLY_SITES": "rope_kv,decode_attention", "MINFER_X": "1"}
    assert B.parse_env("MINFER_PDL_EARLY_SITES=rope_kv,swiglu,MINFER_X=0") == {
        "MINFER_PDL_EARLY_SITES": "rope_kv,swiglu", "MINFER_X": "0"}
    with pytest.raises(MinferError):
        B.parse_env("1A=2")
    with pytest.raises(MinferError):
        B.parse_env("  ")


def test_ab_cli_bare_name_is_default(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MINFER_PREFILL_CHUNK", "3")
    assert cli(["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "0", "-r", "1", "--no-progress",
                "--ab", "MINFER_PREFILL_CHUNK=5", "MINFER_PREFILL_CHUNK", "--pairs", "4", "-o", "json",
                "--out", str(tmp_path / "ab.json")]) == 0
    rec = json.loads(capsys.readouterr().out)
    md = (tmp_path / "ab.md").read_text()
    assert md.count("| B/A mean |") == 1 and md.count("| 4 | pp8 |") == 1
    assert rec["ab"]["a"] == {"MINFER_PREFILL_CHUNK": "5"} and rec["ab"]["b"] == {"MINFER_PREFILL_CHUNK": None}
    envs = [(x["env"]["ab_side"], x["env"].get("MINFER_PREFILL_CHUNK")) for x in rec["ab"]["results"]]
    assert envs == [("A", "5"), ("B", None), ("B", None), ("A", "5")] * 2
    assert os.environ["MINFER_PREFILL_CHUNK"] == "3"


def test_ab_unknown_switch_fails_before_load(tiny, capsys):
    assert cli(["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "0", "--no-progress",
                "--ab", "MINFER_NOPE=1", "MINFER_NOPE=0"]) == 1
    assert "MINFER_NOPE is not a minfer switch" in capsys.readouterr().err


def test_engine_runner_configures_engine_switches(tiny):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    eng = Engine.load(tiny, device="cpu", ctx=32, progress=False, switches=Switches(prefill_chunk=7))
    r = B.EngineRunner(eng)
    r.configure({"MINFER_PREFILL_CHUNK": "3"})
    assert eng.switches.prefill_chunk == 3 and eng.ctx.switches is eng.switches
    r.configure({})
    assert eng.switches == Switches(prefill_chunk=7)
    with pytest.raises(MinferError, match="MINFER_ACT_DTYPE acts at load"):
        r.configure({"MINFER_ACT_DTYPE": "float32"})


@pytest.mark.parametrize("which", ["tiny", "tiny_llama"])
def test_torch_peer_matches_engine_cpu(which, request):
    """The peer (independent code) in float32 on the CPU against minfer's engine: prefill,
    prefill at depth, and single-token decode give the same logits."""
    from minfer.bench.peers import TorchPeer
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.engine import Engine

    path = request.getfixturevalue(which)
    peer = TorchPeer(GGUFFile(path), device="cpu", dtype=torch.float32, n_ctx=64)
    eng = Engine.load(path, device="cpu", ctx=64, progress=False)
    ids = torch.randint(0, PRESETS["tiny"].vocab, (21,), generator=torch.Generator().manual_seed(0))
    for chunk, start in ((ids[:12], 0), (ids[12:20], 12), (ids[20:21], 20)):
        a = eng.forward(chunk, start)
        b = peer.forward(chunk, start)
        assert a.shape == b.shape == (len(chunk), PRESETS["tiny"].vocab)
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()
    assert torch.allclose(peer.forward(ids[:5], 0, last_only=True), eng.forward(ids[:5], 0)[-1:], atol=1e-4)


def test_peer_needs_cuda(tiny):
    from minfer.bench.peers import load_peer
    from minfer.gguf_file import GGUFFile

    with pytest.raises(MinferError, match="CUDA"):
        load_peer("torch-bf16", GGUFFile(tiny), "cpu", 64)


def test_plot_inputs(tiny, tmp_path, capsys):
    from minfer.bench.plot import load_runs, series

    for i in range(2):
        assert cli(["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "2", "-r", "1", "--no-progress",
                    "--out", str(tmp_path / f"r{i}.json")]) == 0
    (tmp_path / "other.json").write_text('{"not": "a bench record"}')
    runs = load_runs([str(tmp_path)])
    assert len(runs) == 2
    s = series(runs)
    key = next(k for k in s if k[2] == "pp8")
    assert key[1] == "minfer" and [p["x"] for p in s[key]] == [0, 1]
    assert [p["avg_ts"] for p in s[key]] == [json.loads((tmp_path / f"r{i}.json").read_text())["results"][0]["avg_ts"]
                                            for i in range(2)]
    png = tmp_path / "p.png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert cli(["bench", "--plot", str(tmp_path), "--plot-out", str(png)]) == 1
        assert "minfer[plot]" in capsys.readouterr().err and not png.exists()
    else:
        assert cli(["bench", "--plot", str(tmp_path), "--plot-out", str(png)]) == 0
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rejects_bad_combinations(tiny, capsys):
    for argv, msg in ((["--peer", "torch-bf16", "--device", "cpu"], "CUDA only"),
                      (["--ab", "MINFER_GEMV=1", "MINFER_GEMV=0", "--pairs", "2", "--device", "cpu"], "at least 4"),
                      (["--ab", "MINFER_GEMV=1", "MINFER_GEMV=0", "--peer", "torch-bf16", "--device", "cpu"],
                       "do not combine"),
                      (["-p", "0", "-n", "0", "--device", "cpu"], "no test")):
        assert cli(["bench", "-m", tiny, "--no-progress", *argv]) == 1
        assert msg in capsys.readouterr().err, argv


def test_peer_runner_timed_like_engine(tiny):
    """The peer goes through the same measure() path (CPU, float32 here; bf16 on CUDA)."""
    from minfer.bench.peers import TorchPeer
    from minfer.gguf_file import GGUFFile

    gf = GGUFFile(tiny)
    peer = B.PeerRunner(TorchPeer(gf, device="cpu", dtype=torch.float32, n_ctx=64))
    stats = B.ModelStats.from_gguf(gf)
    for t in (B.Test("pp", 8, 0), B.Test("tg", 3, 8), B.Test("pp", 4, 16)):
        r = B.measure(peer, t, 2, np.random.default_rng(0), 512, B.Timer("cpu"), stats=stats)
        assert r.runner == "torch-bf16" and len(r.samples_s) == 2 and r.avg_ts > 0


def test_torch_peer_matches_engine_on_real_tied_model():
    """SmolLM2 (llama, tied output, Q4_1 blocks decoded through minfer.quants' fallback)."""
    from minfer.bench.peers import TorchPeer
    from minfer.catalog import resolve_model
    from minfer.gguf_file import GGUFFile
    from minfer.runtime.engine import Engine

    path = resolve_model("smollm2-135m-instruct")
    peer = TorchPeer(GGUFFile(path), device="cpu", dtype=torch.float32, n_ctx=32)
    assert "output.weight" not in peer.w
    eng = Engine.load(path, device="cpu", ctx=32, progress=False)
    ids = torch.tensor(eng.tokenizer.encode("The capital of France is", add_bos=False))
    a, b = eng.forward(ids, 0), peer.forward(ids, 0)
    assert torch.allclose(a, b, atol=2e-3, rtol=1e-3), (a - b).abs().max()
    assert int(a[-1].argmax()) == int(b[-1].argmax())


def test_set_switches_keeps_the_graphs_only_for_switches_outside_them(tiny):
    """Engine.set_switches drops captured graphs on any switch a graph reads, and keeps them when
    only MINFER_FUSED_DRAW changes (read when generate() makes its draw): gen_speed's A/B."""
    from minfer.runtime.engine import Engine

    eng = Engine.load(tiny, device="cpu", progress=False)
    marker = object()
    eng._graph = marker
    eng.set_switches(eng.switches.with_env({"MINFER_FUSED_DRAW": "0"}))
    assert eng._graph is marker and not eng.switches.fused_draw and not eng.ctx.switches.fused_draw
    eng.set_switches(eng.switches.with_env({"MINFER_FUSED_DRAW": "1", "MINFER_GEMV": "0"}))
    assert eng._graph is None
