"""The raw-block decode GEMV of the small models (hidden 576-1024, whose weights are Q5_0 / Q8_0 and
the other 32-block types because the row is no multiple of 256): one pass over K <= 1024 with no
split-K reduce launch (Switches.gemv_one_pass), and a q/k/v or gate/up group stacked at load into
one raw tensor multiplied in one launch (gemv.fuse_raw_group, Switches.gemv_raw_fuse).

The CUDA backend's code runs in Triton's interpreter on CPU tensors; the references are
independent: the gguf package's dequantize and a float64 product (kernel_data)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from kernel_data import (DENSE_MODS, QUANT_NAMES, interpreted_modules, random_weight,  # noqa: E402
                         reference_dequant, rel_err)

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

_MODS = DENSE_MODS


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(_MODS):
        yield mods


class _Launches:
    """A kernel object's launches counted (kernel[grid](...) calls), the real kernel run."""

    def __init__(self, kern):
        self.kern, self.n = kern, 0

    def __getitem__(self, grid):
        self.n += 1
        return self.kern[grid]


def _weight(name, qt, n, k, seed):
    from minfer.weights import QWeight

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    return QWeight(name, qt, (n, k), torch.from_numpy(raw)), reference_dequant(raw, qt, n, k)


def test_one_pass_tile_rule():
    from minfer.ops.cuda import gemv

    assert gemv.one_pass_tile(1, 896, 896) == (4, 1024)        # Qwen2.5-0.5B's q / o: 224 programs
    assert gemv.one_pass_tile(1, 9728, 896) == (8, 1024)       # its gate+up stacked: 1,216 programs
    assert gemv.one_pass_tile(1, 1536, 576) == (4, 1024)       # SmolLM2's rows: K 576 in one masked tile
    assert gemv.one_pass_tile(1, 896, 4864) is None            # the down (K past 1024): the split config
    assert gemv.one_pass_tile(2, 896, 896) is None             # batched rows: the tl.dot config
    bn, bk, mp, dot, split = gemv.gemv_config(T.Q5_0, 1, 896, 896, False, one_pass=True)
    assert (bn, bk, split, dot) == (4, 1024, 1, False)
    assert gemv.gemv_config(T.Q5_0, 1, 896, 896, False)[4] == 4   # without it: 4 splits + a reduce


def test_tile4_rule():
    """Switches.gemv_raw_tile4: 4-row one-pass tiles up to 65,536 rows (gemv(one_pass=2), raw_kw), the
    lm heads past it keep 8; off, the rule above; the raw rope route asks the same rule."""
    from minfer.ops.cuda import gemv

    assert gemv.one_pass_tile(1, 9728, 896, True) == (4, 1024)       # the 0.5B's gate+up
    assert gemv.one_pass_tile(1, 3072, 576, True) == (4, 1024)       # SmolLM2-135M's
    assert gemv.one_pass_tile(1, 65536, 896, True) == (4, 1024)
    assert gemv.one_pass_tile(1, 151936, 896, True) == (8, 1024)     # the 0.5B's lm head
    assert gemv.one_pass_tile(1, 9728, 4864, True) is None           # K past 1024: no one-pass tile either way
    assert gemv.gemv_config(T.Q5_0, 1, 9728, 896, False, one_pass=2)[:2] == (4, 1024)
    assert gemv.gemv_config(T.Q5_0, 1, 9728, 896, False, one_pass=1)[:2] == (8, 1024)
    x = torch.zeros(1, 896)
    assert gemv.raw_kw(Switches(gemv_raw_tile4=True), x)["one_pass"] == 2
    assert gemv.raw_kw(Switches(gemv_raw_tile4=False), x)["one_pass"] == 1
    assert gemv.raw_kw(Switches(gemv_raw_tile4=True, gemv_one_pass=False), x)["one_pass"] == 0


