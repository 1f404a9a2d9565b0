"""The raw one-pass GEMV's 4-row tiles past the rule's 2,112 rows (Switches.gemv_raw_tile4, perf-log BA1) on the GPU:
at the 0.5B's stacked gate+up (9,728 x 896) and SmolLM2-135M's (3,072 x 576), Q5_0 / Q8_0 / Q4_0, bf16 and float32
rows, byte and halfword reads, PDL on and off: the bits of the 8-row tiles (but for Q5_0's byte reads of a float32 row: within 1e-5 of them), and within float64 reach of the gguf
package's dequantized weight; and a synthetic 0.5B-geometry model decoding the same greedy tokens with the switch
on as off."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from switch_engines import switch_engines, teacher_forced_greedy_same  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0, T.Q4_0])
@pytest.mark.parametrize("n,k", [(9728, 896), (3072, 576)])
@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hw", [False, True])
@pytest.mark.parametrize("pdl", [0, 1])
def test_tile4_gives_the_bits_of_the_rule(qt, n, k, dt, hw, pdl):
    from minfer.ops.cuda import gemv

    assert gemv.one_pass_tile(1, n, k) == (8, 1024) and gemv.one_pass_tile(1, n, k, True) == (4, 1024)
    w, ref_w = make_weight(int(qt), n, k, seed=n + k + int(qt))
    x = torch.randn(1, k, device=DEV, dtype=dt)
    poison()
    a = gemv.gemv(x, w.raw, int(qt), n, k, one_pass=1, pdl=pdl, halfwords=hw)
    b = gemv.gemv(x, w.raw, int(qt), n, k, one_pass=2, pdl=pdl, halfwords=hw)
    torch.cuda.synchronize()
    if qt == T.Q5_0 and dt == torch.float32 and not hw:
        # the one build whose sums differ between the tiles (H100, perf-log BA4: 1.4e-6 - 2.9e-6 at both shapes,
        # PDL 0 / 1): the 4-row tile's compiled order for Q5_0's byte reads of a float32 row; close, not equal
        assert (a - b).abs().max().item() <= 1e-5 * a.abs().max().item(), (a - b).abs().max().item()
    else:
        assert torch.equal(a, b), (a.float() - b.float()).abs().max().item()
    ref = x.double().cpu() @ torch.as_tensor(ref_w).double().T
    err = ((b.double().cpu() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if dt == torch.bfloat16 else 1e-5), err


def test_small_model_greedy_same_with_tile4(tmp_path):
    snap = teacher_forced_greedy_same(switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_raw_tile4", (False, True)))
    assert not snap["fallbacks"], snap["fallbacks"]
