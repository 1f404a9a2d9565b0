"""Every CUDA kernel against the CPU reference, on fresh random inputs of awkward sizes.

Outputs are poisoned: each test fills a large block of the CUDA caching allocator with NaN
and frees it just before the call, so a kernel's torch.empty output starts as NaN and an
unwritten element fails the comparison (NaN never passes rel_err).
Thresholds (../.library METHOD.md): fp32 math far under 1e-3; bf16 operands 1e-3..1e-2.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
from kernel_data import QUANT_NAMES, random_weight, reference_dequant, rel_err  # noqa: E402

from minfer.ops.context import Context  # noqa: E402
from minfer.switches import Switches  # noqa: E402

pytestmark = pytest.mark.gpu

QTYPES = [12, 14, 6, 8, 2, 3, 13, 7, 10, 11, 1, 30, 0, 20, 23, 39, 34, 35]   # 34/35: TQ1_0/TQ2_0 (bitnet)
DEV = "cuda"


def poison():
    """Fill ~512 MiB of the caching allocator's free memory with NaN, then free it."""
    t = torch.full((128 << 20,), float("nan"), dtype=torch.float32, device=DEV)
    del t


def qk(qt):
    return {2: 32, 3: 32, 6: 32, 7: 32, 8: 32, 20: 32, 39: 32, 0: 16, 1: 16, 30: 16}.get(qt, 256)


def make_weight(qt, n, k, seed, name="blk.0.w.weight"):
    from minfer.ops.cuda import prepare_weight
    from minfer.weights import QWeight

    raw = random_weight(qt, n, k, np.random.default_rng(seed))
    w = QWeight(name, qt, (n, k), torch.from_numpy(raw).to(DEV))
    prepare_weight(w)
    return w, torch.from_numpy(reference_dequant(raw, qt, n, k))


@pytest.mark.parametrize("qt", QTYPES, ids=lambda q: QUANT_NAMES[q])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dequant(qt, dtype):
    from minfer.ops.cuda.dequant import dequantize_into

    n, k = 333, 7 * qk(qt) if qk(qt) == 256 else 37 * qk(qt)
    w, ref = make_weight(qt, n, k, seed=qt)
    out = torch.full((n, k), float("nan"), dtype=dtype, device=DEV)
    dequantize_into(w.raw, qt, n, k, out)
    assert torch.equal(out.cpu(), ref.to(dtype)), f"{QUANT_NAMES[qt]} -> {dtype}"


# bf16 activations for every type; fp32 too for the types of the benchmark recipes
LINEAR_CASES = [(qt, torch.bfloat16) for qt in QTYPES] + [(qt, torch.float32) for qt in (12, 14, 6, 8, 2, 1)]


@pytest.mark.parametrize("qt,dtype", LINEAR_CASES, ids=lambda v: QUANT_NAMES.get(v, str(v)) if isinstance(v, int)
                         else str(v).replace("torch.", ""))
@pytest.mark.parametrize("m", [1, 7, 64, 333])
def test_linear(qt, m, dtype):
    from minfer.ops import paths
    from minfer.ops.cuda import linear

    n = 1000 + qt                                   # not a multiple of any tile
    k = 11 * 256 if qk(qt) == 256 else 87 * qk(qt)  # K tails for the 32-value blocks
    w, wref = make_weight(qt, n, k, seed=1000 + qt * 7 + m)
    g = torch.Generator().manual_seed(m * 31 + qt)
    x = torch.randn(m, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g)
    ref = x.double() @ wref.double().T + bias.double()
    paths.reset()
    poison()
    out = linear(x.to(DEV), w, bias.to(DEV))
    torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == (m, n)
    err = rel_err(out, ref)
    assert err < (1e-4 if dtype == torch.float32 else 1e-2), err
    # the launch paths (pdl.* and gemv_raw.halfwords count a launch mode: a one-row raw GEMV's pdl.gemv_raw, its
    # halfword reads)
    counts = {p: c for p, c in paths.snapshot()["counts"].items()
              if not p.startswith("pdl.") and p != "gemv_raw.halfwords"}
    assert sum(counts.values()) == 1 and any(QUANT_NAMES[qt] in p for p in counts)


