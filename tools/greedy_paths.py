"""Where greedy generate() on CUDA parts between its decode paths, and how close the call was.

    python tools/greedy_paths.py [--seeds 5 3 7] [--tokens 40]          (on the GPU)

The tiny synthetic qwen2 model of the GPU tests (tests/gpu/conftest.py: preset tiny, Q4_K_M, seed
6), greedy from a random prompt per seed, three ways: the device draw (the token chosen on the GPU,
the next step launched from it), the host draw (device_sampling off: the logits read back), and
the CPU float32 reference (cpu_quant off); then the fused device draw (no top_logprobs) on a fresh
engine and on the device run's engine again, whose cache holds the prompt. Each run asks for the top two log-probabilities, so
at the first position where two paths choose differently the table shows both paths' margin
between their first and second choice: a margin of a few 1e-3 or less is a near-tie that rounding
(bf16 activations, another kernel's sum order) may flip; a large one is a fault.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import torch


def main(argv=None) -> int:
    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.runtime.engine import Engine
    from minfer.runtime.sampling import SamplingParams
    from minfer.switches import Switches

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[5, 3, 7, 8, 9])
    ap.add_argument("--tokens", type=int, default=40)
    ap.add_argument("--prompt-len", type=int, default=11)
    a = ap.parse_args(argv)
    p = get_preset("tiny").with_overrides(arch="qwen2")
    path = tempfile.mkdtemp() + "/m.gguf"
    write_synth(path, p, "q4_k_m", seed=6, progress=False)
    engines = {
        "device": Engine.load(path, device="cuda", ctx=128, progress=False),
        "host": Engine.load(path, device="cuda", ctx=128, progress=False, switches=Switches(device_sampling=False)),
        "cpu f32": Engine.load(path, device="cpu", ctx=128, progress=False, switches=Switches(cpu_quant=False)),
    }
    faults = 0
    for seed in a.seeds:
        prompt = torch.randint(0, p.vocab, (a.prompt_len,), generator=torch.Generator().manual_seed(seed)).tolist()
        runs = {}
        for name, eng in engines.items():
            runs[name] = list(eng.generate(prompt, SamplingParams(temperature=0), max_new_tokens=a.tokens,
                                           top_logprobs=2))
        toks = {n: [e.token_id for e in r] for n, r in runs.items()}
        # the fused device draw takes no top_logprobs: its tokens alone, on a fresh engine (the same
        # history as the device run's) and again on the device run's engine, whose cache now holds
        # the prompt (generate() then recomputes only its last token, by the one-row decode path)
        fresh = Engine.load(path, device="cuda", ctx=128, progress=False)
        greedy = SamplingParams(temperature=0)
        print(f"\nprompt seed {seed}:")
        for what, eng in (("fused, fresh engine", fresh), ("fused, prompt cached", engines["device"]),
                          ("top_logprobs, prompt cached", engines["device"])):
            kw = {"top_logprobs": 2} if what.startswith("top") else {}
            got = [e.token_id for e in eng.generate(prompt, greedy, max_new_tokens=a.tokens, **kw)]
            at = next((i for i, (s, t) in enumerate(zip(got, toks["device"])) if s != t), None)
            if at is None:
                print(f"  {what}: the device run's {len(got)} tokens")
            else:
                (t1, l1), (t2, l2) = runs["device"][at].top_logprobs[:2]
                print(f"  {what}: parts from the device run at token {at} ({got[at]} vs {t1}; the device run's "
                      f"margin {t1} over {t2}: {l1 - l2:.2e})")
        del fresh
        for x, y in (("device", "host"), ("device", "cpu f32"), ("host", "cpu f32")):
            at = next((i for i, (s, t) in enumerate(zip(toks[x], toks[y])) if s != t), None)
            if at is None:
                print(f"  {x} = {y} for all {len(toks[x])} tokens")
                continue
            line = f"  {x} / {y} part at token {at}: "
            near = True
            for n in (x, y):
                e = runs[n][at]
                (t1, l1), (t2, l2) = e.top_logprobs[:2]
                line += f"{n} {t1} ({l1:.5f}) over {t2} ({l2:.5f}), margin {l1 - l2:.2e}; "
                near &= (l1 - l2) < 5e-3
            print(line + ("a near-tie" if near else "NOT a near-tie"))
            faults += not near
    return 1 if faults else 0


if __name__ == "__main__":
    sys.exit(main())
