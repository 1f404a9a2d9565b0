"""The eurobert encoder (minfer/models/eurobert.py; fixture: tools/gen_eurobert_fixture.py; CPU:
tests/models/test_eurobert.py) on CUDA, as tests/gpu/test_embed_gpu.py runs the other encoders: float32 on the GPU
against llama.cpp's own vectors (tests/data/embed/goldens-eurobert.json.gz), bf16 against the CPU float32 engine."""

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
NAME = "eurobert"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-eurobert.json.gz").read_bytes()))["fixtures"]
# no table-driven op (SiLU, RMSNorm, rope): llama.cpp's CPU vectors and minfer's CPU float32 ones are <= 2.4e-6 apart
# (test_eurobert.py); on the GPU, TF32-free float32 matmuls in another order: test_embed_gpu.py's default 1e-4
TOL = 1e-4


def path_of(name: str) -> Path:
    return DATA / "arch" / f"{name}.gguf"


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


def test_float32_on_the_gpu_matches_llamacpp():
    """Every pooling (mean, cls, last, none, the file's MEAN), not normalized and L2-normalized."""
    eng = engine(NAME, "cuda", "float32")
    for pooling, d in GOLDENS[NAME].items():
        p = None if pooling == "file" else pooling
        for inp in d["inputs"]:
            got = eng.embed(inp["ids"], pooling=p, normalize=-1)
            assert rel(got, inp["embedding"]) < TOL, (pooling, inp["text"])
            got = eng.embed(inp["ids"], pooling=p)
            assert rel(got, inp["embedding_normalized"]) < TOL, (pooling, inp["text"], "normalized")


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
    a, b = (Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), None, 64, switches=sw).embed(
        ids, pooling=pooling) for dt in (torch.float32, torch.bfloat16))
    return rel(b, a)


def test_bf16_against_the_cpu():
    """bf16 on the GPU against the CPU float32 engine, within 2.5x the fixture's bf16 floor (at least 1e-2); an
    encoder: no decode to follow (no lm head)."""
    cpu = engine(NAME, "cpu")
    gpu = engine(NAME, "cuda")
    inp = GOLDENS[NAME]["mean"]["inputs"][1]
    for pooling in ("mean", "cls", "last"):
        ref = cpu.embed(inp["ids"], pooling=pooling)
        got = gpu.embed(inp["ids"], pooling=pooling)
        err, floor = rel(got, ref), bf16_floor(NAME, inp["ids"], pooling)
        tol = max(1e-2, 2.5 * floor)
        print(f"embed bf16 {NAME} {pooling}: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
        assert err < tol, (NAME, pooling, err, tol)
    assert gpu.model.hidden_sink is None