@pytest.mark.parametrize("qt", [T.Q5_0, T.Q8_0, T.Q4_0])
def test_tile4_gemv_bits(K, qt):
    """A 2,200-row one-pass GEMV (8-row tiles by the rule) in 4-row tiles (one_pass=2) gives the same
    values, both within float64 reach of the gguf package's dequantized weight; halfword reads too."""
    g = K["gemv"]
    n, k = 2200, 896
    w, ref_w = _weight("w", int(qt), n, k, 7 + int(qt))
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(3))
    ref = x.double() @ torch.from_numpy(ref_w).double().T
    for hw in (False, True):
        a = g.gemv(x, w.raw, int(qt), n, k, interpret=True, one_pass=1, halfwords=hw)
        b = g.gemv(x, w.raw, int(qt), n, k, interpret=True, one_pass=2, halfwords=hw)
        assert torch.equal(a, b), (hw, (a - b).abs().max())
        assert rel_err(b.double(), ref) < 1e-5


# (type, K): the 32-block and float types at the small models' row lengths, the k-quants (whole
# 256-blocks) at the two that are multiples of 256
ONE_PASS_CASES = [(qt, k) for qt in (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16) for k in (576, 768, 896, 1024)] + \
    [(qt, k) for qt in (T.Q4_K, T.Q6_K) for k in (768, 1024)]


@pytest.mark.parametrize("qt,k", ONE_PASS_CASES, ids=lambda v: QUANT_NAMES[int(v)] if v < 100 else str(v))
def test_one_pass_gemv_against_float64(K, qt, k):
    """One launch (the reduce kernel never called), the whole row in one masked K tile, the same
    product as the gguf package's dequantized weight in float64, with the bias."""
    g = K["gemv"]
    n = 37                                                     # a partial row tile
    w, ref_w = _weight("w", int(qt), n, k, 10 * int(qt) + k)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(k))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(1))
    ref = x.double() @ torch.from_numpy(ref_w).double().T + bias.double()
    red = _Launches(g._splitk_reduce_kernel)
    real = g._splitk_reduce_kernel
    g._splitk_reduce_kernel = red
    try:
        out = g.gemv(x, w.raw, int(qt), n, k, bias=bias, interpret=True, one_pass=True)
    finally:
        g._splitk_reduce_kernel = real
    assert red.n == 0 and out.shape == (1, n)
    assert rel_err(out, ref) < 1e-5


