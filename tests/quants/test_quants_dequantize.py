"""minfer.quants.dequantize vs gguf.quants.dequantize (the reference), bit for bit.

Blocks are random bytes whose f16 scale fields are overwritten with chosen bit patterns:
random finite halves, subnormals, +-0, +-65504, and (separately) raw patterns incl. inf/NaN.
Offsets of the f16 fields are from ggml-common.h's block structs.
"""

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

# type -> byte offsets of the f16 fields inside one block (ggml-common.h)
F16_FIELDS = {
    T.Q4_0: [0],
    T.Q4_1: [0, 2],
    T.Q5_0: [0],
    T.Q5_1: [0, 2],
    T.Q8_0: [0],
    T.Q2_K: [80, 82],
    T.Q3_K: [108],
    T.Q4_K: [0, 2],
    T.Q5_K: [0, 2],
    T.Q6_K: [208],
}
BLOCK_TYPES = list(F16_FIELDS)
ALL_TYPES = [T.F32, T.F16, T.BF16, *BLOCK_TYPES]

# Edge half-precision bit patterns: 0, -0, smallest/largest subnormal, smallest normal,
# 1, -1, 65504 (max), -65504, a negative subnormal.
EDGE_F16 = np.array(
    [0x0000, 0x8000, 0x0001, 0x03FF, 0x0400, 0x3C00, 0xBC00, 0x7BFF, 0xFBFF, 0x8001], dtype=np.uint16
)


