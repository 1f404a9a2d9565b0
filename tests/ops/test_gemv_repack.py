"""The repacked Q4_K / Q6_K planes (minfer.ops.cuda.gemv_repack): byte-exact repack, and the
GEMV / dequant kernels run by Triton's interpreter on the CPU at small shapes.

References are independent of the code under test: the gguf package's dequantize of the raw
blocks (kernel_data.reference_dequant) and torch float64 math (reference_gemv is a few torch
lines). fp32 / fp16 activations only (the interpreter computes tl.dot on bf16 wrongly).
Fixed configs: the interpreter cannot autotune.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import ModelStub, interpreted_modules, random_weight, reference_dequant, rel_err, route_to_cuda  # noqa: E402

from minfer.errors import MinferError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

TYPES = [12, 14]
NAMES = {12: "Q4_K", 14: "Q6_K"}


@pytest.fixture(scope="module")
def G():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack"]):
        yield mods["gemv_repack"]


def _weight(G, qt, n, k, seed):
    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    rw = G.repack(torch.from_numpy(raw), qt, n, k)
    return raw, rw, torch.from_numpy(reference_dequant(raw, qt, n, k))


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("n,k", [(1, 256), (7, 768), (33, 1280)])
def test_repack_byte_exact(G, qt, n, k):
    raw, rw, ref = _weight(G, qt, n, k, seed=n * 10 + qt)
    G.check_repacked(raw, rw, qt)                                      # raises on any differing bit
    got = G.dequantize_planes(rw)
    assert np.array_equal(got.view(np.uint32), ref.numpy().view(np.uint32))   # against gguf directly
    assert rw.nbytes() == n * (k // 256) * {12: 148, 14: 210}[qt]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_repack_in_row_steps_matches_whole(G, qt):
    raw, rw, _ = _weight(G, qt, 37, 512, seed=3)
    rw2 = G.repack(torch.from_numpy(raw), qt, 37, 512, rows_per_step=8)
    assert all(torch.equal(a, b) for a, b in zip(rw.planes, rw2.planes))


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("plane", [0, 1, 2])
def test_validator_catches_a_flipped_bit(G, qt, plane):
    raw, rw, _ = _weight(G, qt, 5, 512, seed=4)
    planes = [p.clone() for p in rw.planes]
    flat = planes[plane].view(torch.uint8).view(-1)
    flat[flat.numel() // 2 + 1] ^= 1 << 2                              # one bit of one value/scale
    with pytest.raises(MinferError, match=NAMES[qt]):
        G.check_repacked(raw, planes, qt, name="blk.0.ffn_down.weight")


def test_validator_rejects_wrong_shapes_and_types(G):
    raw, rw, _ = _weight(G, 12, 4, 256, seed=5)
    with pytest.raises(MinferError, match="shapes"):
        G.check_repacked(raw, rw.planes[:2], 12)
    with pytest.raises(MinferError, match="not repacked"):
        G.repack(torch.zeros(4, 34, dtype=torch.uint8), 8, 4, 32)
    assert G.is_repacked_type(12) and G.is_repacked_type(14) and not G.is_repacked_type(13)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_dequant_kernel_exact(G, qt, dtype):
    n, k = 13, 768                                                     # tail rows in the last tile
    _, rw, ref = _weight(G, qt, n, k, seed=6 + qt)
    out = torch.full((n, k + 5), float("nan"), dtype=dtype)
    G.dequantize_into(rw, out, interpret=True, tile=(4, 2))           # tail block in the last tile
    assert torch.equal(out[:, :k], ref.to(dtype))
    assert torch.isnan(out[:, k:]).all()


# (BN, BB, SPLIT, warps): one split; two splits reduced by the last program; three by the kernel
CONFIGS = [((16, 1, 1, 4), True), ((16, 2, 2, 4), True), ((16, 1, 3, 4), False)]


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("cfg,inline", CONFIGS, ids=["split1", "split2-inline", "split3-kernel"])
def test_gemv_m1(G, qt, cfg, inline):
    n, k = 37, 1280                                                    # 3 row tiles, 5 blocks
    _, rw, w = _weight(G, qt, n, k, seed=20 + qt)
    g = torch.Generator().manual_seed(qt)
    x = torch.randn(1, k, generator=g)
    out = G.gemv(x, rw, config=cfg, inline_reduce=inline, interpret=True)
    assert out.shape == (1, n) and out.dtype == torch.float32
    assert rel_err(out, G.reference_gemv(x, w)) < 1e-5


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("m,dtype,cfg", [(5, torch.float32, (16, 1, 1, 4)), (3, torch.float16, (16, 1, 2, 4)),
                                         (20, torch.float32, (32, 2, 2, 4))])
def test_gemv_small_m_dot(G, qt, m, dtype, cfg):
    n, k = 45, 768
    _, rw, w = _weight(G, qt, n, k, seed=30 + m)
    g = torch.Generator().manual_seed(m)
    x = torch.randn(m, k, generator=g).to(dtype)
    out = G.gemv(x, rw, config=cfg, interpret=True)
    assert out.shape == (m, n) and out.dtype == dtype
    assert rel_err(out, G.reference_gemv(x, w)) < (1e-5 if dtype == torch.float32 else 2e-3)


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("m", [1, 4])
@pytest.mark.parametrize("fuse", ["norm+resid", "swiglu+bias", "all"])
def test_gemv_fusions(G, qt, m, fuse):
    n, k = 21, 512
    _, rw, w = _weight(G, qt, n, k, seed=40 + m)
    g = torch.Generator().manual_seed(m + qt)
    x = torch.randn(m, k, generator=g) * 3
    kw = {}
    if "norm" in fuse or fuse == "all":
        kw.update(norm_weight=torch.randn(k, generator=g), eps=1e-5)
    if "resid" in fuse or fuse == "all":
        kw["resid"] = torch.randn(m, n, generator=g)
    if "swiglu" in fuse or fuse == "all":
        kw["up"] = torch.randn(m, k, generator=g)
    if "bias" in fuse or fuse == "all":
        kw["bias"] = torch.randn(n, generator=g)
    cfg = (16, 1, 2, 4)                                               # the epilogue after a split reduce
    out = G.gemv(x, rw, config=cfg, interpret=True, **kw)
    ref = G.reference_gemv(x, w, **kw)
    assert rel_err(out, ref) < 1e-5
    # the fused input really changed the result (the fusion is not a no-op)
    assert rel_err(out, G.reference_gemv(x, w)) > 1e-2


def test_gemv_rejects_bad_inputs(G):
    _, rw, _ = _weight(G, 12, 8, 256, seed=9)
    with pytest.raises(MinferError, match="expected"):
        G.gemv(torch.zeros(1, 512), rw, interpret=True)
    with pytest.raises(MinferError, match="up"):
        G.gemv(torch.zeros(1, 256), rw, up=torch.zeros(2, 256), interpret=True)


@pytest.fixture(scope="module")
def QM():
    names = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.qmatmul"]
    for mods in interpreted_modules(names):
        yield mods


def test_fused_group_decode(QM):
    """A declared q/k/v group of one type gets one plane set (views per weight, same bytes) and
    one GEMV at decode with its biases; a group with a Q6_K member stays apart."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.ops.cuda.workspace import Workspace
    from minfer.switches import Switches
    from minfer.weights import QWeight

    qm, gr = QM["qmatmul"], QM["gemv_repack"]
    rng = np.random.default_rng(8)
    ws, dense, groups = [], {}, []
    for layer, vt in ((0, 12), (1, 14)):
        g = []
        for name, qt, n in (("attn_q", 12, 64), ("attn_k", 12, 16), ("attn_v", vt, 16)):
            raw = random_weight(qt, n, 256, rng)
            w = QWeight(f"blk.{layer}.{name}.weight", qt, (n, 256), torch.from_numpy(raw))
            dense[w.name] = torch.from_numpy(reference_dequant(raw, qt, n, 256))
            ws.append(w)
            g.append(w)
        groups.append(tuple(g))
    gr.repack_model(ModelStub(ws, groups))
    assert groups[0][0].repacked_group[0] == groups[0] and not hasattr(groups[1][0], "repacked_group")
    assert sum(gr.planes_of(w).nbytes() for w in groups[0]) == 96 * 148
    ctx = Context(Switches(), Workspace("cpu", ws, groups))
    g = torch.Generator().manual_seed(3)
    biases = (torch.randn(64, generator=g), None, torch.randn(16, generator=g))
    for m in (1, 5):
        x = torch.randn(m, 256, generator=g)
        paths.reset()
        for grp in groups:
            outs = qm.linear_many(x, grp, biases, ctx)
            for w, o, b in zip(grp, outs, biases):
                ref = x.double() @ dense[w.name].double().T + (0 if b is None else b.double())
                assert o.shape == (m, w.shape[0]) and rel_err(o, ref) < 1e-5
        assert paths.snapshot()["counts"] == {"qmatmul.group3.decode.repacked": 1,
                                              "qmatmul.Q4_K.decode.repacked": 2, "qmatmul.Q6_K.decode.repacked": 1}


