"""The compile note on a real first run: `minfer run` on a tiny synthetic model with an empty
Triton cache (TRITON_CACHE_DIR in a temporary folder) prints the note once and says in its timing
line how many seconds went to compiling; the second run on the same cache loads every kernel
from it and says neither (runtime/compile_watch.py)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu


def _run(model: str, cache: str) -> str:
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-m", "minfer", "run", "-m", model, "--raw", "Once upon a time",
                        "-n", "8", "--temp", "0"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stderr


def test_first_run_notes_the_compile_and_the_second_does_not(tiny_path, tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.fail("a gpu test ran without a GPU")
    cache = str(tmp_path / "triton-cache")
    first = _run(tiny_path[0], cache)
    assert first.count("minfer: compiling GPU kernels") == 1, first[-2000:]
    assert cache in first
    timing = [ln for ln in first.splitlines() if ln.startswith("prompt:")]
    assert len(timing) == 1 and "s of it compiling GPU kernels" in timing[0], first[-2000:]
    second = _run(tiny_path[0], cache)
    assert "compiling GPU kernels" not in second, second[-2000:]
