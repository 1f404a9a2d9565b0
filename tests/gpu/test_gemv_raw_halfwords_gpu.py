"""The raw-block GEMV's halfword reads on the GPU (Switches.gemv_raw_halfwords, perf-log AY3): Q4_0 / Q5_0 /
Q8_0 at Qwen2.5-0.5B's decode shapes (the one-pass tile: q / o, q/k/v and gate/up stacked; the split
config past K 1024), float32 and bfloat16 rows, PDL on and off, against the gguf package's dequantized
weight in float64 and against the byte path; and a synthetic 0.5B-geometry model decoding the same greedy
tokens with the switch on as off, each raw launch of those types counted."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from switch_engines import decode_snaps, switch_engines  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402


pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0, T.Q4_0])
@pytest.mark.parametrize("n,k,one", [(896, 896, True), (1152, 896, True), (9728, 896, True), (333, 1024, True),
                                     (1536, 576, True), (896, 4864, False)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pdl", [0, 1])
def test_halfword_gemv(qt, n, k, one, dtype, pdl):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv

    w, ref_w = make_weight(int(qt), n, k, seed=n + k)
    x = torch.randn(1, k, device=DEV, dtype=dtype)
    ref = x.double().cpu() @ ref_w.double().T
    poison()
    paths.reset()
    hw = gemv.gemv(x, w.raw, int(qt), n, k, one_pass=one, pdl=pdl, halfwords=True, out_dtype=torch.float32)
    assert paths.snapshot()["counts"].get("gemv_raw.halfwords") == 1
    byte = gemv.gemv(x, w.raw, int(qt), n, k, one_pass=one, pdl=pdl, out_dtype=torch.float32)
    assert rel_err(hw.cpu(), ref) < 1e-5                       # (x exact in both dtypes; fp32 sums)
    assert rel_err(hw.cpu(), byte.double().cpu()) < 1e-6


def test_small_model_greedy_same_with_halfwords(tmp_path):
    engines = switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_raw_halfwords", (False, True))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    t = int(engines[False].prefill(prompt).argmax())
    engines[True].prefill(prompt)
    snaps = decode_snaps(engines, len(prompt), t)
    for step in range(12):
        pos = len(prompt) + 12 + step
        la, lb = engines[True].forward([t], pos)[-1], engines[False].forward([t], pos)[-1]
        assert rel_err(la, lb.double()) < 2e-2 and int(la.argmax()) == int(lb.argmax()), step   # (bf16 rows between)
        t = int(lb.argmax())
    assert snaps[True]["counts"].get("gemv_raw.halfwords", 0) > 0, snaps[True]["counts"]
    assert not [key for key in snaps[True]["fallbacks"] if "raw" in key], snaps[True]["fallbacks"]
    assert "gemv_raw.halfwords" not in snaps[False]["counts"]
    toks = [[e.token_id for e in eng.generate(prompt, max_new_tokens=24, temperature=0)] for eng in engines.values()]
    assert toks[0] == toks[1]
    for eng in engines.values():
        eng.close()
