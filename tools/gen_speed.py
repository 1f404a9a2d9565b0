"""What a user's generate() gets per token on the GPU, beside the bench's forward-only loop
(issue 12): Engine.generate of 128 tokens after a 64-token prompt, greedy and with the default
sampling (temperature 0.8, top-k 40, top-p 0.95, min-p 0.05), 3 runs each; tok/s from
eng.stats (generation only).   python tools/gen_speed.py Q7.gguf"""
import sys
import time

import torch

from minfer.runtime.engine import Engine

eng = Engine.load(sys.argv[1], device="cuda", ctx=4096, progress=False)
prompt = [100 + (i * 7919) % 50000 for i in range(64)]
for name, kw in (("greedy", {"temperature": 0}), ("default sampling", {"seed": 1})):
    rates = []
    for _ in range(4):
        eng.reset()
        n = sum(1 for _ in eng.generate(prompt, max_new_tokens=128, **kw))
        rates.append(eng.stats["gen_tokens"] / eng.stats["gen_s"])
    print(f"generate(), {name}: {n} tokens, " + ", ".join(f"{r:.1f}" for r in rates[1:]) + " tok/s")
tok = 5
eng.reset(); eng.prefill(prompt)
torch.cuda.synchronize(); t0 = time.perf_counter()
for j in range(128):
    eng.forward([tok], len(prompt) + j)
print(f"forward() loop as the bench: {128 / (time.perf_counter() - t0):.1f} tok/s")
