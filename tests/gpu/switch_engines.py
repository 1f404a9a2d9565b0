"""Engines of one synthetic model that differ in one switch (the GPU tests of a decode mechanism against its
switch-off path)."""

from __future__ import annotations

import subprocess
import sys


def switch_engines(tmp_path, preset: str, field: str, values=(False, True), layers: int = 2) -> dict:
    """{value: Engine}: a synthetic `preset` file (`layers` layers, Q4_K_M, vocab 4096) loaded on CUDA once
    per value of Switches.<field> (the other switches at their defaults)."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    path = tmp_path / f"{preset}.gguf"
    subprocess.run([sys.executable, "-m", "minfer", "synth", str(path), "--preset", preset, "--layers", str(layers),
                    "--recipe", "q4_k_m", "--vocab", "4096", "--no-progress"], check=True, capture_output=True)
    return {v: Engine.load(str(path), device="cuda", ctx=256, progress=False, switches=Switches(**{field: v}))
            for v in values}


def decode_snaps(engines: dict, start: int, first: int, steps: int = 12) -> dict:
    """{value: paths snapshot}: each engine's greedy decode of `steps` tokens from token `first` at position
    `start` (its prompt prefilled), the launch paths counted engine by engine."""
    from minfer.ops import paths

    snaps = {}
    for v, eng in engines.items():
        paths.reset()
        t = first
        for step in range(steps):
            t = int(eng.forward([t], start + step)[-1].argmax())
        snaps[v] = paths.snapshot()
    return snaps