def test_fuse_raw_group_views_and_refusals():
    from minfer.ops.cuda.gemv import fuse_raw_group

    q, _ = _weight("q", T.Q5_0, 64, 896, 1)
    k, _ = _weight("k", T.Q5_0, 16, 896, 2)
    v, _ = _weight("v", T.Q5_0, 16, 896, 3)
    before = [w.raw.clone() for w in (q, k, v)]
    assert fuse_raw_group((q, k, v))
    ws, cat = q.raw_group
    assert ws == (q, k, v) and cat.shape == (96, 896 // 32 * 22)
    for w, b in zip((q, k, v), before):                        # the same bytes, as row views of one tensor
        assert torch.equal(w.raw, b) and w.raw.untyped_storage().data_ptr() == cat.untyped_storage().data_ptr()
    # a v of another type (the Q4_K_M rule's Q8_0 fallback): q/k stacked, v apart
    q2, _ = _weight("q", T.Q5_0, 64, 896, 4)
    k2, _ = _weight("k", T.Q5_0, 16, 896, 5)
    v2, _ = _weight("v", T.Q8_0, 16, 896, 6)
    assert fuse_raw_group((q2, k2, v2)) and q2.raw_group[0] == (q2, k2) and not hasattr(v2, "raw_group")
    # refused: float weights, K that differs, one weight, a lone leading weight before another type
    f1, _ = _weight("a", T.F16, 8, 896, 7)
    f2, _ = _weight("b", T.F16, 8, 896, 8)
    assert not fuse_raw_group((f1, f2))
    a, _ = _weight("a", T.Q8_0, 8, 896, 9)
    b, _ = _weight("b", T.Q8_0, 8, 640, 10)
    assert not fuse_raw_group((a, b)) and not fuse_raw_group((a,))
    c, _ = _weight("c", T.Q5_0, 8, 896, 11)
    d, _ = _weight("d", T.Q8_0, 8, 896, 12)
    assert not fuse_raw_group((c, d)) and not hasattr(c, "raw_group")


@pytest.mark.parametrize("v_type", [T.Q5_0, T.Q8_0], ids=["v Q5_0", "v Q8_0"])
def test_linear_many_raw_group_one_launch(K, v_type):
    """The group's decode row in one raw GEMV launch (q/k stacked + a v of another type: two),
    the same numbers as weight by weight, and both switches' off states taking the old paths."""
    from minfer.ops import paths

    qm, g = K["qmatmul"], K["gemv"]
    shapes = (("q", T.Q5_0, 64), ("k", T.Q5_0, 16), ("v", int(v_type), 16))
    ws, refs = zip(*[_weight(nm, int(qt), n, 896, 20 + i) for i, (nm, qt, n) in enumerate(shapes)])
    biases = [torch.randn(w.shape[0], generator=torch.Generator().manual_seed(30 + i)) for i, w in enumerate(ws)]
    x = torch.randn(1, 896, generator=torch.Generator().manual_seed(3))
    ref = [x.double() @ torch.from_numpy(r).double().T + b.double() for r, b in zip(refs, biases)]
    assert g.fuse_raw_group(ws)
    lead = len(ws[0].raw_group[0])
    for sw, want in [(Switches(), {f"qmatmul.group{lead}.decode.raw.one_pass": 1}),
                     (Switches(gemv_one_pass=False), {f"qmatmul.group{lead}.decode.raw": 1}),
                     (Switches(gemv_raw_fuse=False), None)]:
        paths.reset()
        real = g._gemv_kernel
        launches = _Launches(real)
        g._gemv_kernel = launches
        try:
            outs = qm.linear_many(x, ws, biases, Context(sw, None))
        finally:
            g._gemv_kernel = real
        for o, r in zip(outs, ref):
            assert rel_err(o, r) < 1e-5
        counts = paths.snapshot()["counts"]
        if want is None:       # off: one launch a weight, the switch named
            assert launches.n == 3 and "qmatmul.Q5_0.decode.one_pass" in counts
            assert any("MINFER_GEMV_RAW_FUSE" in s for s in paths.snapshot()["switched_off"])
        else:
            assert launches.n == 1 + (3 - lead)
            for key, n in want.items():
                assert counts[key] == n
            if lead == 2:
                assert counts["qmatmul.Q8_0.decode" + (".one_pass" if sw.gemv_one_pass else "")] == 1


def test_model_decode_on_fused_groups(K, monkeypatch, tmp_path):
    """A qwen2 model (q/k/v biases) in Q8_0 with its decode groups fused as the engine fuses them
    on CUDA: prefill (weight by weight, on the row views) and the host-free decode step (one
    launch for q/k/v, one for gate/up a layer) equal the reference forward."""
    from kernel_data import route_to_cuda
    from models.tiny import TinySpec, write_tiny_model

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.runtime.kv_cache import KVCache

    C = K["cuda"]
    path = write_tiny_model(tmp_path / "m.gguf", TinySpec(arch="qwen2", qtype=T.Q8_0, seed=5))
    m = load_model(GGUFFile(path), progress=False)
    toks = torch.tensor([3, 17, 42, 5, 9, 33, 1, 28])
    ref_cache = KVCache.for_config(m.cfg, 32)
    ref = m.forward(toks, Step.at(0, 8, "cpu"), ref_cache)
    ref_dec = m.forward(torch.tensor([7]), Step.at(8, 1, "cpu"), ref_cache)

    assert K["gemv"].fuse_raw_groups(m) == 2 * m.cfg.n_layers
    route_to_cuda(monkeypatch, C)
    ctx = Context(Switches(), C.Workspace.for_model(m))
    cache = KVCache.for_config(m.cfg, 32)
    out = m.forward(toks, Step.at(0, 8, "cpu"), cache, ctx)
    paths.reset()
    dec = m.forward(torch.tensor([7]), Step(torch.tensor([8]), None, "all"), cache, ctx)

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    assert rel(out, ref) < 1e-5 and rel(dec, ref_dec) < 1e-5
    counts = paths.snapshot()["counts"]
    assert counts["qmatmul.group3.decode.raw.one_pass"] == m.cfg.n_layers
    assert counts["qmatmul.group2.decode.raw.one_pass"] == m.cfg.n_layers
    # weight by weight only o, down and the lm head (all K <= 1024: one pass)
    assert counts["qmatmul.Q8_0.decode.one_pass"] == 2 * m.cfg.n_layers + 1
    assert "qmatmul.Q8_0.decode" not in counts
