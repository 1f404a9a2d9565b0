"""The raw-block GEMV reading Q4_0 / Q5_0 / Q8_0 blocks as halfwords (Switches.gemv_raw_halfwords;
dequant.decode_hw, gemv._runs_dot_hw): every field of those blocks sits at an even offset, so a run's
16 quant bytes are 8 two-byte loads and Q5_0's 16 fifth bits one, the values split into their even and
odd positions against x's. Here, in Triton's interpreter on CPU tensors: the one-pass tile and the split
config give the gguf package's dequantized product (float64) and the byte path's numbers, with float32,
bfloat16 and float16 rows (the bf16 row read as 32-bit words); the launch is counted; batched rows, the norm
prologue and the other types keep the byte path (not counted). The sm_90 build's loads:
tests/ops/test_gemv_raw_build_cpu.py."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import DENSE_MODS, QUANT_NAMES, interpreted_modules, random_weight, reference_dequant, rel_err  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(DENSE_MODS):
        yield mods


def _case(qt, n, k, seed, dtype):
    raw = random_weight(int(qt), n, k, np.random.default_rng(seed))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(seed)).to(dtype)
    ref = x.double() @ torch.from_numpy(reference_dequant(raw, int(qt), n, k)).double().T
    return torch.from_numpy(raw), x, ref


# (K, one_pass): the small models' rows in one pass (576: SmolLM2, 896: Qwen2.5-0.5B, a 1024 tile
# with a masked tail) and K past 1024 in the split config (the 0.5B's down row length 4864)
SHAPES = [(576, True), (896, True), (1024, True), (896, False), (4864, False)]


@pytest.mark.parametrize("qt", [T.Q4_0, T.Q5_0, T.Q8_0], ids=lambda v: QUANT_NAMES[int(v)])
@pytest.mark.parametrize("k,one", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["f32", "bf16", "f16"])
def test_halfwords_against_float64_and_the_byte_path(K, qt, k, one, dtype):
    from minfer.ops import paths

    g = K["gemv"]
    n = 37                                                       # a partial row tile
    raw, x, ref = _case(qt, n, k, 7 * int(qt) + k, dtype)
    paths.reset()
    hw = g.gemv(x, raw, int(qt), n, k, interpret=True, one_pass=one, halfwords=True, out_dtype=torch.float32)
    assert paths.snapshot()["counts"].get("gemv_raw.halfwords") == 1
    paths.reset()
    byte = g.gemv(x, raw, int(qt), n, k, interpret=True, one_pass=one, out_dtype=torch.float32)
    assert "gemv_raw.halfwords" not in paths.snapshot()["counts"]
    assert rel_err(hw, ref) < 1e-5
    assert rel_err(hw, byte.double()) < 1e-6                     # the same values; only the sum's order differs


def test_other_types_rows_and_the_norm_prologue_keep_the_byte_path(K):
    from minfer.ops import paths

    g = K["gemv"]
    for qt in (T.Q4_1, T.Q5_1, T.F16):                           # odd-offset or float fields: bytes as before
        raw, x, ref = _case(qt, 16, 896, int(qt), torch.float32)
        paths.reset()
        out = g.gemv(x, raw, int(qt), 16, 896, interpret=True, one_pass=True, halfwords=True)
        assert "gemv_raw.halfwords" not in paths.snapshot()["counts"] and rel_err(out, ref) < 1e-5
    raw, _, _ = _case(T.Q5_0, 16, 896, 3, torch.float32)
    x2 = torch.randn(2, 896, generator=torch.Generator().manual_seed(4))
    ref2 = x2.double() @ torch.from_numpy(reference_dequant(raw.numpy(), int(T.Q5_0), 16, 896)).double().T
    paths.reset()
    out = g.gemv(x2, raw, int(T.Q5_0), 16, 896, interpret=True, halfwords=True)          # batched rows: tl.dot
    assert "gemv_raw.halfwords" not in paths.snapshot()["counts"] and rel_err(out, ref2) < 1e-3


def test_the_linear_path_takes_the_switch(K):
    """ops.linear on a raw Q5_0 weight (one decode row): the switch's launch counted, the numbers of the
    byte path; off, not counted."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches
    from minfer.weights import QWeight

    raw, x, ref = _case(T.Q5_0, 40, 896, 11, torch.float32)
    w = QWeight("blk.0.ffn_gate.weight", int(T.Q5_0), (40, 896), raw)
    outs = {}
    for on in (False, True):
        paths.reset()
        outs[on] = K["qmatmul"].linear(x, w, None, Context(Switches(gemv_raw_halfwords=on), None))
        assert (paths.snapshot()["counts"].get("gemv_raw.halfwords", 0) == 1) == on
    assert rel_err(outs[True], ref) < 1e-5 and rel_err(outs[True], outs[False].double()) < 1e-6


def test_an_unaligned_row_is_a_counted_fallback(K):
    """A bf16 x row at an address that is no multiple of 4 (a view one element in) cannot be read as 32-bit
    words: the byte path runs, counted as the halfword path's fallback, with the same numbers."""
    from minfer.ops import paths

    g = K["gemv"]
    raw, x, ref = _case(T.Q5_0, 16, 896, 5, torch.bfloat16)
    buf = torch.empty(1, 897, dtype=torch.bfloat16)
    buf[:, 1:] = x
    xv = buf[:, 1:]
    assert xv.data_ptr() % 4 == 2
    paths.reset()
    out = g.gemv(xv, raw, int(T.Q5_0), 16, 896, interpret=True, one_pass=True, halfwords=True, out_dtype=torch.float32)
    snap = paths.snapshot()
    assert "gemv_raw.halfwords" not in snap["counts"] and any(k.startswith("gemv_raw.halfwords") for k in snap["fallbacks"])
    assert rel_err(out, ref) < 1e-5
