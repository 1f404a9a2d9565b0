"""jina-bert-v2 (minfer/models/jina_bert.py) on CUDA: Engine.embed and Engine.rerank of the fixtures
tests/data/arch/jina-bert-v2{,-code,-rank} (tools/gen_jina_fixture.py; CPU: tests/models/test_jina_bert.py).

As tests/gpu/test_embed_gpu.py does for the other encoders: float32 on the GPU against llama.cpp's own vectors and
scores (tests/data/embed/goldens-jina.json.gz, the 188-token text included), and bf16 against the CPU float32 engine
within 2.5x the fixture's bf16 floor (at least 1e-2). The ALiBi attention runs in float32 on both backends (the
counted torch path attention.alibi.torch)."""

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
JINA = json.loads(gzip.decompress((DATA / "embed" / "goldens-jina.json.gz").read_bytes()))
GOLDENS = JINA["fixtures"]
# ggml's float16 GELU table (CPU: tests/models/test_jina_bert.py measures <= 5.0e-4; as modern-bert's in
# test_embed_gpu.py)
TOL = 2e-3


def path_of(name: str) -> Path:
    return DATA / "arch" / f"{name}.gguf"


def engine(name: str, device: str, act_dtype: str | None = None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(path_of(name), device=device, ctx=512, progress=False, switches=sw)


def rel(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_float32_on_the_gpu_matches_llamacpp(name):
    from minfer.ops import paths

    eng = engine(name, "cuda", "float32")
    paths.reset()
    for pooling, d in GOLDENS[name].items():
        for inp in d["inputs"]:
            got = eng.embed(inp["ids"], pooling=None if pooling == "file" else pooling, normalize=-1)
            assert rel(got, inp["embedding"]) < TOL, (name, pooling, inp["text"])
    assert "attention.alibi.torch" in paths.snapshot()["counts"]


def bf16_floor(name: str, ids: list[int], pooling: str) -> float:
    """rel(the CPU reference with bf16 activations, the CPU reference in float32) of the vector: the fixture's
    bf16 rounding floor (as tests/gpu/test_embed_gpu.py's)."""
    import torch

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    gf = GGUFFile(path_of(name))
    a, b = (Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), None, 512, switches=sw).embed(
        ids, pooling=pooling) for dt in (torch.float32, torch.bfloat16))
    return rel(b, a)


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_bf16_encoders_against_the_cpu(name):
    """bf16 on the GPU against the CPU float32 engine, within 2.5x the fixture's bf16 floor (at least 1e-2), on a
    short text and the 188-token one."""
    cpu = engine(name, "cpu")
    gpu = engine(name, "cuda")
    for inp in GOLDENS[name]["mean"]["inputs"][1:]:
        for pooling in ("mean", "cls"):
            ref = cpu.embed(inp["ids"], pooling=pooling)
            got = gpu.embed(inp["ids"], pooling=pooling)
            err, floor = rel(got, ref), bf16_floor(name, inp["ids"], pooling)
            tol = max(1e-2, 2.5 * floor)
            print(f"embed bf16 {name} {pooling} ({len(inp['ids'])} tokens): {err:.4f}, floor {floor:.4f}, "
                  f"tol {tol:.4f}")
            assert err < tol, (name, pooling, err, tol)


def test_rerank_on_the_gpu_matches_llamacpp():
    """The jina reranker's scores (cls (1, D) + bias, tanh on the [CLS] row) on CUDA in float32 against llama.cpp's
    (the CPU's test measures <= 1.5e-4), and in bf16 against the CPU float32 engine within 2.5x the bf16 floor of the
    CPU reference model (at least 1e-2 of the largest score)."""
    import torch

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches
    from minfer.tokenizer.tokenizer import Tokenizer

    name = "jina-bert-v2-rank"
    gold = JINA["rank"][name]["pairs"]

    def scores(eng):
        return [eng.rerank(p["query"], [p["document"]]).scores[0] for p in gold]

    want = [p["scores"][0] for p in gold]
    worst = max(abs(a - b) for a, b in zip(scores(engine(name, "cuda", "float32")), want))
    assert worst < 3e-3, worst
    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    gf = GGUFFile(path_of(name))
    tok = Tokenizer.from_gguf(gf)
    ref, ref16 = (scores(Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), tok, 512, switches=sw))
                  for dt in (torch.float32, torch.bfloat16))
    err, floor = rel(scores(engine(name, "cuda")), ref), rel(ref16, ref)
    tol = max(1e-2, 2.5 * floor)
    print(f"rerank bf16: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
    assert err < tol, (err, tol)
