"""Where one CPU decode token's time goes (issue 14): the 0.5B loaded as `minfer bench --device cpu`
would, a short prompt, then N single-token steps under torch.profiler; prints the ops' self CPU
time grouped, plus wall time per step. Usage:
    OMP_WAIT_POLICY=PASSIVE python bench/cpu_decode_profile.py [model] [threads] [steps]
(MINFER_* switches as usual: MINFER_CPU_QUANT=0 profiles the float32 reference)."""

from __future__ import annotations

import os
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-0.5b-instruct"
    threads = int(sys.argv[2]) if len(sys.argv) > 2 else 2
    steps = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    torch.set_num_threads(threads)
    from minfer.runtime.engine import Engine

    eng = Engine.load(model, device="cpu", progress=False)
    ids = list(range(100, 132))
    eng.forward(ids, 0)
    pos = len(ids)
    for _ in range(4):   # warm up
        eng._run([7], pos, last_only=True)
        pos += 1
    walls = []
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            t = time.perf_counter()
            eng._run([7], pos, last_only=True)
            walls.append(time.perf_counter() - t)
            pos += 1
    plain = []
    for _ in range(steps):
        t = time.perf_counter()
        eng._run([7], pos, last_only=True)
        plain.append(time.perf_counter() - t)
        pos += 1
    from minfer.ops import cpu_quant, reference

    acc = {}

    def timed(name, fn):
        def wrap(*a, **k):
            t0 = time.perf_counter()
            r = fn(*a, **k)
            acc[name] = acc.get(name, 0.0) + time.perf_counter() - t0
            return r
        return wrap

    lin, att = cpu_quant.linear, reference.decode_attention
    cpu_quant.linear = timed("linear", lambda x, p, b=None: lin(x, p, b) if not p.refine_top
                             else timed("output", lin)(x, p, b))
    reference.decode_attention = timed("attention", att)
    saved = {n: getattr(reference, n) for n in ("rope", "rms_norm", "add_rms_norm", "swiglu", "embedding")}
    for n, f in saved.items():
        setattr(reference, n, timed(n, f))
    t = time.perf_counter()
    for _ in range(steps):
        eng._run([7], pos, last_only=True)
        pos += 1
    total = time.perf_counter() - t
    cpu_quant.linear, reference.decode_attention = lin, att
    for n, f in saved.items():
        setattr(reference, n, f)
    print("wall per step, timed by perf_counter around the calls: " + ", ".join(
        f"{k} {1e3 * v / steps:.1f} ms" for k, v in acc.items()) +
        f", everything else {1e3 * (total - sum(v for k, v in acc.items() if k != 'output')) / steps:.1f} ms, "
        f"step {1e3 * total / steps:.1f} ms")
    plain.sort()
    print(f"threads {threads}: per step wall (unprofiled) median {1e3 * plain[len(plain) // 2]:.1f} ms, "
          f"best {1e3 * plain[0]:.1f} ms; profiled median {1e3 * sorted(walls)[len(walls) // 2]:.1f} ms")
    print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=30,
                                                            max_name_column_width=40, max_shapes_column_width=60))


if __name__ == "__main__":
    main()
