"""Two engines on one tiny synthetic model (qwen2, FFN 1024 so every K is a multiple of 256),
every q8 GEMV on the Gluon kernel (its table widened to the tiny model's shapes), their graphed
greedy decodes compared step by step: the check of a switch that changes the order of a sum
(tests/gpu/test_gemv_q8_gpu.py, test_norm_into_gemv_gpu.py).

The tolerance rule: the activations between layers are bf16, so a row sum on the edge of a bf16
rounding step may round the other way and carry one bf16 step (2^-8 relative) into the next
layers. Steps agree within 1e-4 until such a flip and within 2e-2 after it (a wrong kernel is off
by ~1); the first step and the median step are held to 1e-4; the greedy tokens are the same."""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import rel_err  # noqa: E402


def compare_decodes(tmp_path, monkeypatch, switches_a, switches_b, seed: int, prompt_seed: int, n_prompt: int,
                    same_prefill: bool = False, steps: int = 24, config: tuple = (32, 2, 2, 4), errs=None,
                    engines=None) -> dict:
    """Engine a (switches_a) against engine b (switches_b, None: the defaults) over `steps`
    graphed decode steps after an n_prompt-token prefill; same_prefill: the prefill logits must be
    bitwise equal (a switch that acts on decode rows only). Returns paths.snapshot() of the
    decode steps (both engines). config: the Gluon config every q8 GEMV takes. errs (a list):
    receives each step's logits relative error."""
    import dataclasses

    from minfer.bench.presets import get_preset
    from minfer.bench.synth import write_synth
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.runtime.engine import Engine

    p = dataclasses.replace(get_preset("tiny"), ffn=1024)
    path = tmp_path / "m.gguf"
    write_synth(path, p, "q4_k_m", seed=seed, progress=False)
    # (config: one Gluon config for every shape, or a function of (qtype, n, k) giving each its own)
    monkeypatch.setattr(GL, "config_for", config if callable(config) else lambda qtype, n, k, table="": config)
    a = Engine.load(str(path), device="cuda", ctx=160, progress=False, switches=switches_a)
    b = Engine.load(str(path), device="cuda", ctx=160, progress=False, switches=switches_b)
    if engines is not None:
        engines.extend((a, b))
    prompt = torch.randint(0, p.vocab, (n_prompt,), generator=torch.Generator().manual_seed(prompt_seed)).tolist()
    la, lb = a.prefill(prompt), b.prefill(prompt)
    if same_prefill:
        assert torch.equal(la, lb)
    t = int(lb.argmax())
    paths.reset()
    errs = [] if errs is None else errs
    for step in range(steps):
        pos = len(prompt) + step
        la, lb = a.forward([t], pos)[-1], b.forward([t], pos)[-1]
        errs.append(rel_err(la, lb.double()))
        assert errs[-1] < 2e-2, (step, errs)
        if int(la.argmax()) != int(lb.argmax()):
            ta, tb = la.float().topk(2).values, lb.float().topk(2).values
            raise AssertionError(f"step {step}: greedy tokens {int(la.argmax())} / {int(lb.argmax())}, logits rel err "
                                 f"{errs[-1]:.2e}, top-2 margins {float(ta[0] - ta[1]):.3e} / {float(tb[0] - tb[1]):.3e}")
        t = int(lb.argmax())
    assert errs[0] < 1e-4 and sorted(errs)[len(errs) // 2] < 1e-4, errs
    return paths.snapshot()


def assert_flip_is_near_tie(cpu, prompt: list, tc: list, tg: list) -> int | None:
    """Greedy tokens tg (a GPU engine's) against tc (the CPU reference engine `cpu`'s) after `prompt`:
    where they part, the reference's two best logits at that token must be within 5% of its logits'
    spread (bf16 or int8 activations may flip a near-tie of the reference, nothing else). Returns the
    first differing token's index, None where they agree."""
    first = next((i for i, (a, b) in enumerate(zip(tc, tg)) if a != b), None)
    if first is not None:
        cpu.reset()
        lc = cpu.forward(prompt + tc[:first], 0)[-1]
        top2 = lc.topk(2).values
        assert float(top2[0] - top2[1]) < 0.05 * float(lc.std()), (first, tc, tg)
        print(f"first flip at token {first} of {len(tc)}, a near-tie (top-2 gap {float(top2[0] - top2[1]):.4f})")
    return first
