"""The CPU quant formats on a real model, end to end (issue 14): perplexity (llama.cpp's protocol,
textwrap.py, -c 512) and decode tokens/s, the formats' engines loaded side by side and their
decode steps interleaved (rounds alternate the order). Modes: cpu_quant.prepare_model's int4
argument ("all", "ffn" = ffn_ + output, "off" = int8 everywhere, or fragments joined by "+",
e.g. "ffn_+output+attn_q") and "f32" (the float32 reference). Usage:
    OMP_WAIT_POLICY=PASSIVE python bench/cpu_quant_ab.py [--ppl] [--decode N] [-t T] modes..."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

TEXT = "tests/models/data/textwrap_py3117.txt"


def load(model, mode):
    from minfer.ops import cpu_quant
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    eng = Engine.load(model, device="cpu", progress=False, switches=Switches(cpu_quant=False))
    if mode != "f32":
        frags = {"all": ("",), "off": (), "ffn": ("ffn_", "output")}.get(mode)
        cpu_quant.prepare_model(eng.model, frags if frags is not None else tuple(mode.split("+")))
    return eng


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("modes", nargs="+")
    ap.add_argument("-m", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--ppl", action="store_true")
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--decode", type=int, default=0, help="decode steps per round")
    ap.add_argument("--rounds", type=int, default=4)
    a = ap.parse_args()
    torch.set_num_threads(a.t)
    if a.ppl:
        from minfer.commands.perplexity import perplexity

        text = open(TEXT).read()
        for mode in a.modes:
            eng = load(a.m, mode)
            tok = eng.tokenizer
            t = time.perf_counter()
            ppl, _, _ = perplexity(eng, tok.encode(text), 512, a.chunks, tok.add_bos, tok.bos_id,
                                   out=open(os.devnull, "w"), progress=False)
            print(f"ppl {mode:10s} {ppl:.4f}  ({time.perf_counter() - t:.1f} s, load {os.getloadavg()[0]:.2f})",
                  flush=True)
            del eng
    if a.decode:
        engs = {m: load(a.m, m) for m in a.modes}
        prompt = list(range(1000, 1032))
        pos = {}
        for m, e in engs.items():
            e.forward(prompt, 0)
            pos[m] = len(prompt)
        res = {m: [] for m in a.modes}
        for r in range(a.rounds):
            for m in (a.modes if r % 2 == 0 else a.modes[::-1]):
                e = engs[m]
                t = time.perf_counter()
                for _ in range(a.decode):
                    e._run([7], pos[m], last_only=True)
                    pos[m] += 1
                res[m].append(a.decode / (time.perf_counter() - t))
        print(f"decode, {a.t} threads, {a.rounds} rounds of {a.decode} steps, load {os.getloadavg()[0]:.2f}")
        for m in a.modes:
            print(f"  {m:10s} best {max(res[m]):6.2f} tok/s  median {statistics.median(res[m]):6.2f}  "
                  f"all {' '.join(f'{v:.1f}' for v in res[m])}")


if __name__ == "__main__":
    sys.exit(main())
