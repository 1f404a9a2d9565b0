"""The torch block decoder of the peer against the gguf package's decoder, bit for bit, on
real llama.cpp-quantized tensors (Q4_K, Q6_K, Q5_0, Q8_0) and synth files (Q4_0, F16)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from minfer.bench.peer_dequant import dequantize_torch, supported
from minfer.cli import main as cli
from minfer.gguf_file import GGUFFile


def _check(t, max_rows=512):
    rows = min(t.shape[0], max_rows) if len(t.shape) == 2 else t.shape[0]
    shape = (rows, t.shape[1]) if len(t.shape) == 2 else t.shape
    n_bytes = t.n_bytes * rows // t.shape[0] if len(t.shape) == 2 else t.n_bytes
    raw = np.asarray(t.data[:n_bytes])
    ref = gguf.quants.dequantize(raw.reshape(shape[0], -1) if len(shape) == 2 else raw,
                                 gguf.GGMLQuantizationType(t.qtype)).reshape(shape)
    got = dequantize_torch(torch.from_numpy(raw.copy()), t.qtype, shape, chunk_blocks=100).numpy()
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, ref, err_msg=t.name)


def test_real_file_types():
    from minfer.catalog import resolve_model

    gf = GGUFFile(resolve_model("qwen2.5-coder-0.5b-instruct"))
    done = set()
    for t in gf.tensors.values():
        if t.type_name not in done:
            assert supported(t.qtype), t.type_name
            _check(t)
            done.add(t.type_name)
    assert done == {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"}


@pytest.mark.parametrize("recipe", ["q4_0", "f16"])
def test_synth_types(tmp_path, recipe):
    out = tmp_path / "m.gguf"
    assert cli(["synth", str(out), "--preset", "tiny", "--recipe", recipe, "--no-progress"]) == 0
    for t in GGUFFile(out).tensors.values():
        _check(t)


def test_unsupported_type_falls_back():
    assert not supported(gguf.GGMLQuantizationType.Q4_1)
