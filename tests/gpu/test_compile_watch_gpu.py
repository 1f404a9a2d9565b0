"""The compile note on a real first run (runtime/compile_watch.py), each case with an empty Triton
cache (TRITON_CACHE_DIR in a temporary folder) in a fresh process on a tiny synthetic model:
- `minfer run` (stderr not a terminal: no progress output) says in its timing line how many
  seconds went to compiling; a second run on the same cache loads every kernel from it and says
  nothing of compiling;
- an Engine loaded with progress=True (what `minfer run` does on a terminal) prints the one note
  on stderr, and its stats hold the compile seconds."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def _py(args: list, cache: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, *args], env=dict(os.environ, TRITON_CACHE_DIR=cache), capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def _cli(model: str, cache: str) -> str:
    return _py(["-m", "minfer", "run", "-m", model, "--raw", "Once upon a time", "-n", "8", "--temp", "0"],
               cache).stderr


def test_first_cli_run_counts_the_compile_and_the_second_does_not(tiny_path, tmp_path):
    cache = str(tmp_path / "triton-cache")
    first = _cli(tiny_path[0], cache)
    timing = [ln for ln in first.splitlines() if ln.startswith("prompt:")]
    assert len(timing) == 1 and "s of it compiling GPU kernels" in timing[0], first[-2000:]
    assert timing[0].endswith("finish: length")
    second = _cli(tiny_path[0], cache)
    assert "compiling" not in second, second[-2000:]


def test_engine_with_progress_notes_the_compile_once(tiny_path, tmp_path):
    code = ("import sys, minfer\n"
            f"eng = minfer.load({tiny_path[0]!r}, device='cuda', ctx=128, progress=True)\n"
            "list(eng.generate([1, 2, 3, 4], max_new_tokens=8, temperature=0))\n"
            "print('compile_s', eng.stats['compile_s'])\n")
    cache = str(tmp_path / "triton-cache")
    r = _py(["-c", code], cache)
    assert r.stderr.count("minfer: compiling GPU kernels") == 1, r.stderr[-2000:]
    assert cache in r.stderr
    secs = float(r.stdout.split("compile_s")[1])
    assert secs >= 1.0, r.stdout
    r2 = _py(["-c", code], cache)
    assert "compiling" not in r2.stderr and float(r2.stdout.split("compile_s")[1]) < 1.0, (r2.stderr[-1000:], r2.stdout)
