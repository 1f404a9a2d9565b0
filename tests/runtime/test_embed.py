"""Engine.embed (minfer/runtime/embed.py) against llama.cpp's own embeddings.

tests/data/embed/goldens.json comes from tools/gen_embed_goldens.py: llama.cpp's pooled hidden
rows (llama-cpp-python's Llama.embed, normalize=False) for eleven tiny fixtures (two of them BERT
encoders: bidirectional attention, the input in one forward), four pooling types
and two texts, with llama.cpp's token ids; the F32 KV cache and F32 copies of the weights, so
llama.cpp computes in float32 as minfer's reference does. Nothing in it comes from minfer.
The normalisations are checked against their formulas (common_embd_normalize) written here.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest

from minfer.errors import MinferError

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens.json.gz").read_bytes()))["fixtures"]
# ggml's GELU reads a float16 table (GGML_GELU_FP16): the GELU models agree to ~5e-4, the rest to ~1e-5
TOL = {"gemma": 2e-3, "gemma2": 2e-3, "phi2": 2e-3}
TOL |= {"bert": 2e-3, "bert-mean": 2e-3}     # the BERT encoders' ungated GELU MLP: measured <= 5e-4
CASES = [(f, p) for f, per in GOLDENS.items() for p in per]
_ENGINES: dict = {}


def path_of(name: str) -> Path:
    return DATA / "embed" / "qwen3-embed.gguf" if name == "qwen3-embed" else DATA / "arch" / f"{name}.gguf"


def engine(name: str, **sw):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    key = (name, tuple(sorted(sw.items())))
    if key not in _ENGINES:
        env = {**os.environ, "MINFER_CPU_QUANT": "0", **{k: str(v) for k, v in sw.items()}}
        _ENGINES[key] = Engine.load(path_of(name), ctx=64, progress=False, switches=Switches.from_env(env))
    return _ENGINES[key]


def rel(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name,pooling", CASES)
def test_matches_llamacpp(name, pooling):
    eng = engine(name)
    for inp in GOLDENS[name][pooling]["inputs"]:
        got = eng.embed(inp["ids"], pooling=None if pooling == "file" else pooling, normalize=-1)
        assert rel(got, inp["embedding"]) < TOL.get(name, 2e-5), (name, pooling, inp["text"])


def test_the_files_pooling_and_its_eos():
    """qwen3-embed carries qwen3.pooling_type 3 (last) and add_eos_token: the text's own tokenization
    appends the EOS, as llama.cpp's, and pooling=None reads the file's."""
    eng = engine("qwen3-embed")
    assert eng.config.pooling_type == 3
    for inp in GOLDENS["qwen3-embed"]["file"]["inputs"]:
        assert inp["ids"][-1] == 2            # the EOS llama.cpp appended
        assert eng.tokenizer.encode(inp["text"], parse_special=True) == inp["ids"]
        got = eng.embed(inp["text"], normalize=-1)
        assert rel(got, inp["embedding"]) < 2e-5
        # the same rows pooled another way are another vector (the pooling is read, not ignored)
        assert rel(eng.embed(inp["text"], pooling="mean", normalize=-1), inp["embedding"]) > 1e-2


def test_a_list_of_texts_and_ids():
    eng = engine("qwen3")
    ins = GOLDENS["qwen3"]["mean"]["inputs"]
    got = eng.embed([ins[0]["text"], ins[1]["ids"]], pooling="mean", normalize=-1)
    assert len(got) == 2
    for g, inp in zip(got, ins):
        assert rel(g, inp["embedding"]) < 2e-5


def _llama_cpp_norm(v: np.ndarray, mode: int) -> np.ndarray:
    """common/common.cpp common_embd_normalize, written out."""
    if mode == -1:
        s = 1.0
    elif mode == 0:
        s = np.abs(v).max() / 32760.0
    elif mode == 2:
        s = np.sqrt((v * v).sum())
    else:
        s = (np.abs(v) ** mode).sum() ** (1.0 / mode)
    return v * (1.0 / s if s > 0 else 0.0)


@pytest.mark.parametrize("mode", [-1, 0, 1, 2, 3])
def test_normalize_modes(mode):
    eng = engine("llama3")
    inp = GOLDENS["llama3"]["last"]["inputs"][1]
    ref = _llama_cpp_norm(np.asarray(inp["embedding"], dtype=np.float64), mode)
    got = np.asarray(eng.embed(inp["ids"], pooling="last", normalize=mode))
    assert rel(got, ref) < 2e-5
    if mode == 2:
        assert abs(np.linalg.norm(got) - 1) < 1e-6
    if mode == 0:
        assert abs(np.abs(got).max() - 32760) < 0.05


def test_default_is_unit_length_and_dimensions_cut_first():
    eng = engine("qwen3")
    inp = GOLDENS["qwen3"]["cls"]["inputs"][1]
    raw = np.asarray(inp["embedding"], dtype=np.float64)
    assert rel(eng.embed(inp["ids"], pooling="cls"), raw / np.linalg.norm(raw)) < 2e-5
    cut = eng.embed(inp["ids"], pooling="cls", dimensions=16)
    assert len(cut) == 16
    assert rel(cut, raw[:16] / np.linalg.norm(raw[:16])) < 2e-5


def test_none_gives_a_vector_per_token_each_normalised():
    eng = engine("gemma")
    inp = GOLDENS["gemma"]["none"]["inputs"][0]
    got = np.asarray(eng.embed(inp["ids"], pooling="none"))
    ref = np.asarray(inp["embedding"], dtype=np.float64)
    assert got.shape == (len(inp["ids"]), 64)
    assert rel(got, ref / np.linalg.norm(ref, axis=1, keepdims=True)) < 2e-3


@pytest.mark.parametrize("pooling", ["mean", "cls", "last", "none"])
@pytest.mark.parametrize("name", ["qwen3", "mamba"])
def test_in_prefill_chunks(name, pooling):
    """The input through the forward in chunks of 3 tokens (Switches.prefill_chunk): the same vectors
    (mamba: its recurrent state carried from chunk to chunk)."""
    eng = engine(name, MINFER_PREFILL_CHUNK=3)
    assert eng.prefill_chunk() == 3
    inp = GOLDENS[name][pooling]["inputs"][1]
    assert len(inp["ids"]) > 9
    assert rel(eng.embed(inp["ids"], pooling=pooling, normalize=-1), inp["embedding"]) < 2e-5


def test_the_engine_generates_as_before_after_an_embedding():
    """An embedding runs in the engine's cache from position 0: the next logits are a fresh engine's."""
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    eng = engine("llama3")
    ids = GOLDENS["llama3"]["mean"]["inputs"][1]["ids"]
    before = eng.logits(ids[:5]).numpy()
    eng.embed(ids, pooling="mean")
    eng.prefill(ids[:3])          # a prefix of the embedded input: the cache's rows re-used
    after = eng.logits(ids[:5]).numpy()
    fresh = Engine.load(path_of("llama3"), ctx=64, progress=False,
                        switches=Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})).logits(ids[:5]).numpy()
    assert rel(after, fresh) < 1e-6 and rel(before, fresh) < 1e-6
    # and a model's head runs again after the embeddings run took its rows
    assert eng.model.hidden_sink is None


def test_errors_name_what_is_wrong():
    eng = engine("qwen3")
    with pytest.raises(MinferError, match=r"qwen3\.pooling_type is absent.*pass pooling='mean' or 'last'"):
        eng.embed("hello")
    with pytest.raises(MinferError, match="'rank'.*not supported"):
        eng.embed("hello", pooling="rank")
    with pytest.raises(MinferError, match="pooling: expected one of"):
        eng.embed("hello", pooling="max")
    with pytest.raises(MinferError, match="normalize: expected an integer >= -1"):
        eng.embed("hello", pooling="mean", normalize=True)
    with pytest.raises(MinferError, match=r"dimensions: expected an integer in 1\.\.64"):
        eng.embed("hello", pooling="mean", dimensions=65)
    with pytest.raises(MinferError, match="non-empty list"):
        eng.embed([], pooling="mean")
    with pytest.raises(MinferError, match=r"inputs\[1\]: no tokens"):
        eng.embed(["a", ""], pooling="mean")
    with pytest.raises(MinferError, match=r"inputs\[0\]: 70 tokens do not fit in the context of 64"):
        eng.embed([[5] * 70], pooling="mean")
    with pytest.raises(MinferError, match="token id 999 is outside the vocabulary of 320"):
        eng.embed([5, 999], pooling="mean")
    with pytest.raises(MinferError, match=r"inputs\[1\]: expected a token id \(int\), got str"):
        eng.embed([5, "x"], pooling="mean")
    assert eng.model.hidden_sink is None


def test_a_non_causal_file_is_refused_by_name(tmp_path):
    """attention.causal = false (a bidirectional encoder's file): refused at load, not run causally."""
    import gguf

    from minfer.runtime.engine import Engine

    src = gguf.GGUFReader(str(path_of("qwen3")))
    dst = tmp_path / "bidir.gguf"
    w = gguf.GGUFWriter(str(dst), "qwen3")
    for key, f in src.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vt = f.types[0]
        w.add_key_value(key, f.contents(), vt, sub_type=f.types[1] if vt == gguf.GGUFValueType.ARRAY else None)
    w.add_causal_attention(False)
    for t in src.tensors:
        w.add_tensor(t.name, t.data, raw_shape=[int(d) for d in reversed(t.shape)], raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(MinferError, match=r"bidir\.gguf: qwen3\.attention\.causal is false"):
        Engine.load(dst, ctx=32, progress=False)


def test_cli_prints_a_json_list_a_line(capsys, monkeypatch):
    """`minfer embed`: the file's pooling, one JSON list a line, llama.cpp's unit vectors; a chat model's file
    without --pooling is an error naming the flag."""
    from minfer.cli import main

    monkeypatch.setenv("MINFER_CPU_QUANT", "0")
    ins = GOLDENS["qwen3-embed"]["file"]["inputs"]
    assert main(["embed", "-m", str(path_of("qwen3-embed")), "--device", "cpu", ins[0]["text"], ins[1]["text"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    for line, inp in zip(lines, ins):
        raw = np.asarray(inp["embedding"], dtype=np.float64)
        assert rel(json.loads(line), raw / np.linalg.norm(raw)) < 2e-5
    assert main(["embed", "-m", str(path_of("qwen3")), "--device", "cpu", "hello"]) == 1
    assert "give --pooling mean or last" in capsys.readouterr().err
