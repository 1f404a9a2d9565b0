"""Norm modes of the CUDA decode against the CPU reference on graphed_pair's tiny model (perf-log
AL4): each step's logits relative error of each CUDA engine (one per switch set) against the CPU
engine, all fed the CPU engine's greedy tokens, and whether each agrees on that token. Which of
two modes that part from each other is nearer the reference.
    python tools/mode_ref.py SEED PROMPT_SEED "k=v,..." ["k=v,..." ...]   ("" for the defaults)"""
import dataclasses
import os
import sys
import tempfile

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__)))
from mode_pair import switches  # noqa: E402

from minfer.bench.presets import get_preset  # noqa: E402
from minfer.bench.synth import write_synth  # noqa: E402
from minfer.ops.cuda import gemv_q8_gluon as GL  # noqa: E402
from minfer.runtime.engine import Engine  # noqa: E402
from minfer.switches import Switches  # noqa: E402


def rel(a, b) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    return float((a - b).norm() / b.norm())


def main():
    seed, pseed, sets = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    p = dataclasses.replace(get_preset("tiny"), ffn=1024)
    GL.config_for = lambda qtype, n, k, table="": (32, 2, 2, 4)     # graphed_pair's table
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        write_synth(path, p, "q4_k_m", seed=seed, progress=False)
        # tests/gpu/test_model_gpu.py's reference: without the CPU's own activation quantization
        # (Switches.cpu_quant), which would put its own error into the comparison (call 8 of
        # 2026-12-04b ran with it on: ~10% for every mode alike)
        ref = Engine.load(path, device="cpu", ctx=160, progress=False, switches=Switches(cpu_quant=False))
        cuda = [Engine.load(path, device="cuda", ctx=160, progress=False, switches=switches(s) if s else None)
                for s in sets]
        prompt = torch.randint(0, p.vocab, (10,), generator=torch.Generator().manual_seed(pseed)).tolist()
        lr = ref.prefill(prompt)
        outs = [e.prefill(prompt) for e in cuda]
        print("prefill: " + "  ".join(f"[{s}] {rel(o, lr):.2e}" for s, o in zip(sets, outs)))
        errs = [[] for _ in sets]
        agree = [0] * len(sets)
        t = int(lr.argmax())
        for step in range(24):
            pos = len(prompt) + step
            lr = ref.forward([t], pos)[-1]
            for i, e in enumerate(cuda):
                lc = e.forward([t], pos)[-1]
                errs[i].append(rel(lc, lr))
                agree[i] += int(lc.argmax()) == int(lr.argmax())
            t = int(lr.argmax())
        for s, er, ag in zip(sets, errs, agree):
            er_s = sorted(er)
            print(f"[{s}] vs CPU, seed {seed}: tokens agree {ag} / 24; rel err median {er_s[12]:.2e}, "
                  f"max {er_s[-1]:.2e}: " + " ".join(f"{x:.1e}" for x in er), flush=True)


if __name__ == "__main__":
    main()
