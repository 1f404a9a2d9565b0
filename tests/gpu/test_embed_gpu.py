"""Engine.embed on CUDA (runtime/embed.py): the prefill forward's hidden rows, taken at Model.head.

float32 on the GPU against llama.cpp's own vectors (tests/data/embed/goldens.json, as
tests/runtime/test_embed.py on the CPU); bf16 against the CPU float32 engine; and a decode after an
embedding (the graphed step, its head's GEMV) still gives the CPU engine's logits."""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens.json.gz").read_bytes()))["fixtures"]
# the nomic-bert and modern-bert encoders (tools/gen_bert2_fixture.py; CPU: tests/models/test_nomic_bert.py,
# test_modern_bert.py)
GOLDENS.update(json.loads(gzip.decompress((DATA / "embed" / "goldens-bert2.json.gz").read_bytes()))["fixtures"])
# ggml's float16 GELU table (test_embed.py; modern-bert's GeGLU: test_modern_bert.py)
TOL = {"gemma": 2e-3, "gemma2": 2e-3, "phi2": 2e-3, "modern-bert": 2e-3, "bert": 2e-3, "bert-mean": 2e-3}


def path_of(name: str) -> Path:
    return DATA / "embed" / "qwen3-embed.gguf" if name == "qwen3-embed" else DATA / "arch" / f"{name}.gguf"


def engine(name: str, device: str, act_dtype: str | None = None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(path_of(name), device=device, ctx=64, progress=False, switches=sw)


def rel(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_float32_on_the_gpu_matches_llamacpp(name):
    eng = engine(name, "cuda", "float32")
    for pooling, d in GOLDENS[name].items():
        for inp in d["inputs"]:
            got = eng.embed(inp["ids"], pooling=None if pooling == "file" else pooling, normalize=-1)
            assert rel(got, inp["embedding"]) < TOL.get(name, 1e-4), (name, pooling, inp["text"])


def bf16_floor(name: str, ids: list[int], pooling: str) -> float:
    """rel(the CPU reference with bf16 activations, the CPU reference in float32) of the vector: the fixture's
    bf16 rounding floor (as tests/gpu/test_arch_gpu.py's for logits)."""
    import torch

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    gf = GGUFFile(path_of(name))
    a, b = (Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), None, 64, switches=sw).embed(
        ids, pooling=pooling) for dt in (torch.float32, torch.bfloat16))
    return rel(b, a)


@pytest.mark.parametrize("name", ["qwen3", "llama3", "gemma2", "mamba"])
def test_bf16_against_the_cpu_then_decode(name):
    """bf16 on the GPU against the CPU float32 engine, within 2.5x the fixture's bf16 floor (at least 1e-2)."""
    cpu = engine(name, "cpu")
    gpu = engine(name, "cuda")
    inp = GOLDENS[name]["mean"]["inputs"][1]
    for pooling in ("mean", "last"):
        ref = cpu.embed(inp["ids"], pooling=pooling)
        got = gpu.embed(inp["ids"], pooling=pooling)
        err, floor = rel(got, ref), bf16_floor(name, inp["ids"], pooling)
        tol = max(1e-2, 2.5 * floor)
        print(f"embed bf16 {name} {pooling}: {err:.4f}, floor {floor:.4f}, ratio {err / floor:.2f}, tol {tol:.4f}")
        assert err < tol, (name, pooling, err, tol)
    # the engine's own cache after the embedding: prefill a prefix, decode two graphed steps
    ids = inp["ids"]
    lg_cpu = cpu.logits(ids[:6]).numpy()
    gpu.prefill(ids[:4])
    steps = [gpu.forward([t], 4 + i).numpy()[0] for i, t in enumerate(ids[4:6])]
    for i, s in enumerate(steps):
        assert rel(s, lg_cpu[4 + i]) < 0.05, (name, i)
    assert gpu.model.hidden_sink is None


@pytest.mark.parametrize("name", ["bert", "nomic-bert", "modern-bert"])
def test_bf16_encoders_against_the_cpu(name):
    """The encoders (no decode to follow: they have no lm head) in bf16 on the GPU against the CPU float32 engine,
    within 2.5x the fixture's bf16 floor (at least 1e-2)."""
    cpu = engine(name, "cpu")
    gpu = engine(name, "cuda")
    inp = GOLDENS[name]["mean"]["inputs"][1]
    for pooling in ("mean", "cls"):
        ref = cpu.embed(inp["ids"], pooling=pooling)
        got = gpu.embed(inp["ids"], pooling=pooling)
        err, floor = rel(got, ref), bf16_floor(name, inp["ids"], pooling)
        tol = max(1e-2, 2.5 * floor)
        print(f"embed bf16 {name} {pooling}: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
        assert err < tol, (name, pooling, err, tol)


def test_rerank_on_the_gpu_matches_llamacpp():
    """A cross-encoder's scores (Engine.rerank, the classifier head on the [CLS] row) on CUDA in float32 against
    llama.cpp's (tests/data/embed/goldens-rank.json; the CPU's test is tests/runtime/test_rerank.py: ggml's float16
    GELU table puts llama.cpp <= 9.2e-4 away), and in bf16 against the CPU float32 engine within 2.5x the bf16
    floor of the CPU reference model (at least 1e-2 of the largest score)."""
    import torch

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches
    from minfer.tokenizer.tokenizer import Tokenizer

    gold = json.loads((DATA / "embed" / "goldens-rank.json").read_text(encoding="utf-8"))["pairs"]

    def scores(eng):
        return [eng.rerank(p["query"], [p["document"]]).scores[0] for p in gold]

    want = [p["scores"][0] for p in gold]
    worst = max(abs(a - b) for a, b in zip(scores(engine("bert-rank", "cuda", "float32")), want))
    assert worst < 3e-3, worst
    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    gf = GGUFFile(path_of("bert-rank"))
    tok = Tokenizer.from_gguf(gf)
    ref, ref16 = (scores(Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), tok, 64, switches=sw))
                  for dt in (torch.float32, torch.bfloat16))
    err, floor = rel(scores(engine("bert-rank", "cuda")), ref), rel(ref16, ref)
    tol = max(1e-2, 2.5 * floor)
    print(f"rerank bf16: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
    assert err < tol, (err, tol)


def test_xlmr_on_the_gpu_matches_llamacpp():
    """An XLM-RoBERTa encoder (arch bert, a Unigram vocab: tools/gen_xlmr_fixture.py; CPU: tests/models/test_xlmr.py)
    on CUDA in float32: its pooled vectors within 2e-3 of llama.cpp's (the float16 GELU table) and, with its
    classifier head (xlmr-rank: the tanh `cls` layer, then `cls.output`), its rerank scores within 3e-3."""
    gold = json.loads(gzip.decompress((DATA / "embed" / "goldens-xlmr.json.gz").read_bytes()))
    eng = engine("xlmr", "cuda", "float32")
    for pooling, items in gold["embed"].items():
        for it in items:
            got = eng.embed(it["ids"], pooling=pooling, normalize=-1)
            assert rel(got, it["embedding"]) < 2e-3, (pooling, it["text"])
    rank = engine("xlmr-rank", "cuda", "float32")
    worst = max(abs(rank.rerank(p["query"], [p["document"]]).scores[0] - p["scores"][0]) for p in gold["pairs"])
    assert worst < 3e-3, worst
