"""What a user's generate() gets per token on the GPU, beside the bench's forward-only loop
(issue 12): Engine.generate of 128 tokens after a 64-token prompt, greedy and with the default
sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), tok/s from eng.stats (generation
only). Each mode runs with the fused draw (ops/cuda/draw.py, MINFER_FUSED_DRAW=1) and the torch
draw (=0) alternated in one process (A/B pairs, the first pair a warm-up left out), and the
tokens of both must be the same.   python tools/gen_speed.py Q7.gguf [pairs]"""
import statistics
import sys
import time

import torch

from minfer.runtime.engine import Engine

eng = Engine.load(sys.argv[1], device="cuda", ctx=4096, progress=False)
pairs = int(sys.argv[2]) if len(sys.argv) > 2 else 4
base = eng.switches
prompt = [100 + (i * 7919) % 50000 for i in range(64)]
bad = 0
for name, kw in (("greedy", {"temperature": 0}), ("default sampling", {"seed": 1})):
    rates = {"0": [], "1": []}
    toks = {}
    for i in range(pairs + 1):
        for side in ("0", "1"):
            eng.set_switches(base.with_env({"MINFER_FUSED_DRAW": side}))
            eng.reset()
            ids = [ev.token_id for ev in eng.generate(prompt, max_new_tokens=128, **kw)]
            toks.setdefault(side, ids)
            if i:
                rates[side].append(eng.stats["gen_tokens"] / eng.stats["gen_s"])
    same = toks["0"] == toks["1"]
    bad += not same
    ratio = [b / a for a, b in zip(rates["0"], rates["1"])]
    print(f"generate(), {name}: {len(toks['1'])} tokens, same tokens fused / torch: {same}; "
          f"torch draw {', '.join(f'{r:.1f}' for r in rates['0'])}; fused draw {', '.join(f'{r:.1f}' for r in rates['1'])} "
          f"tok/s; fused/torch {statistics.mean(ratio):.4f} +- {statistics.stdev(ratio) if len(ratio) > 1 else 0:.4f}")
eng.set_switches(base)
tok = 5
# forward()'s own graphs (the short one below position 128, the whole-cache one above it) are
# captured in a first, untimed pass over the same positions
for rep in range(3):
    eng.reset(); eng.prefill(prompt)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for j in range(128):
        eng.forward([tok], len(prompt) + j)
    if rep:
        print(f"forward() loop as the bench, positions {len(prompt)}-{len(prompt) + 127}: "
              f"{128 / (time.perf_counter() - t0):.1f} tok/s")
sys.exit(1 if bad else 0)