@pytest.mark.parametrize("qt", [12, 14], ids=lambda q: QUANT_NAMES[q])
def test_gemv_switch_gives_same_result(qt, monkeypatch):
    """Switches(gemv=False) routes decode through dequant+cuBLAS: same function, different path."""
    from minfer.ops import paths
    from minfer.ops.cuda import linear

    w, wref = make_weight(qt, 4608, 3584, seed=5)
    x = torch.randn(1, 3584, device=DEV, dtype=torch.bfloat16)
    ref = x.double().cpu() @ wref.double().T
    paths.reset()
    a = linear(x, w)
    b = linear(x, w, None, Context(Switches(gemv=False)))
    name = QUANT_NAMES[qt]
    snap = paths.snapshot()
    assert {p: c for p, c in snap["counts"].items() if not p.startswith("pdl.")} == \
        {f"qmatmul.{name}.decode": 1, f"qmatmul.{name}.prefill": 1}
    assert snap["switched_off"] == {f"qmatmul.{name}.decode (switched off by MINFER_GEMV=0)": 1}
    assert rel_err(a, ref) < 1e-2 and rel_err(b, ref) < 1e-2


def test_linear_chunked_lm_head(monkeypatch):
    """A weight over the scratch cap (the lm head) is done in row chunks."""
    from minfer.ops.cuda import linear

    w, wref = make_weight(14, 20000 + 37, 1024, seed=3, name="output.weight")
    x = torch.randn(70, 1024, dtype=torch.bfloat16)
    poison()
    out = linear(x.to(DEV), w, None, Context(Switches(scratch_mb=16, group_scratch_mb=16)))
    assert rel_err(out, x.double() @ wref.double().T) < 1e-2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_swiglu(dtype):
    from minfer.ops import reference
    from minfer.ops.cuda import rms_norm, swiglu

    g = torch.Generator().manual_seed(11)
    x = (torch.randn(333, 3584, generator=g) * 5).to(dtype)
    wt = torch.randn(3584, generator=g)
    poison()
    out = rms_norm(x.to(DEV), wt.to(DEV), 1e-6)
    tol = 1e-6 if dtype == torch.float32 else 8e-3
    assert rel_err(out, reference.rms_norm(x.double(), wt.double(), 1e-6)) < tol
    a, b = (torch.randn(7, 18944, generator=g) * 3).to(dtype), torch.randn(7, 18944, generator=g).to(dtype)
    poison()
    assert rel_err(swiglu(a.to(DEV), b.to(DEV)), reference.swiglu(a.double(), b.double())) < tol


