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


def teacher_forced_greedy_same(engines: dict, steps: int = 16, gen_tokens: int = 24) -> dict:
    """The two engines' ({False: .., True: ..}) greedy decode from the same prompt: at each of `steps` steps the
    switch-on engine's logits within 2% of the switch-off one's with the same argmax (the off engine's token fed
    to both), then their greedy generate() tokens equal; returns the paths snapshot of the stepped decode. Closes
    the engines."""
    from kernel_data import rel_err
    from minfer.ops import paths

    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    t = int(engines[False].prefill(prompt).argmax())
    engines[True].prefill(prompt)
    paths.reset()
    for step in range(steps):
        pos = len(prompt) + step
        la, lb = engines[True].forward([t], pos)[-1], engines[False].forward([t], pos)[-1]
        assert rel_err(la, lb.double()) < 2e-2 and int(la.argmax()) == int(lb.argmax()), step
        t = int(lb.argmax())
    snap = paths.snapshot()
    toks = [[e.token_id for e in eng.generate(prompt, max_new_tokens=gen_tokens, temperature=0)]
            for eng in (engines[True], engines[False])]
    assert toks[0] == toks[1]
    for eng in engines.values():
        eng.close()
    return snap


def captured(fn) -> tuple:
    """(graph, fn's result inside it): fn run once on a side stream (its kernels compiled, its memory pool warm),
    then captured in a CUDA graph; replay the graph to run fn again on the same tensors."""
    import torch

    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        fn()
    torch.cuda.current_stream().wait_stream(st)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = fn()
    return graph, res
