"""IQ4_NL, IQ4_XS and MXFP4 (minfer/quants/iquants.py) against independent references.

- dequantize: bit for bit against gguf.quants.dequantize on random blocks (random bytes, the
  f16 scale made finite; every e8m0 byte is a finite scale), several shapes.
- quantize: MXFP4 bit for bit against gguf.quants.quantize. gguf has no IQ4 quantizers: IQ4_NL
  and IQ4_XS are compared with bytes made by ggml's own C reference (ggml-quants.c
  quantize_row_iq4_nl_ref / quantize_iq4_xs, no importance matrix, compiled from llama.cpp
  0.3.36's vendored sources on the dev box) on a deterministic input, and by error bounds
  through gguf's dequantizer.
- a tiny llama whose matrices are these types loads and runs on the CPU exactly as the same
  model with those matrices stored as F32 = gguf's dequantization; `minfer inspect` names them.
"""

from __future__ import annotations

import hashlib
import json
import re

import gguf
import gguf.quants as gq
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

import minfer.quants as mq
from minfer import cli
from minfer.gguf_file import GGUFFile
from minfer.models import load_model
from minfer.runtime.engine import Engine
from minfer.runtime.sampling import SamplingParams

TYPES = [T.IQ4_NL, T.IQ4_XS, T.MXFP4]
F16_AT = {T.IQ4_NL: 0, T.IQ4_XS: 0}   # byte offset of the f16 d (ggml-common.h); MXFP4: e8m0 at 0


def random_blocks(rng, qtype, n_blocks: int) -> np.ndarray:
    """(n_blocks, type_size) random bytes with a finite f16 scale (incl. subnormals and +-0)."""
    _, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    if qtype in F16_AT:
        h = rng.integers(0, 1 << 16, size=n_blocks).astype(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & np.uint16(0xFBFF), h).astype(np.uint16)
        edge = np.array([0x0000, 0x8000, 0x0001, 0xFBFF], dtype=np.uint16)   # 0, -0, subnormal, -65504
        h[:4] = edge[:len(h[:4])]
        o = F16_AT[qtype]
        raw[:, o:o + 2] = h.view(np.uint8).reshape(n_blocks, 2)
    return raw


def bits_equal(got: np.ndarray, ref: np.ndarray) -> bool:
    ref = np.ascontiguousarray(ref, dtype=np.float32).reshape(got.shape)
    return got.dtype == np.float32 and np.array_equal(got.view(np.uint32), ref.view(np.uint32))


def test_type_ids_and_sizes_match_gguf():
    for qt in TYPES:
        assert mq.is_supported(qt) and mq.type_name(int(qt)) == qt.name
        assert (mq.block_size(qt), mq.type_size(qt)) == gguf.GGML_QUANT_SIZES[qt]
    assert (int(T.IQ4_NL), int(T.IQ4_XS), int(T.MXFP4)) == (20, 23, 39)