@pytest.mark.parametrize("style,dh", [("neox", 128), ("normal", 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope(style, dh, dtype):
    from minfer.config import RopeConfig
    from minfer.ops import reference
    from minfer.ops.cuda import rope

    cfg = RopeConfig(theta=1e6, style=style, n_rot=dh)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(333, 28, dh, generator=g).to(dtype)
    pos = torch.arange(5000, 5333)
    poison()
    out = rope(x.to(DEV), pos.to(DEV), cfg)
    ref = reference.rope(x.float(), pos, cfg).double()
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 8e-3)


@pytest.mark.parametrize("qt", [12, 14, 8, 1], ids=lambda q: QUANT_NAMES[q])
def test_embedding(qt):
    from minfer.ops.cuda import embedding

    w, ref = make_weight(qt, 5003, 3584 if qt != 8 else 896, seed=4, name="token_embd.weight")
    ids = torch.tensor([0, 5002, 17, 17, 4096, 1, 333])
    poison()
    out = embedding(ids.to(DEV), w)
    assert torch.equal(out.cpu(), ref[ids])


@pytest.mark.parametrize("t,start", [(1, 0), (1, 7), (1, 3353), (7, 0), (64, 0), (333, 0), (64, 300)])
@pytest.mark.parametrize("h,hkv,dh", [(28, 4, 128), (14, 2, 64), (9, 3, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention(t, start, h, hkv, dh, dtype):
    from minfer.ops import paths, reference
    from minfer.ops.cuda import attention

    s_max = 4096
    g = torch.Generator().manual_seed(t + start + h)
    kc = torch.randn(s_max, hkv, dh, generator=g).to(dtype)
    vc = torch.randn(s_max, hkv, dh, generator=g).to(dtype)
    q = torch.randn(t, h, dh, generator=g).to(dtype)
    ref = reference.attention(q.double(), kc.double(), vc.double(), start)
    paths.reset()
    poison()
    out = attention(q.to(DEV), kc.to(DEV), vc.to(DEV), start)
    assert out.shape == (t, h, dh)
    assert rel_err(out, ref) < (1e-4 if dtype == torch.float32 else 1e-2)
    if t == 1:      # up to two 64-key tiles: one split, the kernel writes the output (no merge)
        want = {"attention.decode.triton": 1} | ({"attention.decode.one_split": 1} if start < 128 else {})
        if start < 128 and dh == 128:     # Switches.decode_attn_vsplit: 4 slices of 32 dims
            want["attention.decode.one_split.v4"] = 1
    elif start == 0 and dtype == torch.bfloat16:   # SDPA's cuDNN kernel, length rounded to 128
        want = {"attention.prefill.cudnn": 1, "attention.prefill.cudnn.padded": 1}
    else:                                           # offset mask or fp32: memory-efficient kernel
        want = {"attention.prefill.masked": 1}
    snap = paths.snapshot()
    counts = {k: v for k, v in snap["counts"].items() if not k.startswith("pdl.")}   # launch mode, not path
    assert counts == want and not snap["fallbacks"], snap


def test_decode_attention_length_from_tensor():
    """The graph-replay form: the key count read from a device tensor."""
    from minfer.ops import reference
    from minfer.ops.cuda import decode_attention

    g = torch.Generator().manual_seed(0)
    kc = torch.randn(2048, 4, 128, generator=g).to(torch.bfloat16)
    vc = torch.randn(2048, 4, 128, generator=g).to(torch.bfloat16)
    q = torch.randn(1, 28, 128, generator=g).to(torch.bfloat16)
    n = torch.tensor([1000], dtype=torch.int32, device=DEV)
    out = decode_attention(q.to(DEV), kc.to(DEV), vc.to(DEV), n)
    assert rel_err(out, reference.attention(q.double(), kc.double(), vc.double(), 999)) < 1e-2


@pytest.mark.parametrize("n", [1, 17, 64, 65, 1000, 3355])
def test_decode_attention_kvpre_gpu(n):
    """Switches.decode_attn_kvpre at the 7B's heads (28 / 4 x 128, 64-key tiles, 264 programs):
    the first cached tile read before the wait, row n - 1 after it; against the float64
    reference and the kernel without it. Row n - 1 is made distinct so a dropped or doubled
    new row shows."""
    from minfer.ops import reference
    from minfer.ops.cuda import decode_attention

    g = torch.Generator().manual_seed(n)
    kc = torch.randn(4096, 4, 128, generator=g)
    vc = torch.randn(4096, 4, 128, generator=g)
    kc[n - 1] *= 3.0
    vc[n - 1] += 2.0
    kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    q = torch.randn(1, 28, 128, generator=g).to(torch.bfloat16)
    pos = torch.tensor([n - 1], dtype=torch.int64, device=DEV)
    a = decode_attention(q.to(DEV), kc.to(DEV), vc.to(DEV), pos, n_keys_add=1, kvpre=True)
    b = decode_attention(q.to(DEV), kc.to(DEV), vc.to(DEV), pos, n_keys_add=1, pre=True)
    ref = reference.attention(q.double(), kc.double(), vc.double(), n - 1)
    assert rel_err(a, ref) < 1e-2
    assert rel_err(a, b) < 1e-2


@pytest.mark.parametrize("n", [129, 1000, 3355, 4096])
@pytest.mark.parametrize("q8", [False, True])
def test_decode_attention_grid_merge_gpu(n, q8):
    """Switches.decode_attn_grid_merge at the 7B's heads (28 / 4 x 128, a 4,096-row cache: 32 key
    splits a KV head, 128 programs, one an SM): the splits merged by the attention's own
    programs after a grid barrier give the same bits as the combine launch -- the output and the
    o projection's int8 words and scales -- and the float64 reference's values. Five launches on
    one barrier: its arrivals are back at zero after each (graph replays reuse it)."""
    from minfer.ops import paths, reference
    from minfer.ops.cuda import decode_attention

    g = torch.Generator().manual_seed(n)
    kc = torch.randn(4096, 4, 128, generator=g).to(torch.bfloat16)
    vc = torch.randn(4096, 4, 128, generator=g).to(torch.bfloat16)
    q = torch.randn(1, 28, 128, generator=g).to(torch.bfloat16)
    q, kc, vc = q.to(DEV), kc.to(DEV), vc.to(DEV)
    pos = torch.tensor([n - 1], dtype=torch.int64, device=DEV)
    bar = torch.zeros(2, dtype=torch.int32, device=DEV)
    paths.reset()
    got = [decode_attention(q, kc, vc, pos, n_keys_add=1, q8=q8, pre=True, grid_merge=True, bar=bar)
           for _ in range(5)]
    snap = paths.snapshot()
    assert snap["counts"].get("attention.decode.grid_merge") == 5 and not snap["fallbacks"], snap
    assert int(bar[0]) == 0 and int(bar[1]) == 5
    want = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=q8, pre=True)
    for x in got:
        assert torch.equal(x, want)
        if q8:
            assert torch.equal(x.q8[0], want.q8[0]) and torch.equal(x.q8[1], want.q8[1])
        else:
            assert getattr(x, "q8", None) is None
    assert rel_err(got[0], reference.attention(q.cpu().double(), kc.cpu().double(), vc.cpu().double(), n - 1)) < 1e-2


def _attn_7b(rows: int, n: int, seed: int):
    """The 7B's heads (28 / 4 x 128): q and a `rows`-row bf16 cache on the GPU at n keys, the key
    count tensor (position n - 1) and the float64 reference."""
    from minfer.ops import reference

    g = torch.Generator().manual_seed(seed)
    kc = torch.randn(rows, 4, 128, generator=g).to(torch.bfloat16)
    vc = torch.randn(rows, 4, 128, generator=g).to(torch.bfloat16)
    q = torch.randn(1, 28, 128, generator=g).to(torch.bfloat16)
    ref = reference.attention(q.double(), kc.double(), vc.double(), n - 1)
    pos = torch.tensor([n - 1], dtype=torch.int64, device=DEV)
    return q.to(DEV), kc.to(DEV), vc.to(DEV), pos, ref


def _close_pair(a, b, ref):
    """a against the reference and, within bf16 rounding, b; the o projection's int8 words within
    one step."""
    assert rel_err(a, ref) < 1e-2 and rel_err(a, b.double()) < 1e-2
    qa, qb = a.q8[0].view(torch.int8).to(torch.int32), b.q8[0].view(torch.int8).to(torch.int32)
    assert int((qa - qb).abs().max()) <= 1


def _v_slices_against_whole_v(rows: int, n: int, seed: int, path: str, sliced: dict, whole: dict):
    """The 7B's heads over a `rows`-row cache at n keys (_attn_7b): decode_attention with the V
    slices `sliced` (counted as `path`) against the reference and the whole-V kernel (`whole`),
    _close_pair."""
    from minfer.ops import paths
    from minfer.ops.cuda import decode_attention

    q, kc, vc, pos, ref = _attn_7b(rows, n, seed)
    paths.reset()
    a = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, **sliced)
    assert paths.snapshot()["counts"].get(path) == 1
    b = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, **whole)
    _close_pair(a, b, ref)


@pytest.mark.parametrize("n", [1, 17, 64, 65, 128])
@pytest.mark.parametrize("vsplit", [2, 4])
def test_decode_attention_v_split_gpu(n, vsplit):
    """Switches.decode_attn_vsplit over a 128-row view (the short graph's one split): V slices of
    64 / 32 dims against the reference and the one-program output (_v_slices_against_whole_v)."""
    _v_slices_against_whole_v(128, n, n + vsplit, f"attention.decode.one_split.v{vsplit}", {"vsplit": vsplit},
                              {"vsplit": 1})


@pytest.mark.parametrize("n", [129, 1000, 3355])
@pytest.mark.parametrize("split_vs", [2, 4])
def test_decode_attention_split_v_slices_gpu(n, split_vs):
    """Switches.decode_attn_split_vs over a 4,096-row cache (32 key splits, each spread over V
    slices) against the reference and the whole-V kernel (_v_slices_against_whole_v)."""
    _v_slices_against_whole_v(4096, n, n + 10 * split_vs, f"attention.decode.split.v{split_vs}",
                              {"split_vs": split_vs}, {})


@pytest.mark.parametrize("rows,n", [(128, 1), (128, 17), (128, 64), (128, 65), (128, 128), (4096, 129), (4096, 1000),
                                    (4096, 3355), (4096, 4096)])
@pytest.mark.parametrize("vsplit", [1, 4])
def test_decode_attention_pipe_gpu(rows, n, vsplit):
    """Switches.decode_attn_pipe at the 7B's heads, PDL launch: every tile's cached rows copied before
    the wait, this step's row read after it and folded in last, against the float64 reference and,
    within bf16 rounding, the plain loop; one split over V slices or not (a 128-row view) and key
    splits (4,096 rows)."""
    from minfer.ops.cuda import decode_attention

    q, kc, vc, pos, ref = _attn_7b(rows, n, rows + n + vsplit)
    a = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, pipe=True, vsplit=vsplit, pdl=1)
    b = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, vsplit=vsplit, pdl=1)
    _close_pair(a, b, ref)


