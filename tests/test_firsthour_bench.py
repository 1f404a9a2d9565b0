"""`minfer bench` with odd arguments, as a new user types them: a batched table whose KV pool
cannot fit, flags the batched table does not use, a test longer than the model was trained on.
Each is one line (or a warning) before the load or the measuring. The tiny synthetic model
stands in for a real one; its KV block size is computed here from its header."""

from __future__ import annotations

import pytest

from helpers_cli import kv_block_bytes, one_error_line, write_tiny_model

from minfer import cli


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("fhb"))


@pytest.fixture(scope="module")
def block_bytes(tiny):
    return kv_block_bytes(tiny)


def test_a_batched_table_whose_pool_cannot_fit_is_one_line_before_the_load(capsys, monkeypatch, tiny, block_bytes):
    from minfer.commands import preflight
    from minfer.runtime import engine

    def no_load(*a, **k):
        raise AssertionError("the model was loaded before the pool was checked")

    monkeypatch.setattr(engine.Engine, "load", no_load)
    # say 100 blocks are free; 60 sequences of 11 tokens (one block each), plus 2, twice: 124
    monkeypatch.setattr(preflight, "available_bytes", lambda device: 100 * block_bytes)
    base = ["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "2", "--no-progress"]
    line = one_error_line(capsys, base + ["--parallel", "1,60"])   # was an allocator's traceback
    assert line.startswith("minfer: error: --parallel 60: the default KV pool"), line
    assert "batch sizes up to about 48" in line, line    # (48 + 2) x 2 = 100 blocks
    line = one_error_line(capsys, base + ["--parallel", "2", "--kv-memory", str(200 * block_bytes)])
    assert line.startswith("minfer: error: --kv-memory 6.3M: the paged KV cache would need"), line
    line = one_error_line(capsys, base + ["--parallel", "2", "--kv-memory", "1k"])
    assert "--kv-memory 1K holds 0 KV blocks" in line and "needs 1" in line, line


@pytest.mark.parametrize("flags,expect", [
    (["-p", "8,16"], "-p/--n-prompt takes one value with --parallel"),    # 16 was dropped
    (["-n", "2,4"], "-n/--n-gen takes one value with --parallel"),
    (["-d", "5"], "-d/--depth applies to the pp/tg table only"),
    (["--peer", "torch-bf16"], "--peer applies to the pp/tg table only"),
    (["-r", "3"], "-r/--repetitions applies to the pp/tg table only"),
])
def test_flags_the_batched_table_does_not_use_are_refused(capsys, tiny, flags, expect):
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "--parallel", "2", *flags])
    assert expect in line, line


def test_a_test_past_the_trained_context_warns_before_measuring(capsys, monkeypatch, tiny):
    from minfer.bench import bench
    from minfer.errors import MinferError

    def stop(*a, **k):
        raise MinferError("stopped before measuring")

    monkeypatch.setattr(bench, "run_bench", stop)
    # the tiny model was trained on 2048 tokens: a pp2048 test needs 2049 (run_bench's + 1)
    assert cli.main(["bench", "-m", tiny, "--device", "cpu", "-p", "2048", "-n", "8"]) == 1
    err = capsys.readouterr().err
    assert "warning: -p/-n/-d: the longest test needs a context of 2049 tokens, past the 2048" in err, err
    # within it: no warning
    assert cli.main(["bench", "-m", tiny, "--device", "cpu", "-p", "2047", "-n", "8"]) == 1
    assert "warning" not in capsys.readouterr().err


def test_a_batched_table_past_the_trained_context_warns_before_the_load(capsys, monkeypatch, tiny):
    from minfer.errors import MinferError
    from minfer.runtime import engine

    def stop(*a, **k):
        raise MinferError("stopped before the load")

    monkeypatch.setattr(engine.Engine, "load", stop)
    argv = ["bench", "-m", tiny, "--device", "cpu", "--parallel", "1", "-n", "8"]
    assert cli.main(argv + ["-p", "2041"]) == 1     # 2041 + 8 + 1 = 2050 > 2048
    err = capsys.readouterr().err
    assert "warning: -p/-n: each sequence needs a context of 2050 tokens, past the 2048" in err, err
    assert cli.main(argv + ["-p", "2039"]) == 1     # 2048: within it
    assert "warning" not in capsys.readouterr().err


def test_dense_planes_on_the_cpu_warns_that_it_changes_nothing(capsys, monkeypatch, tiny):
    from minfer.errors import MinferError
    from minfer.runtime import engine

    def stop(*a, **k):
        raise MinferError("stopped before the load")

    monkeypatch.setattr(engine.Engine, "load", stop)
    argv = ["bench", "-m", tiny, "--device", "cpu", "--parallel", "1", "-p", "8", "-n", "2"]
    assert cli.main(argv + ["--dense-planes", "on"]) == 1     # was ignored without a word
    assert "warning: --dense-planes on: the dense bf16 planes are a CUDA path" in capsys.readouterr().err
    assert cli.main(argv) == 1
    assert "warning" not in capsys.readouterr().err


def test_pairs_without_ab_is_refused(capsys, tiny):
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "8", "-n", "0", "--pairs", "6"])
    assert "--pairs 6 sets how many A/B pairs --ab runs: give --ab ENV_A ENV_B too" in line, line
