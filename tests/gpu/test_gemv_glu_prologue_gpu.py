"""The q8 GEMV's GLU prologue on the GPU (Switches.gemv_glu_prologue, perf-log AW1): at Qwen2.5-0.5B's
down shape (896 x 4864, Q4_K and Q6_K, the PTX dp4a, with and without PDL) the down GEMV that makes
silu(gate) * up's q8 form in its programs gives the bits of swiglu_q8 + the GEMV, and is within the
int8 rounding of a float64 product with the gguf package's dequantized weight; and a synthetic
0.5B-geometry model decodes the same greedy tokens and logits with the switch on as off, each layer's
down taking the prologue (counted), no swiglu launch and no fallback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402

from minfer.switches import Switches  # noqa: E402

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
    from minfer.runtime.engine import Engine

    path = tmp_path / "s.gguf"
    subprocess.run([sys.executable, "-m", "minfer", "synth", str(path), "--preset", "qwen2.5-0.5b", "--layers", "2",
                    "--recipe", "q4_k_m", "--vocab", "4096", "--no-progress"], check=True, capture_output=True)
    engines = {on: Engine.load(str(path), device="cuda", ctx=256, progress=False,
                               switches=Switches(gemv_glu_prologue=on)) for on in (False, True)}
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
