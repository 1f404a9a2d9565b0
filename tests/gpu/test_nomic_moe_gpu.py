"""nomic-bert-moe (minfer/models/nomic_bert_moe.py) embeddings on CUDA, as tests/gpu/test_embed_gpu.py does the other
encoders: float32 on the GPU against llama.cpp's own vectors (tests/data/embed/goldens-nomic-moe.json.gz; the CPU's test:
tests/models/test_nomic_bert_moe.py) and against the generator's numpy reference rows; bf16 against the CPU float32
engine within 2.5x the fixture's bf16 floor (at least 1e-2). The fixture's experts are (64, 32) / (32, 64) matrices,
each an ordinary QWeight to ops.linear (no MoE kernel's width rule applies); the router runs in float32."""

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
NAME = "nomic-bert-moe"
GOLDENS = json.loads(gzip.decompress((DATA / "embed" / "goldens-nomic-moe.json.gz").read_bytes()))["fixtures"]
META = json.loads((DATA / "arch" / f"{NAME}.json").read_text(encoding="utf-8"))
# ggml's float16 GELU table (test_nomic_bert_moe.py: the CPU engine measured <= 1.9e-3 from llama.cpp)
TOL = {NAME: 3e-3}


def path_of(name: str) -> Path:
    return DATA / "arch" / f"{name}.gguf"


def engine(name: str, device: str, act_dtype: str | None = None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(path_of(name), device=device, ctx=128, progress=False, switches=sw)   # the 100-id input


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


def test_float32_on_the_gpu_matches_the_reference_rows():
    """Every input's hidden rows (4 texts, 40 and 100 random ids) within 1e-4 of the generator's float64 numpy
    forward (nomic-bert-moe.npz hidden_<i>: GELU's tanh form, build_moe_ffn's routing; the CPU engine: <= 1.7e-6)."""
    z = np.load(DATA / "arch" / f"{NAME}.npz")
    eng = engine(NAME, "cuda", "float32")
    n = len([k for k in z.files if k.startswith("ids_")])
    for i in range(n):
        got = eng.embed(z[f"ids_{i}"].tolist(), pooling="none", normalize=-1)
        assert rel(got, z[f"hidden_{i}"]) < 1e-4, i


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


def test_bf16_encoder_against_the_cpu():
    """bf16 on the GPU against the CPU float32 engine, within 2.5x the fixture's bf16 floor (at least 1e-2). The input
    is the text whose routing is the most decisive (the generator's router_logit_gap_per_input: "Hello world", 0.35
    between the 2nd and 3rd expert's logits on every token; the other texts have a token within 0.05, which bf16's
    rounding may cross, sending that token to another expert on one side only)."""
    texts = GOLDENS[NAME]["mean"]["inputs"]
    gaps = META["router_logit_gap_per_input"][:len(texts)]
    inp = texts[int(np.argmax(gaps))]
    assert max(gaps) > 0.3
    cpu = engine(NAME, "cpu")
    gpu = engine(NAME, "cuda")
    for pooling in ("mean", "cls"):
        ref = cpu.embed(inp["ids"], pooling=pooling)
        got = gpu.embed(inp["ids"], pooling=pooling)
        err, floor = rel(got, ref), bf16_floor(NAME, inp["ids"], pooling)
        tol = max(1e-2, 2.5 * floor)
        print(f"embed bf16 {NAME} {pooling}: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
        assert err < tol, (NAME, pooling, err, tol)
