"""A decoder reranker on CUDA (Qwen3-Reranker's layout: models/qwen3.py, models/bert.py RankHead; CPU:
tests/models/test_qwen3_rank.py) on tests/data/embed/qwen3-rank.gguf (tools/gen_qwen3_rank_fixture.py).

float32 on the GPU against llama.cpp's own outputs (tests/data/embed/goldens-qwen3-rank.json: the softmax over
(yes, no) of the last token's row through cls.output), and bf16 against the CPU float32 engine within 2.5x the
fixture's bf16 floor (as tests/gpu/test_embed_gpu.py does for embeddings)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

DATA = Path(__file__).resolve().parents[1] / "data"
FILE = DATA / "embed" / "qwen3-rank.gguf"
GOLD = json.loads((DATA / "embed" / "goldens-qwen3-rank.json").read_text(encoding="utf-8"))["pairs"]
CTX = 256          # the pairs are 126-153 tokens (the file's context_length)
TOL_F32 = 5e-4     # abs, on probabilities; the CPU's float32 reference is <= 4.5e-7 from llama.cpp


def engine(device: str, act_dtype: str | None = None):
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    if act_dtype:
        sw = replace(sw, act_dtype=act_dtype)
    return Engine.load(FILE, device=device, ctx=CTX, progress=False, switches=sw)


def rel(got, ref) -> float:
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    assert got.shape == ref.shape
    return float(np.abs(got - ref).max() / np.abs(ref).max())


def outputs(eng) -> list[list[float]]:
    """Each pair's two outputs (yes, no) with the file's pooling (rank), not normalised."""
    return [eng.embed(p["ids"], normalize=-1) for p in GOLD]


def test_float32_on_the_gpu_matches_llamacpp():
    """Engine.rerank's scores and both outputs of each pair on CUDA in float32 within TOL_F32 of llama.cpp's; the
    ranking of the documents of one query is llama.cpp's."""
    eng = engine("cuda", "float32")
    want = [p["scores"] for p in GOLD]
    got = outputs(eng)
    worst = float(np.abs(np.asarray(got) - np.asarray(want)).max())
    print(f"rerank float32 cuda: max abs miss vs llama.cpp {worst:.2e} (tol {TOL_F32:.0e})")
    assert worst < TOL_F32, worst
    assert all(abs(sum(v) - 1.0) < 1e-5 for v in got)
    same = [p for p in GOLD if p["query"] == GOLD[0]["query"]]
    r = eng.rerank(same[0]["query"], [p["document"] for p in same])
    assert all(abs(s - p["scores"][0]) < TOL_F32 for s, p in zip(r.scores, same))
    assert [i for i, _ in r.ranking] == sorted(range(len(same)), key=lambda i: -same[i]["scores"][0])


def test_bf16_against_the_cpu():
    """bf16 on the GPU against the CPU float32 engine, within 2.5x the bf16 floor of the CPU reference model (its
    outputs with bf16 activations against float32; at least 1e-2 of the largest output)."""
    import torch

    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model
    from minfer.runtime.engine import Engine
    from minfer.switches import Switches
    from minfer.tokenizer.tokenizer import Tokenizer

    sw = Switches.from_env({**os.environ, "MINFER_CPU_QUANT": "0"})
    gf = GGUFFile(FILE)
    tok = Tokenizer.from_gguf(gf)
    ref, ref16 = (outputs(Engine(load_model(gf, device="cpu", progress=False, act_dtype=dt), tok, CTX, switches=sw))
                  for dt in (torch.float32, torch.bfloat16))
    err, floor = rel(outputs(engine("cuda")), ref), rel(ref16, ref)
    tol = max(1e-2, 2.5 * floor)
    print(f"rerank bf16 qwen3-rank: {err:.4f}, floor {floor:.4f}, tol {tol:.4f}")
    assert err < tol, (err, tol)
