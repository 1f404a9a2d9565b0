"""ModelConfig.from_gguf on the real models (values from MODELS.md) and on broken metadata."""

from __future__ import annotations

import shutil

import pytest

import gguf
from minfer.catalog import resolve_model
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.gguf_file import GGUFFile
from models.tiny import TinySpec, write_tiny_model


def test_qwen2_config():
    c = ModelConfig.from_gguf(GGUFFile(resolve_model("qwen2.5-coder-0.5b-instruct")))
    assert (c.arch, c.n_layers, c.d_model, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab) == \
        ("qwen2", 24, 896, 4864, 14, 2, 64, 151936)
    assert c.rope.style == "neox" and c.rope.theta == 1e6 and not c.tied_output
    assert c.rms_eps == pytest.approx(1e-6) and c.context_length == 32768


def test_llama_config():
    c = ModelConfig.from_gguf(GGUFFile(resolve_model("smollm2-135m-instruct")))
    assert (c.arch, c.n_layers, c.d_model, c.ffn, c.n_heads, c.n_kv_heads, c.head_dim, c.vocab) == \
        ("llama", 30, 576, 1536, 9, 3, 64, 49152)
    assert c.rope.style == "normal" and c.tied_output


def _rewrite(src, dst, drop=(), set_=None, arch=None):
    """Copy a GGUF, dropping/overriding metadata keys, through gguf's reader and writer."""
    r = gguf.GGUFReader(str(src))
    a = arch or r.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), a)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in drop or name == "general.architecture":
            continue
        key = name.replace(r.fields["general.architecture"].contents() + ".", a + ".", 1)
        vt = f.types[0]
        if vt == gguf.GGUFValueType.ARRAY:
            w.add_array(key, f.contents())
        else:
            w.add_key_value(key, f.contents(), vt)
    for k, v in (set_ or {}).items():
        if isinstance(v, str):
            w.add_string(k, v)
        else:
            w.add_float32(k, v)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_shape=list(reversed(t.shape.tolist())), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


@pytest.fixture
def tiny(tmp_path):
    return write_tiny_model(tmp_path / "t.gguf", TinySpec())


def test_missing_key_names_file_and_key(tmp_path, tiny):
    p = _rewrite(tiny, tmp_path / "b.gguf", drop={"llama.feed_forward_length"})
    with pytest.raises(MinferError, match=r"b\.gguf.*'llama\.feed_forward_length' is missing"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_unsupported_arch(tmp_path, tiny):
    p = _rewrite(tiny, tmp_path / "g.gguf", arch="rwkv6")
    with pytest.raises(MinferError, match="architecture 'rwkv6' is not supported"):
        ModelConfig.from_gguf(GGUFFile(p))


def test_rope_scaling(tmp_path, tiny):
    p = _rewrite(tiny, tmp_path / "l.gguf", set_={"llama.rope.scaling.type": "linear",
                                                  "llama.rope.scaling.factor": 4.0})
    assert ModelConfig.from_gguf(GGUFFile(p)).rope.freq_scale == 0.25
    p = _rewrite(tiny, tmp_path / "y.gguf", set_={"llama.rope.scaling.type": "yarn",
                                                  "llama.rope.scaling.factor": 4.0})
    with pytest.raises(MinferError, match="'yarn' is not supported"):
        ModelConfig.from_gguf(GGUFFile(p))
