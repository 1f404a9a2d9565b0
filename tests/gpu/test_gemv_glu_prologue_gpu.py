"""The q8 GEMV's GLU prologue on the GPU (Switches.gemv_glu_prologue, perf-log AW1): at Qwen2.5-0.5B's
down shape (896 x 4864, Q4_K and Q6_K, the PTX dp4a, with and without PDL) the down GEMV that makes
silu(gate) * up's q8 form in its programs gives the bits of swiglu_q8 + the GEMV, and is within the
int8 rounding of a float64 product with the gguf package's dequantized weight; and a synthetic
0.5B-geometry model decodes the same greedy tokens and logits with the switch on as off, each layer's
down taking the prologue (counted), no swiglu launch and no fallback. The Gluon kernel's prologue (its NORM 1
with GX, perf-log AX2): the 1.5B's and SmolLM3-3B's downs as the shape rule configures and lays them out, Q4_K and
Q6_K, plain and with the residual epilogue the engine uses (s, the tile sums and the next q8 row), give the
bits of swiglu_q8 + the same Gluon launch; a 1.5B-geometry model decodes bit-identically with the switch
at 2 and 0, every down on the Gluon kernel's prologue at 2, and at the default 1 (the Gluon downs keep their
swiglu launch, no fallback, perf-log AY1); the 7B's downs (a longer K range a program) are refused by name."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from switch_engines import decode_snaps, switch_engines  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402


pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [12, 14])
@pytest.mark.parametrize("pdl", [0, 1])
def test_glu_prologue_is_the_two_launches(qt, pdl):
    from minfer.ops.cuda import gemv_q8, gemv_repack

    n, k = 896, 4864
    w, ref_w = make_weight(qt, n, k, seed=qt)
    rw = gemv_repack.repack(w.raw, qt, n, k)
    g = torch.Generator(device=DEV).manual_seed(qt)
    gate = (torch.randn(1, k, device=DEV, generator=g) * 2).to(torch.bfloat16)
    up = torch.randn(1, k, device=DEV, generator=g).to(torch.bfloat16)
    ws = gemv_repack.GemvWorkspace(DEV)
    poison()
    _, q8 = gemv_q8.swiglu_q8(gate, up)
    two = gemv_q8.gemv_q8(q8, rw, out_dtype=torch.float32, ws=ws, pdl=pdl)
    poison()
    one = gemv_q8.gemv_q8(None, rw, out_dtype=torch.float32, ws=ws, pdl=pdl, glu=(gate, up))
    assert torch.equal(one, two)
    sv = torch.nn.functional.silu(gate.double()) * up.double()
    assert rel_err(one.cpu(), sv.cpu() @ ref_w.double().T) < 2e-2


def test_small_model_decode_with_the_glu_prologue(tmp_path):
    from minfer.ops import paths

    engines = switch_engines(tmp_path, "qwen2.5-0.5b", "gemv_glu_prologue", (False, True))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    la, lb = engines[True].prefill(prompt), engines[False].prefill(prompt)
    assert torch.equal(la, lb)                                # (prefill rows: no deferral)
    t = int(lb.argmax())
    paths.reset()
    for step in range(16):
        pos = len(prompt) + step
        la, lb = engines[True].forward([t], pos)[-1], engines[False].forward([t], pos)[-1]
        assert torch.equal(la, lb), step                      # the same q8 row, the same GEMV: the same bits
        t = int(lb.argmax())
    snap = paths.snapshot()
    counts = snap["counts"]
    glu = sum(v for key, v in counts.items() if key.endswith(".decode.q8glu"))
    assert counts.get("swiglu.into_gemv", 0) == glu > 0 and glu % 2 == 0, counts     # 2 layers a step
    assert not [key for key in snap["fallbacks"] if "swiglu" in key], snap["fallbacks"]
    toks = [[e.token_id for e in eng.generate(prompt, max_new_tokens=24, temperature=0)] for eng in engines.values()]
    assert toks[0] == toks[1]
    for eng in engines.values():
        eng.close()


GLUON_DOWNS = [(12, 1536, 8960), (14, 1536, 8960), (12, 2048, 11008)]


def test_the_7b_downs_are_refused_by_name():
    import types as T

    from minfer.ops.cuda import gemv_q8
    from minfer.ops.cuda.gemv_q8g_table import RULE

    for qt in (12, 14):
        rw = T.SimpleNamespace(qtype=qt, n=3584, k=18944, planes=(torch.zeros(4),) * 4, tile_rows=32)
        why = gemv_q8.glu_route(rw, True, RULE, DEV)[1]
        assert why is not None and "q8 chunks of K" in why, why


@pytest.mark.parametrize("qt,n,k", GLUON_DOWNS)
@pytest.mark.parametrize("pdl", [0, 1])
def test_gluon_glu_prologue_is_the_two_launches(qt, n, k, pdl):
    from minfer.ops import paths
    from minfer.ops.cuda import gemv_q8, gemv_repack
    from minfer.ops.cuda import gemv_q8_gluon as GL
    from minfer.ops.cuda.gemv_q8_residual import gemv_q8_residual
    from minfer.ops.cuda.gemv_q8g_table import RULE
    from minfer.ops.cuda.gemv_repack_layout import to_tiles
    from minfer.ops.cuda.plane_layout import tile_rows_for

    w, ref_w = make_weight(qt, n, k, seed=qt + n)
    rw = gemv_repack.repack(w.raw, qt, n, k)
    t = tile_rows_for(qt, n, k, RULE)
    if t:
        rw = to_tiles(rw, t)                          # as the engine stores them (plane_layout)
    assert GL.config_for(qt, n, k, RULE) is not None and gemv_q8.glu_route(rw, True, RULE, DEV)[1] is None
    g = torch.Generator(device=DEV).manual_seed(n)
    gate = (torch.randn(1, k, device=DEV, generator=g) * 2).to(torch.bfloat16)
    up = torch.randn(1, k, device=DEV, generator=g).to(torch.bfloat16)
    gate[0, 96:128] = 0.0                                 # a chunk of zeros: d = 0
    x = torch.randn(1, n, device=DEV, generator=g)
    nw = torch.rand(n, device=DEV, generator=g) + 0.5
    ws = gemv_repack.GemvWorkspace(DEV)
    kw = dict(ws=ws, pdl=pdl, gluon=True, gluon_table=RULE)
    paths.reset()
    poison()
    _, q8 = gemv_q8.swiglu_q8(gate, up)
    two = gemv_q8.gemv_q8(q8, rw, out_dtype=torch.float32, **kw)
    poison()
    one = gemv_q8.gemv_q8(None, rw, out_dtype=torch.float32, glu=(gate, up), **kw)
    assert torch.equal(one, two)
    sv = torch.nn.functional.silu(gate.double()) * up.double()
    assert rel_err(one.cpu(), sv.cpu() @ ref_w.double().T) < 2e-2
    # the residual epilogue the engine's down uses (s, each tile's sum of squares, the q8 form of s * weight)
    poison()
    r2 = gemv_q8_residual(q8, rw, x, torch.bfloat16, rq=nw, **kw)
    poison()
    r1 = gemv_q8_residual(None, rw, x, torch.bfloat16, rq=nw, glu=(gate, up), **kw)
    assert r1 is not None and r2 is not None
    assert torch.equal(r1[0], r2[0]) and torch.equal(r1[1], r2[1])
    if r2[2] is not None:
        assert torch.equal(r1[2][0], r2[2][0]) and torch.equal(r1[2][1], r2[2][1])
    snap = paths.snapshot()
    assert snap["counts"].get("gemv_q8.gluon", 0) == 4 and not snap["fallbacks"], snap


@pytest.mark.parametrize("preset", ["qwen2.5-1.5b"])
def test_gluon_models_decode_with_the_glu_prologue(tmp_path, preset):
    engines = switch_engines(tmp_path, preset, "gemv_glu_prologue", (0, 1, 2))
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    engines[2].prefill(prompt)
    engines[1].prefill(prompt)
    t = int(engines[0].prefill(prompt).argmax())
    snaps = decode_snaps(engines, len(prompt), t)
    for step in range(12):
        pos = len(prompt) + 12 + step
        la, lb = engines[2].forward([t], pos)[-1], engines[0].forward([t], pos)[-1]
        assert torch.equal(la, lb), step                      # the same q8 rows, the same launches: the same bits
        assert torch.equal(engines[1].forward([t], pos)[-1], lb), step       # the default: the swiglu launch
        t = int(lb.argmax())
    c = snaps[2]["counts"]
    glu = sum(v for key, v in c.items() if key.endswith(".decode.q8glu"))
    assert c.get("swiglu.into_gemv", 0) == glu > 0 and "swiglu.q8" not in c, c
    assert c.get("gemv_q8.triton", 0) == 0 and c.get("gemv_q8.gluon", 0) > 0, c
    assert snaps[0]["counts"].get("swiglu.q8", 0) > 0
    assert not [key for key in snaps[2]["fallbacks"] if "swiglu" in key], snaps[2]["fallbacks"]
    d = snaps[1]["counts"]         # the default (1): these Gluon downs get no deferred row, and nothing falls back
    assert d.get("swiglu.q8", 0) > 0 and "swiglu.into_gemv" not in d, d
    assert not [key for key in snaps[1]["fallbacks"] if "swiglu" in key], snaps[1]["fallbacks"]
    toks = [[e.token_id for e in eng.generate(prompt, max_new_tokens=16, temperature=0)] for eng in engines.values()]
    assert toks[0] == toks[1] == toks[2]
    for eng in engines.values():
        eng.close()
