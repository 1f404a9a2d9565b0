"""The small models' raw-block decode on the GPU (perf-log AU2, AV1): the one-pass GEMV at Qwen2.5-0.5B's
shapes (hidden 896: its Q5_0 / Q8_0 weights) and the stacked q/k/v and gate/up groups, against the
gguf package's dequantized weights in float64, with the launch paths counted; and a synthetic
0.5B geometry model's greedy tokens the same on CUDA with the groups fused as without (the
switches off: the weight-by-weight path of before)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import rel_err  # noqa: E402
from test_kernels_gpu import make_weight, poison  # noqa: E402

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_1])
@pytest.mark.parametrize("n,k", [(896, 896), (128, 896), (4864, 896), (1536, 576), (333, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pdl", [0, 1])
def test_one_pass_gemv(qt, n, k, dtype, pdl):
    from minfer.ops.cuda import gemv

    w, ref_w = make_weight(int(qt), n, k, seed=n + k)
    x = torch.randn(1, k, device=DEV, dtype=dtype)
    ref = x.double().cpu() @ ref_w.double().T
    poison()
    out = gemv.gemv(x, w.raw, int(qt), n, k, one_pass=True, pdl=pdl)
    assert rel_err(out.cpu(), ref) < (1e-5 if dtype == torch.float32 else 1e-2)


@pytest.mark.parametrize("v_type", [T.Q5_0, T.Q8_0])
def test_qkv_group_one_launch(v_type):
    from minfer.ops import paths
    from minfer.ops.cuda import linear_many
    from minfer.ops.cuda.gemv import fuse_raw_group

    ws, refs = zip(*[make_weight(int(qt), n, 896, seed=i, name=f"blk.0.attn_{nm}.weight")
                     for i, (nm, qt, n) in enumerate((("q", T.Q5_0, 896), ("k", T.Q5_0, 128), ("v", v_type, 128)))])
    biases = [torch.randn(w.shape[0], device=DEV) for w in ws]
    x = torch.randn(1, 896, device=DEV, dtype=torch.bfloat16)
    assert fuse_raw_group(ws)
    lead = len(ws[0].raw_group[0])
    paths.reset()
    poison()
    outs = linear_many(x, ws, biases, Context(Switches(), None))
    for o, r, b in zip(outs, refs, biases):
        assert rel_err(o.cpu(), x.double().cpu() @ r.double().T + b.double().cpu()) < 1e-2
    counts = paths.snapshot()["counts"]
    launches = {p: c for p, c in counts.items()                                 # pdl.*, halfwords: launch modes
                if not p.startswith("pdl.") and p != "gemv_raw.halfwords"}
    assert launches[f"qmatmul.group{lead}.decode.raw.one_pass"] == 1 and sum(launches.values()) == 1 + (3 - lead)
    assert counts["pdl.gemv_raw"] == 1 + (3 - lead)                         # each one-row raw launch with PDL


def test_small_model_greedy_same_with_and_without(tmp_path):
    """A synthetic Qwen2.5-0.5B-geometry file (2 layers; Q5_0 / Q8_0 / Q4_K / Q6_K as the real
    file's mix): greedy tokens on CUDA with the fused groups and one-pass GEMVs (and the halfword reads and
    residual norm epilogue of the defaults) equal those with all of them off, and the paths say which ran."""
    import subprocess

    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    path = tmp_path / "s.gguf"
    subprocess.run([sys.executable, "-m", "minfer", "synth", str(path), "--preset", "qwen2.5-0.5b", "--layers", "2",
                    "--recipe", "q4_k_m", "--vocab", "4096", "--no-progress"], check=True, capture_output=True)
    toks = {}
    off = Switches(gemv_raw_fuse=False, gemv_one_pass=False, gemv_raw_pdl=False, gemv_raw_halfwords=False,
                   gemv_raw_resnorm=False)
    for name, sw in (("on", Switches()), ("off", off)):
        eng = Engine.load(str(path), device="cuda", ctx=256, progress=False, switches=sw)
        paths.reset()
        toks[name] = [e.token_id for e in eng.generate([1, 2, 3, 4, 5], max_new_tokens=24, temperature=0)]
        counts = paths.snapshot()["counts"]
        if name == "on":
            assert counts.get("qmatmul.group3.decode.raw.one_pass", 0) + counts.get(
                "qmatmul.group2.decode.raw.one_pass", 0) > 0 and counts.get("pdl.gemv_raw", 0) > 0, counts
        else:
            assert not any(".raw" in k or "one_pass" in k or "gemv_raw" in k for k in counts), counts
        eng.close()
    assert toks["on"] == toks["off"]


def test_norm_in_the_raw_groups_gives_the_same_decode(tmp_path):
    """Switches.gemv_raw_norm on a synthetic Qwen2.5-0.5B-geometry file (2 layers, the real file's type
    mix): the engine marks the model (every decode group a raw one-pass GEMV), the norms before q/k/v
    (after the first layer) and before gate/up are made by those launches (2 L - 1 a step, counted),
    nothing falls back, the greedy tokens equal the switch off's and each step's logits agree to the
    bf16 rounding of h (the sum of squares in another order may move one value by a bf16 step)."""
    import subprocess

    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    path = tmp_path / "s.gguf"
    subprocess.run([sys.executable, "-m", "minfer", "synth", str(path), "--preset", "qwen2.5-0.5b", "--layers", "2",
                    "--recipe", "q4_k_m", "--vocab", "4096", "--no-progress"], check=True, capture_output=True)
    # (the residual norm tails, on by default, make these norms in the GEMV before and take them first: off in both)
    engines = {on: Engine.load(str(path), device="cuda", ctx=256, progress=False,
                               switches=Switches(gemv_raw_norm=on, gemv_raw_resnorm=False, gemv_q8_resnorm=False))
               for on in (False, True)}
    assert engines[True].ctx.workspace.raw_prenorm == {"attn_norm", "ffn_norm"}
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    la, lb = engines[True].prefill(prompt), engines[False].prefill(prompt)
    assert torch.equal(la, lb)                                # (prefill rows: not one row, no deferral)
    t = int(lb.argmax())
    paths.reset()
    for step in range(16):
        pos = len(prompt) + step
        la, lb = engines[True].forward([t], pos)[-1], engines[False].forward([t], pos)[-1]
        assert rel_err(la, lb.double()) < 2e-2, step
        assert int(la.argmax()) == int(lb.argmax()), step
        t = int(lb.argmax())
    snap = paths.snapshot()
    counts = snap["counts"]
    # 2 L - 1 = 3 a step, counted where a step's launches are made (the decode graph's captures)
    assert counts["gemv.raw_norm"] == counts["add_rms_norm.into_raw_gemv"] > 0 and counts["gemv.raw_norm"] % 3 == 0, counts
    assert not [k for k in snap["fallbacks"] if "raw" in k], snap["fallbacks"]
    # the greedy generate() path (graphed decode) agrees too
    toks = [[e.token_id for e in eng.generate(prompt, max_new_tokens=24, temperature=0)] for eng in engines.values()]
    assert toks[0] == toks[1]
    for eng in engines.values():
        eng.close()
