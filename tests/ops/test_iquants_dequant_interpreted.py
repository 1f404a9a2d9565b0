"""IQ4_NL, IQ4_XS and MXFP4 in the CUDA backend's raw-block decoder (ops/cuda/dequant.decode),
run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

Every CUDA path that reads these types goes through decode: dequantize-to-scratch (prefill,
dense planes, MoE expert gathers), the raw-block GEMV (decode rows) and the embedding gather.
References: minfer.quants' CPU dequantize and gguf.quants.dequantize (bit for bit), torch
float64 for the products. The sm_90 build of the dequant kernel checks that the new branches
compile for the GPU (the interpreter runs Python, not the compiler).
"""

from __future__ import annotations

import os
import sys

import gguf.quants as gq
import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, rel_err  # noqa: E402

import minfer.quants as mq  # noqa: E402
from minfer.errors import MinferError  # noqa: E402
from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.embedding", "minfer.ops.cuda.moe", "minfer.ops.cuda"]

IQ4_NL, IQ4_XS, MXFP4 = 20, 23, 39
TYPES = [IQ4_NL, IQ4_XS, MXFP4]
NAMES = {IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS", MXFP4: "MXFP4"}
QK = {IQ4_NL: 32, IQ4_XS: 256, MXFP4: 32}


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(_MODS):
        yield mods


def blocks(qt: int, n: int, k: int, rng, scale: float = 0.02, full_range: bool = False) -> np.ndarray:
    """uint8 (n, row_bytes) random valid blocks: random codes and group scales, the f16 d
    random normal * scale (IQ4) or the e8m0 byte near log2(scale / 4) (MXFP4); full_range:
    every f16 / e8m0 pattern that is finite (incl. subnormal scales and e8m0 253..255, whose
    large codes overflow to inf in ggml and gguf alike)."""
    ts = mq.type_size(qt)
    nb = n * (k // QK[qt])
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    if qt == MXFP4:
        if not full_range:
            e = int(np.round(np.log2(scale / 4))) + 128
            raw[:, 0] = rng.integers(e - 2, e + 3, size=nb)
    else:
        if full_range:
            h = rng.integers(0, 1 << 16, size=nb).astype(np.uint16)
            h = np.where((h & 0x7C00) == 0x7C00, h & np.uint16(0xFBFF), h).astype(np.uint16)
        else:
            h = (rng.standard_normal(nb) * scale / (16 if qt == IQ4_XS else 1)).astype(np.float16).view(np.uint16)
        raw[:, 0:2] = h.view(np.uint8).reshape(nb, 2)
    return raw.reshape(n, -1)


def cpu_decode(raw: np.ndarray, qt: int, n: int, k: int) -> np.ndarray:
    """minfer.quants' dequantize, itself checked bit for bit against gguf's here."""
    got = mq.dequantize(raw, qt, (n, k))
    with np.errstate(all="ignore"):
        ref = np.asarray(gq.dequantize(raw, qt), dtype=np.float32).reshape(n, k)
    assert np.array_equal(got.view(np.uint32), ref.view(np.uint32))
    return got


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("full_range", [False, True])
def test_dequant_kernel_bit_exact(K, qt, full_range):
    rng = np.random.default_rng(qt + 7 * full_range)
    n, k = 7, QK[qt] * 3                  # rows and columns not multiples of the tile
    raw = blocks(qt, n, k, rng, full_range=full_range)
    ref = cpu_decode(raw, qt, n, k)
    out = torch.full((n, k), float("nan"))
    K["dequant"].dequantize_into(torch.from_numpy(raw), qt, n, k, out, interpret=True)
    o = out.numpy()
    assert np.array_equal(o.view(np.uint32), ref.view(np.uint32)), f"{np.sum(o != ref)} values differ"


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_dequant_fp16_out_and_row_gather(K, qt):
    """The gather by row index (the embedding and the MoE experts' rows) into fp16."""
    rng = np.random.default_rng(50 + qt)
    n, k = 9, QK[qt] * 2
    raw = blocks(qt, n, k, rng)
    ref = cpu_decode(raw, qt, n, k)
    idx = torch.tensor([3, 0, 8, 3, 5], dtype=torch.int64)
    out = torch.full((5, k), float("nan"), dtype=torch.float16)
    K["dequant"].dequantize_into(torch.from_numpy(raw), qt, 5, k, out, idx=idx, interpret=True)
    assert np.array_equal(out.numpy(), ref[idx.numpy()].astype(np.float16))


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
@pytest.mark.parametrize("m,split", [(1, None), (1, 3), (3, 2)])
def test_gemv_raw_blocks(K, qt, m, split):
    rng = np.random.default_rng(1000 * qt + m)
    n, k = 21, QK[qt] * (5 if qt != IQ4_XS else 2)
    raw = blocks(qt, n, k, rng)
    w = torch.from_numpy(cpu_decode(raw, qt, n, k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(qt + m))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    out = K["gemv"].gemv(x, torch.from_numpy(raw), qt, n, k, bias=bias, interpret=True, split=split)
    assert out.shape == (m, n)
    assert rel_err(out, x.double() @ w.T + bias.double()) < 1e-5


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_linear_paths_and_prepare_weight(K, qt):
    """prepare_weight takes the types; linear() runs them on the raw GEMV (decode rows) and
    dequantize + matmul (prefill rows), counted under the type's name."""
    from minfer.ops import paths
    from minfer.weights import QWeight

    n, k = 24, 512
    raw = blocks(qt, n, k, np.random.default_rng(qt))
    w = QWeight("blk.0.ffn_up.weight", qt, (n, k), torch.from_numpy(raw))
    K["cuda"].prepare_weight(w)
    wd = torch.from_numpy(cpu_decode(raw, qt, n, k)).double()
    for m, path in ((2, "decode"), (40, "prefill")):
        x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
        paths.reset()
        out = K["qmatmul"].linear(x, w, None, Context(Switches(prefetch=False, fuse_groups=False)))
        assert rel_err(out, x.double() @ wd.T) < 1e-5
        assert paths.snapshot()["counts"] == {f"qmatmul.{NAMES[qt]}.{path}": 1}


def test_embedding_mxfp4(K):
    from minfer.weights import QWeight

    n, d = 11, 256
    raw = blocks(MXFP4, n, d, np.random.default_rng(9), scale=1.0)
    w = QWeight("token_embd.weight", MXFP4, (n, d), torch.from_numpy(raw))
    ids = torch.tensor([10, 0, 4, 4])
    out = K["embedding"].embedding(ids, w)
    assert np.array_equal(out.numpy(), cpu_decode(raw, MXFP4, n, d)[ids.numpy()])


@pytest.mark.parametrize("T", [1, 9])
def test_moe_ffn_mxfp4_experts(K, T):
    """Stacked MXFP4 experts (gpt-oss's expert type) through the MoE expert gather (T=1) and the
    grouped path (T=9), against the float reference expert by expert."""
    from minfer.ops import paths, reference
    from minfer.weights import QWeight

    E, D, Fe, k = 4, 64, 96, 2
    rng = np.random.default_rng(T)

    def stacked(name, n, kk):
        raw = blocks(MXFP4, E * n, kk, rng, scale=kk ** -0.5)
        return QWeight(name, MXFP4, (E * n, kk), torch.from_numpy(raw))

    g, u, d = stacked("gate_exps", Fe, D), stacked("up_exps", Fe, D), stacked("down_exps", D, Fe)
    router = torch.randn(E, D, generator=torch.Generator().manual_seed(1))
    h = torch.randn(T, D, generator=torch.Generator().manual_seed(2))
    ref = reference.moe_ffn(h, router, g, u, d, k, True)
    paths.reset()
    out = K["moe"].moe_ffn(h, router, g, u, d, k, True)
    assert rel_err(out, ref) < 1e-5
    counts = paths.snapshot()["counts"]
    assert counts.get("moe.gather") == 1 if T * k <= K["moe"].GATHER_MAX else "moe.gather" not in counts


def test_unsupported_type_refused_by_name(K):
    """A type without a decode branch (IQ2_XXS, 16) is refused at load, naming tensor and type."""
    from minfer.weights import QWeight

    w = QWeight("blk.3.attn_q.weight", 16, (4, 256), torch.zeros((4, 66), dtype=torch.uint8))
    with pytest.raises(MinferError, match=r"blk\.3\.attn_q\.weight.*IQ2_XXS"):
        K["cuda"].prepare_weight(w)


_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from minfer.ops.cuda import dequant as DQ

kern = DQ._dequant_kernel
names = [p.name for p in kern.params if not p.is_constexpr]
types = ["*u8", "*bf16", "*i64", "i32", "i32", "i32", "i32"]
out = {}
for qt in json.loads(sys.argv[1]):
    _, qk, ts = DQ.LAYOUT[qt]
    cex = dict(QT=qt, QK=qk, TS=ts, BR=8, BK=256, HAS_IDX=False)
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    src = ASTSource(kern, sig, cex)
    out[str(qt)] = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
print(json.dumps(out))
"""


def test_dequant_kernel_builds_for_sm90():
    """The new branches, and Q6_K's (now behind the static_assert that no type falls into it),
    build for sm_90."""
    from kernel_data import sm90_builds

    ptx = sm90_builds(_COMPILE, TYPES + [14])
    for qt in TYPES + [14]:
        assert ".entry _dequant_kernel" in ptx[str(qt)] and "st.global" in ptx[str(qt)], qt