def random_finite_f16(rng, n: int) -> np.ndarray:
    """n random f16 bit patterns, all finite (exponent field != 31), 1/4 of them edge cases."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    bits = np.where((bits & 0x7C00) == 0x7C00, bits & np.uint16(0xFBFF), bits).astype(np.uint16)
    edge = rng.integers(0, len(EDGE_F16), size=n)
    pick = rng.random(n) < 0.25
    return np.where(pick, EDGE_F16[edge], bits).astype(np.uint16)


def make_blocks(rng, qtype, n_blocks: int, fill=None) -> np.ndarray:
    """(n_blocks, type_size) uint8 random blocks with finite f16 fields."""
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    if fill is None:
        raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    else:
        raw = np.full((n_blocks, ts), fill, dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        raw[:, off : off + 2] = random_finite_f16(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def assert_bits_equal(got: np.ndarray, ref: np.ndarray) -> None:
    assert got.dtype == np.float32 and got.shape == ref.shape
    g, r = got.view(np.uint32), np.ascontiguousarray(ref, dtype=np.float32).view(np.uint32)
    both_nan = np.isnan(got) & np.isnan(ref)
    bad = (g != r) & ~both_nan
    assert not bad.any(), f"{bad.sum()} values differ, first at {np.argwhere(bad)[0]}: {got[bad][:4]} vs {ref[bad][:4]}"


def reference(raw: np.ndarray, qtype) -> np.ndarray:
    with np.errstate(all="ignore"):
        return gq.dequantize(raw.reshape(1, -1), qtype).reshape(-1)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_random_blocks_with_extreme_scales_bit_exact(qtype):
    rng = np.random.default_rng(int(qtype) + 100)
    bs, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = make_blocks(rng, qtype, 3000)  # > one dequantize chunk for every type
    got = mq.dequantize(raw, qtype, (3000 * bs,))
    assert_bits_equal(got, reference(raw, qtype))
    assert np.isfinite(got).all()


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("fill", [0x00, 0xFF, 0x55, 0xAA, 0x0F, 0xF0])
def test_edge_bit_patterns_bit_exact(qtype, fill):
    rng = np.random.default_rng(7)
    bs, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = make_blocks(rng, qtype, 64, fill=fill)
    assert_bits_equal(mq.dequantize(raw, qtype, (64 * bs,)), reference(raw, qtype))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_raw_random_bytes_incl_inf_nan_scales(qtype):
    # Unpatched random bytes: scales may be inf/NaN; NaN positions must agree too.
    rng = np.random.default_rng(int(qtype))
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    n_blocks = 2048 if bs > 1 else 50000
    raw = rng.integers(0, 256, size=n_blocks * ts, dtype=np.uint8)
    assert_bits_equal(mq.dequantize(raw, qtype, (n_blocks * bs,)), reference(raw, qtype))


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_2d_shape_and_row_layout(qtype):
    rng = np.random.default_rng(3)
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 5, 3 * max(bs, 32)
    raw = make_blocks(rng, qtype, rows * cols // bs) if qtype in F16_FIELDS else None
    if raw is None:  # float types: finite random values
        vals = rng.standard_normal(rows * cols).astype(np.float32)
        raw = gq.quantize(vals, qtype).view(np.uint8) if qtype != T.F32 else vals.view(np.uint8)
    raw = raw.reshape(rows, cols // bs * ts)  # as GGUFReader hands out a tensor's bytes
    got = mq.dequantize(raw, qtype, (rows, cols), name="blk.0.x.weight")
    assert got.shape == (rows, cols)
    ref = gq.dequantize(raw, qtype)
    assert_bits_equal(got, ref.reshape(rows, cols))


@settings(max_examples=60, deadline=None)
@given(
    qtype=st.sampled_from(BLOCK_TYPES),
    seed=st.integers(0, 2**32 - 1),
    n_blocks=st.integers(1, 40),
)
def test_hypothesis_blocks(qtype, seed, n_blocks):
    rng = np.random.default_rng(seed)
    bs, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = make_blocks(rng, qtype, n_blocks)
    assert_bits_equal(mq.dequantize(raw.reshape(-1), qtype, (n_blocks * bs,)), reference(raw, qtype))


def test_enum_and_int_qtype_accepted():
    rng = np.random.default_rng(0)
    raw = make_blocks(rng, T.Q8_0, 4)
    a = mq.dequantize(raw, T.Q8_0, (128,))
    b = mq.dequantize(raw, int(T.Q8_0), (128,))
    assert_bits_equal(a, b)


def test_sizes_match_gguf_table():
    for qtype in ALL_TYPES:
        bs, ts = gguf.GGML_QUANT_SIZES[qtype]
        assert mq.block_size(qtype) == bs
        assert mq.type_size(int(qtype)) == ts
        assert mq.row_bytes(qtype, 4 * bs) == 4 * ts
        assert mq.type_name(int(qtype)) == qtype.name
        assert mq.is_supported(qtype)
    assert not mq.is_supported(T.IQ2_XXS)
    assert not mq.is_supported(12345)


@pytest.mark.parametrize("qtype", [T.IQ2_XXS, T.IQ4_NL, T.TQ1_0, T.MXFP4, T.Q8_1])
def test_unsupported_type_names_tensor_and_type(qtype):
    with pytest.raises(MinferError) as e:
        mq.dequantize(np.zeros(1024, np.uint8), qtype, (256,), name="blk.3.ffn_up.weight")
    assert "blk.3.ffn_up.weight" in str(e.value) and qtype.name in str(e.value)


def test_unknown_type_id():
    with pytest.raises(MinferError, match="type 999"):
        mq.dequantize(np.zeros(16, np.uint8), 999, (4,), name="w")


def test_wrong_length_names_expected_and_actual():
    with pytest.raises(MinferError) as e:
        mq.dequantize(np.zeros(144 * 2 - 1, np.uint8), T.Q4_K, (512,), name="output.weight")
    msg = str(e.value)
    assert "output.weight" in msg and "288" in msg and "287" in msg


def test_row_not_multiple_of_block():
    with pytest.raises(MinferError, match="multiple"):
        mq.dequantize(np.zeros(34 * 2, np.uint8), T.Q8_0, (2, 40), name="t")
    with pytest.raises(MinferError, match="multiple"):
        mq.row_bytes(T.Q4_K, 100)


@pytest.mark.parametrize("qtype", BLOCK_TYPES, ids=lambda t: t.name)
def test_block_class_without_out_buffer(qtype):
    # The per-type classes are usable directly on (n, type_size) blocks, without `out`.
    from minfer.quants.base import lookup

    rng = np.random.default_rng(9)
    raw = make_blocks(rng, qtype, 7)
    got = lookup(qtype).dequantize_blocks(raw)
    assert_bits_equal(np.ascontiguousarray(got).reshape(-1), reference(raw, qtype))


def test_float_typed_input_arrays_are_viewed_as_bytes():
    # GGUFReader hands F32/F16 tensors out as float arrays, not uint8.
    vals = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    assert_bits_equal(mq.dequantize(vals, T.F32, (3, 8)), vals)
    assert_bits_equal(mq.dequantize(vals.astype(np.float16), T.F16, (3, 8)), vals.astype(np.float16).astype(np.float32))
