"""TQ1_0 and TQ2_0 (minfer/quants/tquants.py) against gguf.quants, bit for bit.

- dequantize: random bytes (codes no quantizer writes included: TQ2_0's 3, TQ1_0's bytes past 242) with a finite
  f16 d (random, subnormal, +-0, +-65504), several block counts.
- quantize: random normal rows, BitNet's ternary-times-one-scale rows (the converter's weights), ties at x = d/2
  (lroundf rounds them away from zero), all-zero blocks, 0.49999997-style near-ties.
- the ternary rows round-trip exactly (the block scale max |x| is the converter's s).
"""

from __future__ import annotations

import gguf
import gguf.quants as gq
import numpy as np
import pytest

import minfer.quants as mq
from minfer.errors import MinferError

T = gguf.GGMLQuantizationType
TYPES = [T.TQ1_0, T.TQ2_0]
D_AT = {T.TQ1_0: 52, T.TQ2_0: 64}


def random_blocks(rng, qtype, n: int) -> np.ndarray:
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n, ts), dtype=np.uint8)
    h = rng.integers(0, 1 << 16, size=n).astype(np.uint16)
    h = np.where((h & 0x7C00) == 0x7C00, h & np.uint16(0xFBFF), h).astype(np.uint16)
    h[:5] = np.array([0x0000, 0x8000, 0x0001, 0x7BFF, 0xFBFF], dtype=np.uint16)[:len(h[:5])]
    raw[:, D_AT[qtype]:D_AT[qtype] + 2] = h.view(np.uint8).reshape(n, 2)
    return raw


def bits_equal(got, ref) -> bool:
    ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(got.shape)
    return got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_registered_with_gguf_sizes():
    for qt in TYPES:
        assert mq.is_supported(qt) and mq.type_name(int(qt)) == qt.name
        assert (mq.block_size(qt), mq.type_size(qt)) == gguf.GGML_QUANT_SIZES[qt]
        assert mq.f16_offsets(qt) == (D_AT[qt],)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("n", [1, 7, 300])
def test_dequantize_bit_exact(qtype, n):
    raw = random_blocks(np.random.default_rng(n + int(qtype)), qtype, n)
    got = mq.dequantize(raw.reshape(-1), qtype, (n * 256,))
    with np.errstate(all="ignore"):
        assert bits_equal(got, gq.dequantize(raw.reshape(1, -1), qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_every_code_byte_decodes_as_ggml(qtype):
    """Every byte value in every code position, d = 1: the trit / 2-bit extraction over all 256 patterns."""
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = np.zeros((256, ts), dtype=np.uint8)
    raw[:, :D_AT[qtype]] = np.arange(256, dtype=np.uint8)[:, None]
    raw[:, D_AT[qtype]:D_AT[qtype] + 2] = np.array([0x3C00], dtype=np.uint16).view(np.uint8)
    got = mq.dequantize(raw, qtype, (256, 256))
    assert bits_equal(got, gq.dequantize(raw, qtype))
    assert set(np.unique(got)) <= ({-1.0, 0.0, 1.0} if qtype == T.TQ1_0 else {-1.0, 0.0, 1.0, 2.0})


def _inputs(rng) -> list[np.ndarray]:
    x = rng.standard_normal((16, 512)).astype(np.float32)
    tern = rng.integers(-1, 2, size=(16, 512)).astype(np.float32) * np.float32(0.0371)
    ties = np.tile(np.array([1.0, 0.5, -0.5, 0.25, -1.0, 0.49999997, -0.50000006, 0.0], np.float32), (4, 64))
    zeros = np.zeros((2, 256), np.float32)
    mixed = x.copy()
    mixed[2, :256] = 0
    mixed[3] *= np.float32(1e-30)
    return [x, tern, ties, zeros, mixed]


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_quantize_bit_exact_against_gguf(qtype):
    for x in _inputs(np.random.default_rng(int(qtype))):
        got = mq.quantize(x, qtype)
        assert got.shape == (x.shape[0], mq.row_bytes(qtype, x.shape[1]))
        assert np.array_equal(got.reshape(-1), np.asarray(gq.quantize(x, qtype)).reshape(-1))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_ternary_rows_round_trip_exactly(qtype):
    """The converter's weights (t * s, t in {-1, 0, 1}, one s per tensor, s an f16 value) come back unchanged."""
    rng = np.random.default_rng(3)
    s = np.float32(np.float16(0.0413))
    x = rng.integers(-1, 2, size=(8, 768)).astype(np.float32) * s
    x[:, ::256] = s                               # every block holds at least one +s (its max |x|)
    assert bits_equal(mq.dequantize(mq.quantize(x, qtype), qtype, x.shape), x)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_row_not_whole_blocks_is_named(qtype):
    with pytest.raises(MinferError, match=rf"blk\.0\.ffn_up\.weight.*row length 96.*{qtype.name} block size 256"):
        mq.row_bytes(qtype, 96, "blk.0.ffn_up.weight")