@pytest.mark.parametrize("n", [129, 1000, 3355])
@pytest.mark.parametrize("chunk", [64, 128])
def test_decode_combine_chunk_gpu(n, chunk):
    """Switches.decode_combine_chunk over a 4,096-row cache at the 7B's heads (key splits and the
    combine launch): 64 / 128 values a combine program against the float64 reference and, within
    bf16 rounding, the 32-value programs (_close_pair)."""
    from minfer.ops.cuda import decode_attention

    q, kc, vc, pos, ref = _attn_7b(4096, n, n + chunk)
    a = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, combine_chunk=chunk, pdl=1)
    b = decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, pre=True, pdl=1)
    _close_pair(a, b, ref)


def test_decode_attention_grid_merge_needs_one_program_an_sm():
    """More split programs than SMs: no grid barrier (its programs might not all be resident), the
    combine launch instead, counted as a fallback that names why."""
    from minfer.ops import paths
    from minfer.ops.cuda import decode_attention

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    kc = torch.randn(8192, 8, 128, device=DEV).to(torch.bfloat16)
    q = torch.randn(1, 32, 128, device=DEV).to(torch.bfloat16)
    paths.reset()
    a = decode_attention(q, kc, kc, 8000, programs=2 * sms + 8, grid_merge=True)
    snap = paths.snapshot()
    assert "attention.decode.grid_merge" not in snap["counts"]
    assert [k for k in snap["fallbacks"] if k.startswith("attention.decode.grid_merge") and "SMs" in k], snap
    assert torch.equal(a, decode_attention(q, kc, kc, 8000, programs=2 * sms + 8))


