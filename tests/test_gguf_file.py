"""GGUFFile on valid files agrees with gguf.GGUFReader (the format's reference reader)."""

from __future__ import annotations

import numpy as np
import pytest

import gguf
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile, file_type_name

from helpers_gguf import TINY_TENSORS, TINY_TOKENS, write_tiny_gguf


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf")


def test_tensors_match_gguf_reader(tiny_path):
    g = GGUFFile(tiny_path)
    ref = gguf.GGUFReader(str(tiny_path))
    assert list(g.tensors) == [t.name for t in ref.tensors]
    for t in ref.tensors:
        ti = g.tensor(t.name)
        assert ti.qtype == int(t.tensor_type)
        assert ti.shape == tuple(reversed([int(x) for x in t.shape]))
        assert ti.n_elements == int(t.n_elements) and ti.n_bytes == int(t.n_bytes)
        assert ti.offset == int(t.data_offset)
        assert ti.data.dtype == np.uint8 and ti.data.shape == (ti.n_bytes,)
        assert ti.data.tobytes() == np.asarray(t.data).tobytes()


def test_shapes_and_types_as_written(tiny_path):
    g = GGUFFile(tiny_path)
    for name, (qtype, shape) in TINY_TENSORS.items():
        assert g.tensor(name).qtype == int(qtype)
        assert g.tensor(name).shape == shape
        assert g.tensor(name).type_name == qtype.name


def test_tensor_data_is_memory_mapped(tiny_path):
    # lazy: the raw blocks are views of a file mapping, not copies in memory
    t = GGUFFile(tiny_path).tensor("blk.0.attn_q.weight")
    base = t.data
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    assert isinstance(base, np.memmap)


def test_metadata_accessors(tiny_path):
    g = GGUFFile(tiny_path)
    assert g.architecture == "llama"
    assert g.get("general.name") == "tiny-test"
    assert g.arch_get("block_count") == 1 and g.arch_get("embedding_length") == 64
    assert g.arch_get("no.such.key", 7) == 7
    assert g.get("tokenizer.ggml.tokens") == TINY_TOKENS
    assert g.require("tokenizer.ggml.bos_token_id") == 1
    with pytest.raises(MinferError, match=r"tiny\.gguf: metadata key 'llama\.nope' is missing"):
        g.require("llama.nope")
    with pytest.raises(MinferError, match=r"tiny\.gguf: tensor 'output\.weight' is missing"):
        g.tensor("output.weight")


def test_sums(tiny_path):
    g = GGUFFile(tiny_path)
    assert g.n_params() == sum(int(np.prod(s)) for _, s in TINY_TENSORS.values())
    ref = gguf.GGUFReader(str(tiny_path))
    assert g.tensor_bytes() == sum(int(t.n_bytes) for t in ref.tensors)


@pytest.mark.parametrize("ftype,name", [
    # llama.h enum llama_ftype: LLAMA_FTYPE_ALL_F32 = 0, MOSTLY_F16 = 1, MOSTLY_Q4_1 = 3,
    # MOSTLY_Q8_0 = 7, MOSTLY_Q4_K_M = 15, MOSTLY_Q6_K = 18, MOSTLY_BF16 = 32
    (0, "F32"), (1, "F16"), (3, "Q4_1"), (7, "Q8_0"), (15, "Q4_K_M"), (18, "Q6_K"), (32, "BF16"),
])
def test_file_type_name(ftype, name):
    assert file_type_name(ftype) == name


def test_file_type_name_unknown_and_absent(tiny_path, tmp_path):
    assert file_type_name(4242) == "unknown(4242)"
    assert GGUFFile(tiny_path).file_type_name() == "Q8_0"


def test_unsupported_architecture_opens_but_does_not_load(tmp_path):
    """Opening any architecture works; the models registry (the one list) refuses to run it."""
    from minfer.config import ModelConfig

    p = write_tiny_gguf(tmp_path / "gemma.gguf", arch="rwkv6")
    g = GGUFFile(p)
    assert g.architecture == "rwkv6"
    with pytest.raises(MinferError, match="architecture 'rwkv6' is not supported"):
        ModelConfig.from_gguf(g)


def _reader_metadata(path):
    ref = gguf.GGUFReader(str(path))
    return {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}


def test_metadata_equals_gguf_reader_tiny(tiny_path):
    # GGUFFile decodes metadata in its own bounds-checked walk (fast path); the reader is the reference
    assert GGUFFile(tiny_path).metadata == _reader_metadata(tiny_path)


@pytest.mark.parametrize("name", ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"])
def test_metadata_equals_gguf_reader_real(name):
    from minfer.catalog import resolve_model

    path = resolve_model(name)
    mine, ref = GGUFFile(path).metadata, _reader_metadata(path)
    assert list(mine) == list(ref)
    for k in ref:
        assert mine[k] == ref[k], k
        assert type(mine[k]) is type(ref[k]), k
