"""Where a fixture's bf16 GPU logits leave the float32 reference (tests/gpu/test_arch_gpu.py's
bf16 criterion): per prefill row, the GPU bf16 and CPU bf16 errors against the CPU float32
reference, and how many MoE routing choices (reference.route's expert sets, prefill only) each
bf16 run made differently from float32. A routing flip puts its error on a few rows; a wrong
kernel on every row.
    python tools/bf16_diag.py NAME [NAME ...]      (fixtures of tests/data/arch; BF16_DIAG_DEVICE=cpu for a
    dry run of the script itself, the "gpu" rows then being the CPU engine)"""
from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "arch"


def recording_routes():
    from minfer.ops import reference

    real = reference.route
    log: list = []

    def route(*a, **kw):
        w, idx = real(*a, **kw)
        if not (idx.is_cuda and torch.cuda.is_current_stream_capturing()):
            log.append(idx.detach().cpu().sort(-1).values)
        return w, idx
    reference.route = route
    return log, lambda: setattr(reference, "route", real)


def flips(a: list, b: list, t: int) -> list[int]:
    """Per route call of t rows (the prefill's; an engine's warm-up forwards are left out): rows
    whose expert sets differ."""
    a, b = [x for x in a if x.shape[0] == t], [x for x in b if x.shape[0] == t]
    return [int((x != y).any(-1).sum()) for x, y in zip(a, b)]


def rows(got, ref) -> np.ndarray:
    return np.linalg.norm(got - ref, axis=-1) / np.linalg.norm(ref, axis=-1)


@torch.inference_mode()
def main(names):
    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.runtime.engine import Engine
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    for name in names:
        r = np.load(DATA / f"{name}.npz")
        ids = r["ids"].tolist()[:30]
        gf = GGUFFile(DATA / f"{name}.gguf")
        out, routes = {}, {}
        for label, dt in (("f32", torch.float32), ("cpu-bf16", torch.bfloat16)):
            log, undo = recording_routes()
            m = load_model(gf, device="cpu", progress=False, act_dtype=dt)
            cache = KVCache.for_config(m.cfg, 64, dtype=dt, context=64)
            out[label] = m.forward(torch.tensor(ids), Step.at(0, len(ids), "cpu"), cache).float().numpy()
            undo()
            routes[label] = log
        sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
        for label, sw2 in (("gpu-bf16", sw), ("gpu-f32", replace(sw, act_dtype="float32"))):
            log, undo = recording_routes()
            eng = Engine.load(DATA / f"{name}.gguf", device=os.environ.get("BF16_DIAG_DEVICE", "cuda"), ctx=64, progress=False, switches=sw2)
            out[label] = eng.forward(ids, 0).float().numpy()
            undo()
            routes[label] = log
        ref = out["f32"]
        print(f"== {name}: rel(all rows) vs CPU float32")
        for label in ("cpu-bf16", "gpu-bf16", "gpu-f32"):
            e = rows(out[label], ref)
            tot = float(np.linalg.norm(out[label] - ref) / np.linalg.norm(ref))
            worst = np.argsort(-e)[:4]
            fl = flips(routes["f32"], routes[label], len(ids)) if routes["f32"] else []
            print(f"  {label:9s} total {tot:.4f}  row median {np.median(e):.4f}  max {e.max():.4f} at rows "
                  f"{worst.tolist()} ({', '.join(f'{e[i]:.3f}' for i in worst)})  route flips per layer {fl}")
        e = rows(out["gpu-bf16"], out["cpu-bf16"])
        print(f"  gpu-bf16 vs cpu-bf16: total {float(np.linalg.norm(out['gpu-bf16'] - out['cpu-bf16']) / np.linalg.norm(out['cpu-bf16'])):.4f}"
              f"  row median {np.median(e):.4f}  max {e.max():.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