@pytest.mark.parametrize("t,d", [(1, 3584), (7, 896), (333, 3584), (64, 576)])
def test_add_rms_norm_fused_gpu(monkeypatch, t, d):
    from minfer.ops import paths, reference
    from minfer.ops.cuda import add_rms_norm

    g = torch.Generator().manual_seed(t + d)
    x = torch.randn(t, d, generator=g) * 4
    y = torch.randn(t, d, generator=g).to(torch.bfloat16)
    wt = torch.randn(d, generator=g)
    rs, rh = reference.add_rms_norm(x.double(), y.double(), wt.double(), 1e-6, torch.float64)
    paths.reset()
    s, h = add_rms_norm(x.to(DEV), y.to(DEV), wt.to(DEV), 1e-6, torch.bfloat16)
    assert s.dtype == torch.float32 and h.dtype == torch.bfloat16
    assert torch.isfinite(s).all() and torch.isfinite(h).all()
    assert rel_err(s, rs) < 1e-7 and rel_err(h, rh) < 1e-2
    # one row of a multiple of 256 values also gets its int8 form (gemv_q8) from the same launch
    q8 = t == 1 and d % 256 == 0
    counts = {k: v for k, v in paths.snapshot()["counts"].items() if not k.startswith("pdl.")}
    assert counts == {"add_rms_norm.q8" if q8 else "add_rms_norm.triton": 1}
    assert (getattr(h, "q8", None) is not None) == q8


