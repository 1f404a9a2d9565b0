"""A demanding new user's first hour with the command line (audit of 2026-12-06): what was wrong,
each pinned.

- `minfer bench --plot-out FILE.png` without --plot was accepted and ignored: the benchmark ran
  and no PNG was written. With --plot, the flags of a measurement (-p, -n, -d, -r, --out, -o,
  --ab, --peer, --parallel) were dropped without a word (--plot only plots recorded runs).
- `minfer run --stop ""` (an unset shell variable) was accepted and dropped: the answer never
  stopped on it. The server's flags refuse an empty value the same way (--host "", --alias "").
- `minfer synth --tokenizer-from MODEL` with a tokenizer larger than the preset's vocabulary said
  "tokenizer: its tokenizer has N tokens", naming neither the flag nor the model; it names both,
  and the --vocab that would do.
- `minfer synth` of a file larger than its disk's free space wrote until the disk was full and
  left the part written there; it is one line before writing.
"""

from __future__ import annotations

import pytest

from helpers_cli import one_error_line, write_tiny_model


def test_bench_plot_out_without_plot_is_an_error(capsys, tmp_path):
    # ran the benchmark (rc 0) and wrote no PNG
    tiny = write_tiny_model(tmp_path)
    png = tmp_path / "p.png"
    line = one_error_line(capsys, ["bench", "-m", tiny, "--device", "cpu", "-p", "4", "-n", "0", "-r", "1",
                                   "--no-progress", "--plot-out", str(png)])
    assert line == (f"minfer: error: --plot-out {png} names the PNG that --plot writes: "
                    "give --plot DIR_OR_JSON too"), line
    assert not png.exists()


@pytest.mark.parametrize("extra,flag", [
    (["-p", "64"], "-p/--n-prompt"),
    (["-n", "0"], "-n/--n-gen"),
    (["-d", "8"], "-d/--depth"),
    (["-r", "2"], "-r/--repetitions"),
    (["--out", "run.json"], "--out"),
    (["-o", "json"], "-o/--output"),
    (["--ab", "X=1", "X=0"], "--ab"),
    (["--peer", "torch-bf16"], "--peer"),
    (["--parallel", "2"], "--parallel"),
])
def test_bench_plot_refuses_the_flags_of_a_measurement(capsys, tmp_path, extra, flag):
    # each was dropped without a word: --plot plotted the recorded runs and measured nothing
    line = one_error_line(capsys, ["bench", "--plot", str(tmp_path), "--plot-out", str(tmp_path / "p.png"),
                                   *extra])
    assert line.startswith(f"minfer: error: {flag} applies to a measurement; --plot only plots"), line


def test_run_empty_stop_string_is_an_error(capsys, tmp_path):
    # was dropped: the run went on (rc 0) as if --stop had not been given
    tiny = write_tiny_model(tmp_path)
    line = one_error_line(capsys, ["run", "-m", tiny, "--device", "cpu", "--temp", "0", "-n", "1",
                                   "--stop", "", "hi"])
    assert line.startswith("minfer: error: --stop is empty"), line


def test_synth_tokenizer_larger_than_the_vocab_names_the_flag(capsys, tmp_path):
    # was "minfer: error: tokenizer: its tokenizer has 512 tokens, ...", naming neither the flag
    # nor the model, and no --vocab that would do
    src = write_tiny_model(tmp_path)   # 512 rows, a byte-level tokenizer padded to them
    out = tmp_path / "small.gguf"
    line = one_error_line(capsys, ["synth", str(out), "--preset", "tiny", "--vocab", "300",
                                   "--tokenizer-from", src, "--no-progress"])
    assert line.startswith(f"minfer: error: --tokenizer-from {src}: its tokenizer has 512 tokens, more "
                           "than the 300 vocabulary rows being written; give --vocab 512"), line
    assert not out.exists()


def test_synth_larger_than_the_free_disk_is_an_error_before_writing(capsys, tmp_path, monkeypatch):
    # was written until the disk was full, then left there part written
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(2**30, 2**30 - 2**20, 2**20))   # 1 MiB free
    out = tmp_path / "new" / "tiny.gguf"
    line = one_error_line(capsys, ["synth", str(out), "--preset", "tiny", "--no-progress"])
    assert line.startswith(f"minfer: error: {out}: the model file needs 1.80 MiB of tensor data but "
                           f"{tmp_path} has 1.00 MiB free"), line
    assert not out.exists()