def test_qmatmul_wiring(QM):
    """repack_model replaces the raw blocks of the multiplied Q4_K/Q6_K matrices (not the
    embedding, not other types); qmatmul then counts qmatmul.<type>.decode.repacked, decodes
    the planes for prefill M (whole and in row chunks), and the raw path is told apart."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches
    from minfer.weights import QWeight

    qm, gr = QM["qmatmul"], QM["gemv_repack"]
    rng = np.random.default_rng(7)
    mk = {}
    for name, qt, n, k in [("blk.0.ffn_down.weight", 14, 40, 512), ("blk.0.attn_q.weight", 12, 33, 256),
                           ("token_embd.weight", 12, 50, 256), ("blk.0.attn_k.weight", 8, 20, 256)]:
        raw = random_weight(qt, n, k, rng)
        mk[name] = (QWeight(name, qt, (n, k), torch.from_numpy(raw)), torch.from_numpy(reference_dequant(raw, qt, n, k)))
    ws = [w for w, _ in mk.values()]
    assert gr.repack_model(ModelStub(ws, token_embd=mk["token_embd.weight"][0])) == 2
    down, wd = mk["blk.0.ffn_down.weight"]
    assert down.raw.numel() == 0 and gr.planes_of(down).nbytes() == 40 * 2 * 210   # planes replaced the blocks
    assert mk["token_embd.weight"][0].raw.numel() > 0 and mk["token_embd.weight"][0].repack_skip
    assert gr.planes_of(mk["blk.0.attn_k.weight"][0]) is None               # Q8_0: raw GEMV
    g = torch.Generator().manual_seed(1)
    for m in (1, 3, 40):                                                   # GEMV, dot GEMV, prefill
        x = torch.randn(m, 512, generator=g)
        paths.reset()
        out = qm.linear(x, down)
        assert rel_err(out, x.double() @ wd.double().T) < 1e-5
        want = "qmatmul.Q6_K.decode.repacked" if m <= 32 else "qmatmul.Q6_K.prefill"
        assert paths.snapshot()["counts"] == {want: 1}
    x = torch.randn(40, 512, generator=g)                                  # the scratch in row chunks
    out = qm.linear(x, down, None, Context(Switches(scratch_mb=0, prefetch=False, fuse_groups=False)))
    assert rel_err(out, x.double() @ wd.double().T) < 1e-5
    emb, we = mk["token_embd.weight"]                                      # tied-lm-head case: raw, no fallback
    paths.reset()
    x = torch.randn(1, 256, generator=g)
    assert rel_err(qm.linear(x, emb), x.double() @ we.double().T) < 1e-5
    snap = paths.snapshot()
    # (K = 256: the raw GEMV in one pass, gemv.one_pass_tile)
    assert snap["counts"] == {"qmatmul.Q4_K.decode.one_pass": 1} and not snap["fallbacks"] and not snap["switched_off"]
    raw_q = QWeight("blk.1.attn_q.weight", 12, (8, 256), torch.from_numpy(random_weight(12, 8, 256, rng)))
    paths.reset()                                                          # never repacked: a fallback
    qm.linear(x, raw_q)
    qm.linear(x, raw_q, None, Context(Switches(gemv_repack=False)))        # switched off: told apart
    snap = paths.snapshot()
    assert snap["counts"] == {"qmatmul.Q4_K.decode.one_pass": 2}
    assert list(snap["fallbacks"]) == ["qmatmul.Q4_K.decode.repacked (fell back because the weight was not "
                                       "repacked at load (not built by an Engine))"]
    assert len(snap["switched_off"]) == 1 and "MINFER_GEMV_REPACK" in next(iter(snap["switched_off"]))


@pytest.mark.slow
def test_model_forward_with_repacked_weights(monkeypatch, tmp_path):
    """A tiny Q4_K/Q6_K llama through the CUDA backend's code (interpreter) after repack_model:
    a 6-token prefill (the tl.dot GEMV) and a decode step run the repacked GEMV on every matrix
    but the embedding, and both match the reference forward."""
    from gguf import GGMLQuantizationType as T

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from models.tiny import TinySpec, write_tiny_model

    from minfer.gguf_file import GGUFFile
    from minfer.models import Step, load_model
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.quants import dequantize, quantize
    from minfer.runtime.kv_cache import KVCache
    from minfer.switches import Switches

    names = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.qmatmul",
             "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention", "minfer.ops.cuda"]
    gen = interpreted_modules(names)
    mods = next(gen)
    try:
        C = mods["cuda"]
        path = write_tiny_model(tmp_path / "m.gguf", TinySpec(n_layers=1, d_model=256, ffn=256, n_heads=4,
                                                              n_kv_heads=2, qtype=T.F32, seed=5))
        m = load_model(GGUFFile(path), progress=False)
        for w in m.qweights():        # the matrices as Q4_K (ffn_down, lm head: Q6_K), like a Q4_K_M file
            if w is m.token_embd:
                continue
            qt = 14 if "ffn_down" in w.name or w.name.startswith("output") else 12
            raw = quantize(w.dense.numpy(), qt)
            w.qtype, w.raw = qt, torch.from_numpy(raw)
            w.dense = torch.from_numpy(np.ascontiguousarray(dequantize(raw, qt, w.shape)))
        toks = torch.tensor([3, 17, 42, 5, 9, 33])                        # M = 6: the tl.dot GEMV
        ref_cache = KVCache.for_config(m.cfg, 64)
        ref = m.forward(toks, Step.at(0, 6, "cpu"), ref_cache)
        ref_dec = m.forward(torch.tensor([7]), Step.at(6, 1, "cpu"), ref_cache)
        assert mods["gemv_repack"].repack_model(m) == 7 + 1                   # 7 matrices + the lm head
        route_to_cuda(monkeypatch, C)
        ctx = Context(Switches(), C.Workspace.for_model(m))
        cache = KVCache.for_config(m.cfg, 64)
        paths.reset()
        out = m.forward(toks, Step.at(0, 6, "cpu"), cache, ctx)
        dec = m.forward(torch.tensor([7]), Step(torch.tensor([6]), None, "all"), cache, ctx)
        assert rel_err(out, ref) < 1e-5 and rel_err(dec, ref_dec) < 1e-5
        snap = paths.snapshot()
        rp = {k: v for k, v in snap["counts"].items() if k.endswith(".decode.repacked")}
        # two forwards x (q/k/v and gate/up each as one GEMV over fused planes; o in Q4_K; down and
        # the lm head in Q6_K)
        assert rp == {"qmatmul.group3.decode.repacked": 2, "qmatmul.group2.decode.repacked": 2,
                      "qmatmul.Q4_K.decode.repacked": 2,
                      "qmatmul.Q6_K.decode.repacked": 2 * 2}, snap
        assert not any(k.startswith("qmatmul") for k in snap["fallbacks"]), snap
        assert not any(k.endswith("K.decode") for k in snap["counts"]), snap
    finally:
        next(gen, None)
