"""`minfer bench --parallel` on the CPU (bench/parallel.py): the llama-batched-bench table over a
tiny synthetic model. Times are not asserted; the counts are: every sequence prefills its pp
tokens and then generates exactly tg (the lockstep phases themselves: tests/runtime/test_batch_async.py)."""

from __future__ import annotations

import torch

from minfer.bench.parallel import run_parallel, table


def test_parallel_table_counts(tmp_path):
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.runtime.engine import Engine

    path = write_synth(tmp_path / "tiny.gguf", get_preset("tiny"), "q8_0", progress=False).path
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eng = Engine.load(str(path), device="cpu", ctx=64, progress=False)
        rows = run_parallel(eng, [1, 3], pp=8, tg=4, progress=False)
    finally:
        torch.set_num_threads(n)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert r["n_kv"] == r["batch"] * (8 + 4) and r["preemptions"] == 0
        assert r["s_pp"] > 0 and r["s_tg"] > 0 and r["t"] >= r["t_pp"]
    lines = table(rows).splitlines()
    assert len(lines) == 4                                   # header, rule, one row per B
    assert [int(line.split("|")[3]) for line in lines[2:]] == [1, 3]
    assert [int(line.split("|")[4]) for line in lines[2:]] == [12, 36]     # N_KV