@pytest.mark.parametrize("shape", [(1, 256), (3, 512), (17, 768), (64, 1024)])
@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_dequantize_bit_exact_vs_gguf(qtype, shape):
    rng = np.random.default_rng(int(qtype) * 1000 + shape[0])
    bs, _ = gguf.GGML_QUANT_SIZES[qtype]
    raw = random_blocks(rng, qtype, shape[0] * shape[1] // bs)
    with np.errstate(all="ignore"):
        ref = gq.dequantize(raw.reshape(shape[0], -1), qtype)
    got = mq.dequantize(raw, qtype, shape)
    assert got.shape == shape and bits_equal(got, ref)


def test_mxfp4_every_exponent_bit_exact():
    raw = np.zeros((256, 17), dtype=np.uint8)
    raw[:, 0] = np.arange(256)
    raw[:, 1:] = np.arange(16, dtype=np.uint8) * np.uint8(17)        # codes j | j << 4: all 16 values
    with np.errstate(all="ignore"):
        ref = gq.dequantize(raw.reshape(1, -1), T.MXFP4)
    got = mq.dequantize(raw, T.MXFP4, (256 * 32,))
    assert bits_equal(got, ref)
    assert np.isfinite(got[: 253 * 32]).all() and np.isinf(got[-96:]).sum() == 48   # 2^125 * 8 = inf ..


def test_wrong_byte_count_refused():
    from minfer.errors import MinferError

    with pytest.raises(MinferError, match="IQ4_XS"):
        mq.dequantize(np.zeros(135, np.uint8), T.IQ4_XS, (256,))
    with pytest.raises(MinferError, match="block size 256"):
        mq.row_bytes(T.IQ4_XS, 288)


def test_mxfp4_quantize_bit_exact_vs_gguf():
    rng = np.random.default_rng(39)
    x = rng.standard_normal((16, 512)).astype(np.float32) * np.float32(3.0)
    x[0, :32] = 0                                                     # an all-zero block: e = 0
    x[1] *= np.float32(1e-30)                                         # tiny scales
    x[2, 5] = 1e30                                                    # a huge one
    assert np.array_equal(mq.quantize(x, T.MXFP4), gq.quantize(x, T.MXFP4))


def _det_input(rows: int, cols: int) -> np.ndarray:
    """A deterministic float32 input (integer arithmetic, one exact IEEE division and two
    multiplications per value, power-of-two row scales), cubed for heavier tails."""
    i = np.arange(rows * cols, dtype=np.int64)
    x = (((i * 7919 + 13) % 2003) - 1001).astype(np.float32) / np.float32(997)
    x = x * x * x
    scale = np.float32(2.0) ** np.array([-10, 0, 5, -3], dtype=np.float32)
    return (x.reshape(rows, cols) * scale[np.arange(rows) % 4, None]).astype(np.float32)


# sha256 of the bytes that ggml's C reference (ggml-quants.c quantize_row_iq4_nl_ref and
# quantize_iq4_xs with quant_weights NULL, llama.cpp vendored in llama_cpp_python 0.3.36, built
# with gcc -O2 and called through ctypes) writes for _det_input(8, 1024); no group is all zeros
# (ggml leaves the codes of such a group unset).
C_REFERENCE_SHA256 = {
    T.IQ4_NL: "4defa3c05abb039d42eb6e7c838482853f4e15cbf7caf70bc5f257df8903c176",
    T.IQ4_XS: "5b27b46fd9d057d26c5fdef0578a4aafb0255420857b664456094f7b6a7d9ccf",
}


@pytest.mark.parametrize("qtype", [T.IQ4_NL, T.IQ4_XS], ids=lambda t: t.name)
def test_iq4_quantize_matches_ggml_c_reference(qtype):
    x = _det_input(8, 1024)
    q = mq.quantize(x, qtype)
    assert q.shape == (8, mq.row_bytes(qtype, 1024))
    assert hashlib.sha256(q.tobytes()).hexdigest() == C_REFERENCE_SHA256[qtype]


@pytest.mark.parametrize("qtype,bound", [(T.IQ4_NL, 0.09), (T.IQ4_XS, 0.09), (T.MXFP4, 0.13)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_quantize_error_through_gguf_dequantize(qtype, bound):
    rng = np.random.default_rng(int(qtype))
    x = rng.standard_normal((32, 1024)).astype(np.float32)
    x[3] *= np.float32(1e-2)
    x[4, :256] = 0
    q = mq.quantize(x, qtype)
    y = gq.dequantize(q, qtype)
    assert y.shape == x.shape and np.isfinite(y).all()
    assert (y[4, :256] == 0).all()
    for r in range(x.shape[0]):
        if r == 4:
            continue
        rel = np.linalg.norm(y[r] - x[r]) / np.linalg.norm(x[r])
        assert rel < bound, (r, rel)
    # the quantizer's grid is reproducible: requantizing its own decoded output moves nothing much
    y2 = gq.dequantize(mq.quantize(y, qtype), qtype)
    assert np.linalg.norm(y2 - y) <= 0.5 * np.linalg.norm(y - x)


# ---- a tiny model with these types, against the same model stored as F32 ----

D, FF, V, H, HKV = 256, 256, 40, 4, 2


def _matrix_blocks(rng, qtype, rows: int, cols: int, embed: bool = False) -> np.ndarray:
    """Random valid blocks of an (rows, cols) matrix with values of about cols^-0.5 (or 1 for
    the embedding): scales chosen, codes random (no minfer code involved)."""
    bs, ts = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // bs, ts), dtype=np.uint8)
    target = 1.0 if embed else cols ** -0.5
    if qtype == T.MXFP4:             # values 2^(e-128) * {0..12}: rms of the table ~ 5.5
        e = np.round(np.log2(target / 5.5)) + 128
        raw[..., 0] = rng.integers(e - 1, e + 2, size=raw.shape[:2])
    else:
        per = target / 65.0 / (18.0 if qtype == T.IQ4_XS else 1.0)   # IQ4_XS: times (ls - 32)
        d = (per * (0.5 + rng.random(raw.shape[:2]))).astype(np.float16)
        raw[..., 0:2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def _write(path, tensors: dict, as_f32: bool):
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name("tiny-iquants")
    wr.add_block_count(1)
    wr.add_context_length(64)
    wr.add_embedding_length(D)
    wr.add_feed_forward_length(FF)
    wr.add_head_count(H)
    wr.add_head_count_kv(HKV)
    wr.add_layer_norm_rms_eps(1e-5)
    wr.add_rope_freq_base(10000.0)
    for name, (qtype, val) in tensors.items():
        if qtype == T.F32:
            wr.add_tensor(name, val)
        elif as_f32:
            wr.add_tensor(name, gq.dequantize(val, qtype).astype(np.float32))   # the reference decode
        else:
            wr.add_tensor(name, val, raw_dtype=qtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


def _tiny_tensors(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    dh = D // H

    def norm(n):
        return (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    return {
        "token_embd.weight": (T.MXFP4, _matrix_blocks(rng, T.MXFP4, V, D, embed=True)),
        "blk.0.attn_norm.weight": (T.F32, norm(D)),
        "blk.0.attn_q.weight": (T.IQ4_XS, _matrix_blocks(rng, T.IQ4_XS, H * dh, D)),
        "blk.0.attn_k.weight": (T.IQ4_NL, _matrix_blocks(rng, T.IQ4_NL, HKV * dh, D)),
        "blk.0.attn_v.weight": (T.MXFP4, _matrix_blocks(rng, T.MXFP4, HKV * dh, D)),
        "blk.0.attn_output.weight": (T.IQ4_NL, _matrix_blocks(rng, T.IQ4_NL, D, H * dh)),
        "blk.0.ffn_norm.weight": (T.F32, norm(D)),
        "blk.0.ffn_gate.weight": (T.MXFP4, _matrix_blocks(rng, T.MXFP4, FF, D)),
        "blk.0.ffn_up.weight": (T.IQ4_XS, _matrix_blocks(rng, T.IQ4_XS, FF, D)),
        "blk.0.ffn_down.weight": (T.IQ4_XS, _matrix_blocks(rng, T.IQ4_XS, D, FF)),
        "output_norm.weight": (T.F32, norm(D)),
        "output.weight": (T.IQ4_NL, _matrix_blocks(rng, T.IQ4_NL, V, D)),
    }


def test_tiny_model_runs_as_its_f32_decode(tmp_path):
    tensors = _tiny_tensors()
    q_path = _write(tmp_path / "iq.gguf", tensors, as_f32=False)
    f_path = _write(tmp_path / "f32.gguf", tensors, as_f32=True)
    eq = Engine(load_model(GGUFFile(q_path), progress=False), None)
    ef = Engine(load_model(GGUFFile(f_path), progress=False), None)
    toks = [3, 17, 5, 9, 33, 1, 28, 11]
    lq, lf = eq.forward(toks, 0), ef.forward(toks, 0)
    assert lq.shape == (len(toks), V) and torch.isfinite(lq).all()
    assert torch.equal(lq, lf)
    assert lq.std() > 0.05                      # not a degenerate model: the logits vary
    greedy = SamplingParams(temperature=0)
    eq.reset()
    ef.reset()
    gq_ids = [e.token_id for e in eq.generate(toks, greedy, max_new_tokens=6)]
    gf_ids = [e.token_id for e in ef.generate(toks, greedy, max_new_tokens=6)]
    assert len(gq_ids) == 6 and gq_ids == gf_ids


def test_inspect_names_the_types(tmp_path, capsys):
    tensors = _tiny_tensors(1)
    p = _write(tmp_path / "iq.gguf", tensors, as_f32=False)
    assert cli.main(["inspect", str(p), "--json", "--tensors"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert {t["name"]: t["type"] for t in s["tensors"]} == {n: qt.name for n, (qt, _) in tensors.items()}
    ref = gguf.GGUFReader(str(p))
    assert {t["name"]: t["bytes"] for t in s["tensors"]} == {t.name: int(t.n_bytes) for t in ref.tensors}
    assert cli.main(["inspect", str(p)]) == 0
    text = capsys.readouterr().out
    for qt, n in ((T.IQ4_XS, 3), (T.IQ4_NL, 3), (T.MXFP4, 3)):
        assert re.search(rf"^\s+{qt.name}\s+{n}\s", text, re.M), text