@pytest.mark.parametrize("t,h,hkv,dh", [(333, 28, 4, 128), (64, 14, 2, 64), (2048, 28, 4, 128)])
@pytest.mark.parametrize("mode", ["flash", "cudnn", "cudnn-short-cache"])
def test_attention_prefill_modes(monkeypatch, t, h, hkv, dh, mode):
    """Every prefill attention the switches can pick, against the CPU reference, each counted
    under its own path. The cache rows past the prompt hold large finite stale keys/values:
    the rounded-up cuDNN length reads them, and the causal mask must keep them out."""
    from minfer.ops import paths, reference
    from minfer.ops.cuda import attention

    ctx = Context(Switches(cudnn_attention=mode != "flash"))
    g = torch.Generator().manual_seed(t + h)
    s_max = t + 5 if mode == "cudnn-short-cache" else 4096   # no room to round up: exact length
    kc = torch.randn(s_max, hkv, dh, generator=g)
    vc = torch.randn(s_max, hkv, dh, generator=g)
    kc[t:], vc[t:] = 60.0, -300.0                              # stale rows after the prompt
    kc, vc = kc.to(torch.bfloat16), vc.to(torch.bfloat16)
    q = torch.randn(t, h, dh, generator=g).to(torch.bfloat16)
    ref = reference.attention(q.double(), kc[:t].double(), vc[:t].double(), 0)
    paths.reset()
    out = attention(q.to(DEV), kc.to(DEV), vc.to(DEV), 0, ctx)
    assert out.shape == (t, h, dh) and torch.isfinite(out).all()
    assert rel_err(out, ref) < 1e-2
    snap = paths.snapshot()
    if mode == "flash":
        want = {"attention.prefill.flash": 1}
        assert snap["switched_off"] == {"attention.prefill.cudnn (switched off by MINFER_CUDNN_ATTENTION=0)": 1}, snap
    elif mode == "cudnn" and t % 128:
        want = {"attention.prefill.cudnn": 1, "attention.prefill.cudnn.padded": 1}
    else:
        want = {"attention.prefill.cudnn": 1}
    assert snap["counts"] == want and not snap["fallbacks"], snap
