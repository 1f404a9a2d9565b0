"""TQ1_0 and TQ2_0 (BitNet's ternary types) in the CUDA backend's raw-block decoder (ops/cuda/dequant.decode),
run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

Every CUDA path that reads a weight of these types goes through decode: dequantize-to-scratch (prefill), the
raw-block GEMV (decode rows) and the embedding gather; no fast path (repacked planes, q8 GEMV) takes them, so
the linear() calls are counted under the type's name (qmatmul.TQ1_0.decode / .prefill). References:
minfer.quants' CPU dequantize and gguf.quants.dequantize (bit for bit), torch float64 for the products. The
sm_90 build checks that the new branches compile for the GPU (the interpreter runs Python, not the compiler).
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
from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
         "minfer.ops.cuda.embedding", "minfer.ops.cuda"]

TQ1_0, TQ2_0 = 34, 35
TYPES = [TQ1_0, TQ2_0]
NAMES = {TQ1_0: "TQ1_0", TQ2_0: "TQ2_0"}
D_AT = {TQ1_0: 52, TQ2_0: 64}          # byte offset of the f16 d (ggml-common.h block_tq1_0 / block_tq2_0)


@pytest.fixture(scope="module")
def K():
    for mods in interpreted_modules(_MODS):
        yield mods


def blocks(qt: int, n: int, k: int, rng, scale: float = 0.05, full_range: bool = False) -> np.ndarray:
    """uint8 (n, row_bytes) random blocks: random code bytes (TQ2_0's code 3 and TQ1_0's bytes past 242, which
    no quantizer writes, included: ggml decodes them too), the f16 d random normal * scale, or (full_range)
    every finite f16 pattern incl. subnormals and +-0."""
    ts = mq.type_size(qt)
    nb = n * (k // 256)
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    if full_range:
        h = rng.integers(0, 1 << 16, size=nb).astype(np.uint16)
        h = np.where((h & 0x7C00) == 0x7C00, h & np.uint16(0xFBFF), h).astype(np.uint16)
    else:
        h = (rng.standard_normal(nb) * scale).astype(np.float16).view(np.uint16)
    raw[:, D_AT[qt]:D_AT[qt] + 2] = h.view(np.uint8).reshape(nb, 2)
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
    n, k = 7, 256 * 3                     # rows and columns not multiples of the tile
    raw = blocks(qt, n, k, rng, full_range=full_range)
    ref = cpu_decode(raw, qt, n, k)
    out = torch.full((n, k), float("nan"))
    K["dequant"].dequantize_into(torch.from_numpy(raw), qt, n, k, out, interpret=True)
    o = out.numpy()
    assert np.array_equal(o.view(np.uint32), ref.view(np.uint32)), f"{np.sum(o != ref)} values differ"


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_dequant_fp16_out_and_row_gather(K, qt):
    """The gather by row index (the embedding's rows) into fp16."""
    rng = np.random.default_rng(50 + qt)
    n, k = 9, 512
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
    n, k = 21, 256 * 3
    raw = blocks(qt, n, k, rng)
    w = torch.from_numpy(cpu_decode(raw, qt, n, k)).double()
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(qt + m))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(5))
    out = K["gemv"].gemv(x, torch.from_numpy(raw), qt, n, k, bias=bias, interpret=True, split=split)
    assert out.shape == (m, n)
    assert rel_err(out, x.double() @ w.T + bias.double()) < 1e-5


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_linear_paths_and_prepare_weight(K, qt):
    """prepare_weight takes the types; linear() runs them on the raw GEMV (decode rows) and dequantize + matmul
    (prefill rows), counted under the type's name."""
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


@pytest.mark.parametrize("qt", TYPES, ids=NAMES.get)
def test_embedding(K, qt):
    from minfer.weights import QWeight

    n, d = 11, 256
    raw = blocks(qt, n, d, np.random.default_rng(9), scale=1.0)
    w = QWeight("token_embd.weight", qt, (n, d), torch.from_numpy(raw))
    ids = torch.tensor([10, 0, 4, 4])
    out = K["embedding"].embedding(ids, w)
    assert np.array_equal(out.numpy(), cpu_decode(raw, qt, n, d)[ids.numpy()])


def test_row_not_whole_blocks_refused_by_name(K):
    """A TQ2_0 weight whose rows are not whole 256-value blocks is refused at load, naming the tensor."""
    from minfer.errors import MinferError
    from minfer.weights import QWeight

    w = QWeight("blk.0.attn_q.weight", TQ2_0, (4, 64), torch.zeros((4, 17), dtype=torch.uint8))
    with pytest.raises(MinferError, match=r"blk\.0\.attn_q\.weight.*64 columns.*TQ2_0 block size 256"):
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
    """The two new branches build for sm_90."""
    from kernel_data import sm90_builds

    ptx = sm90_builds(_COMPILE, TYPES)
    for qt in TYPES:
        assert ".entry _dequant_kernel" in ptx[str(qt)] and "st.global" in ptx[str(qt)], qt
