"""minfer.quants.quantize: bit-exact vs gguf.quants.quantize where gguf has a quantizer
(F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1); for the k-quants (no reference quantizer in gguf)
the blocks are decoded by gguf's independent dequantizer and checked against error bounds."""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import minfer.quants as mq
from minfer.errors import MinferError

T = gguf.GGMLQuantizationType
EXACT_TYPES = [T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1]
K_TYPES = [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]
# Levels per group minus one: the quantization step of a group is about range / NMAX.
NMAX = {T.Q2_K: 3, T.Q3_K: 7, T.Q4_K: 15, T.Q5_K: 31, T.Q6_K: 63}
SYMMETRIC = {T.Q3_K, T.Q6_K}  # levels over [-amax, amax]; the others over [min(x,0), max(x,0)]


def awkward_rows(rng, rows: int, cols: int) -> np.ndarray:
    """Random rows with varied scales plus zero runs, constants, ties and lone spikes."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    # Magnitudes stay where the f16 super-block scales are normal numbers: below ~1e-3 the
    # k-quants' d = max_scale / 63 (or / 128) becomes an f16 subnormal and loses precision
    # in llama.cpp just the same.
    x *= np.exp(rng.uniform(-3, 8, size=(rows, 1))).astype(np.float32)
    x[0] = 0.0
    x[1] = 2.5
    x[2] = -0.25
    x[3, ::2] = 1.0
    x[3, 1::2] = -1.0  # |max| tie between + and -
    x[4, :] = 0.0
    x[4, 7] = -3.0  # lone negative spike
    x[5] = rng.integers(-8, 8, size=cols).astype(np.float32)  # exact grid values
    return x


def gguf_quantize(x: np.ndarray, qtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return np.asarray(gq.quantize(x, qtype)).view(np.uint8).reshape(x.shape[0], -1)


@pytest.mark.parametrize("qtype", EXACT_TYPES, ids=lambda t: t.name)
def test_quantize_bit_exact_vs_gguf(qtype):
    rng = np.random.default_rng(int(qtype))
    x = awkward_rows(rng, 40, 1024)
    got = mq.quantize(x, qtype)
    assert got.dtype == np.uint8 and got.shape == (40, mq.row_bytes(qtype, 1024))
    np.testing.assert_array_equal(got, gguf_quantize(x, qtype))


@settings(max_examples=40, deadline=None)
@given(qtype=st.sampled_from(EXACT_TYPES), seed=st.integers(0, 2**32 - 1), log_scale=st.floats(-20, 15))
def test_hypothesis_quantize_bit_exact(qtype, seed, log_scale):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 64)) * np.exp(log_scale)).astype(np.float32)
    np.testing.assert_array_equal(mq.quantize(x, qtype), gguf_quantize(x, qtype))


def test_1d_input_is_one_row():
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    q = mq.quantize(x, T.Q8_0)
    assert q.shape == (1, 68)
    np.testing.assert_array_equal(q, gguf_quantize(x[None], T.Q8_0))


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_kquant_round_trip_error_bound(qtype):
    rng = np.random.default_rng(int(qtype))
    x = awkward_rows(rng, 24, 1024)
    q = mq.quantize(x, qtype)
    assert q.shape == (24, mq.row_bytes(qtype, 1024))
    y = gq.dequantize(q, qtype).reshape(x.shape)  # independent decoder
    assert np.isfinite(y).all()
    # Per super-block: RMS error within half a quantization step of the block's range, an
    # upper bound for a correct fit (uniform rounding gives ~0.29 step; scales are 6-bit).
    xb, yb = x.reshape(-1, 256), y.reshape(-1, 256)
    if qtype in SYMMETRIC:
        rng_b = 2 * np.abs(xb).max(1)
    else:
        rng_b = np.maximum(xb.max(1), 0) - np.minimum(xb.min(1), 0)
    rms = np.sqrt(((xb - yb) ** 2).mean(1))
    assert (rms <= 0.5 * rng_b / NMAX[qtype] + 1e-30).all(), (rms / np.maximum(rng_b, 1e-30)).max()
    # and our own decoder agrees with gguf's on these blocks
    np.testing.assert_array_equal(mq.dequantize(q, qtype, x.shape), y)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_kquant_gaussian_quality(qtype):
    # Typical weights: relative RMS error of a Gaussian tensor. Bounds: the Lloyd-Max optimum
    # of ONE global quantizer with 4 / 8 / 16 / 32 / 64 levels (~0.34 / 0.19 / 0.10 / 0.05 /
    # 0.025 of the std); per-group scales, as the k-quants have, must do better than that.
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 2048)).astype(np.float32)
    y = gq.dequantize(mq.quantize(x, qtype), qtype).reshape(x.shape)
    rel = np.sqrt(((x - y) ** 2).mean()) / x.std()
    assert rel < {T.Q2_K: 0.34, T.Q3_K: 0.19, T.Q4_K: 0.1, T.Q5_K: 0.05, T.Q6_K: 0.025}[qtype], rel


@pytest.mark.parametrize("qtype", K_TYPES + EXACT_TYPES, ids=lambda t: t.name)
def test_requantize_is_nearly_idempotent(qtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((16, 512)).astype(np.float32)
    y = mq.dequantize(mq.quantize(x, qtype), qtype, x.shape)
    y2 = mq.dequantize(mq.quantize(y, qtype), qtype, x.shape)
    # Re-quantizing already-quantized values moves them by far less than the first pass did.
    assert np.sqrt(((y2 - y) ** 2).mean()) <= 0.5 * np.sqrt(((y - x) ** 2).mean()) + 1e-12


@pytest.mark.parametrize("qtype", K_TYPES + EXACT_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("value", [0.0, 1.0, -0.25, 3e-3, 7000.0])
def test_zero_and_constant_blocks(qtype, value):
    x = np.full((2, 512), value, dtype=np.float32)
    y = gq.dequantize(mq.quantize(x, qtype), qtype).reshape(x.shape)
    assert np.isfinite(y).all()
    if value == 0.0:
        assert (y == 0).all()
    else:
        # a constant is represented within a few f16 ulps / one quant step of 1/nmax
        np.testing.assert_allclose(y, value, rtol=0.07, atol=0)


def test_unsupported_quantize_targets():
    x = np.zeros((1, 256), np.float32)
    with pytest.raises(MinferError, match="IQ2_XXS"):
        mq.quantize(x, T.IQ2_XXS, name="w")
    with pytest.raises(MinferError, match="multiple"):
        mq.quantize(np.zeros((2, 100), np.float32), T.Q4_K)
    with pytest.raises(MinferError, match="1-D or 2-D"):
        mq.quantize(np.zeros((2, 2, 32), np.float32), T.Q8_0)
