"""Decode fusions of issue 12 in Triton's interpreter, against the torch reference:
rope(q) + rope(k) + the KV cache append as one kernel (norm_rope_act.rope_kv_write), the same
folded into the decode attention kernel (decode_attn_rope.rope_decode_attention), and the decode
attention's combine kernel also writing its output's int8 form for the o projection."""

from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, rel_err  # noqa: E402

from minfer.config import RopeConfig  # noqa: E402
from minfer.ops import reference  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows", "minfer.ops.cuda.gemv_q8",
                                     "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.attention",
                                     "minfer.ops.cuda.decode_attn_rope"]):
        yield mods


@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("t", [1, 3])
@pytest.mark.parametrize("paged", [False, True])
def test_rope_kv_write_matches_rope_and_writes(M, style, t, paged):
    """paged: the keys/values go to `rows` (a paged cache's slots), rotated by `pos`."""
    cfg = RopeConfig(theta=1e6, style=style, n_rot=64)
    g = torch.Generator().manual_seed(t)
    H, Hkv, Dh, S = 6, 2, 64, 40
    qkv = torch.randn(t, (H + 2 * Hkv) * Dh, generator=g)
    q, k, v = torch.split(qkv, [H * Dh, Hkv * Dh, Hkv * Dh], dim=1)     # column views, as the GEMV gives
    q, k, v = q.view(t, H, Dh), k.view(t, Hkv, Dh), v.view(t, Hkv, Dh)
    pos = torch.tensor([7, 30, 12][:t], dtype=torch.int64)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    kc0, vc0 = kc.clone(), vc.clone()
    rows = torch.tensor([33, 2, 19][:t], dtype=torch.int64) if paged else None
    qr = M["norm_rope_act"].rope_kv_write(q, k, v, pos, cfg, kc, vc, rows=rows)
    assert rel_err(qr, reference.rope(q, pos, cfg)) < 1e-6
    kr = reference.rope(k, pos, cfg)
    dest = pos if rows is None else rows
    for i, p in enumerate(dest.tolist()):
        assert rel_err(kc[p], kr[i]) < 1e-6 and torch.equal(vc[p], v[i])
    rest = torch.ones(S, dtype=torch.bool)
    rest[dest] = False
    assert torch.equal(kc[rest], kc0[rest]) and torch.equal(vc[rest], vc0[rest])   # nothing else written


def test_decode_attention_q8_output(M):
    A, Q = M["attention"], M["gemv_q8"]
    g = torch.Generator().manual_seed(0)
    H, Hkv, Dh, S = 8, 2, 64, 50
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    out = A.decode_attention(q, kc, vc, 37, q8=True)
    ref = reference.attention(q, kc, vc, 36)
    assert rel_err(out, ref) < 1e-5
    x = out.reshape(1, -1)
    # the attached int8 form is the output quantized per 32 values (d = max|x| / 127)
    b = x.double().view(-1, 32)
    d = b.abs().amax(1, keepdim=True) / 127
    want = (torch.round(b / d) * d).view(1, -1)
    got = Q.dequantize_q8(out.q8, H * Dh).double()
    assert (got - want).abs().max() <= float(d.max()) * 1.0001
    assert rel_err(got, want) < 1e-3
    assert getattr(A.decode_attention(q, kc, vc, 37), "q8", None) is None


def test_batched_rows_q8_producers_for_the_int8_gemm(M):
    """With Switches.qgemm_q8, batched rows (dense_gemv_max_m < T <= qgemm_max_m) leave add+norm
    and SwiGLU with their int8 form, equal to quantize_rows of the same float32 values."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    N, Q = M["norm_rope_act"], M["gemv_q8"]
    ctx = Context(Switches(qgemm_q8=True), None)
    g = torch.Generator().manual_seed(4)
    t, d = 12, 512
    x, y, w = torch.randn(t, d, generator=g), torch.randn(t, d, generator=g).to(torch.float16), torch.randn(d, generator=g)
    paths.reset()
    s, h = N.add_rms_norm(x, y, w, 1e-6, torch.float16, ctx)
    sv = x + y.float()
    hv = sv * torch.rsqrt(sv.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.equal(s, sv) and rel_err(h.float(), hv) < 1e-3
    xq, xf = h.q8
    assert xq.shape == (t, d // 4) and xf.shape == (t, d // 8)
    for r in range(t):
        ref = Q.quantize_rows(hv[r:r + 1].contiguous(), interpret=True)
        assert torch.equal(xq[r], ref[0][0]) and torch.allclose(xf[r], ref[1][0], rtol=1e-6), r
    gate, up = torch.randn(t, d, generator=g).half(), torch.randn(t, d, generator=g).half()
    a = N.swiglu(gate, up, ctx)
    assert a.q8[0].shape == (t, d // 4)
    counts = paths.snapshot()["counts"]
    assert counts.get("add_rms_norm.q8rows") == 1 and counts.get("swiglu.q8rows") == 1
    # off (the default): no int8 rows
    b = N.swiglu(gate, up, Context(Switches(), None))
    assert getattr(b, "q8", None) is None and torch.equal(a, b)


@pytest.mark.parametrize("prewait", [False, True])
@pytest.mark.parametrize("style", ["normal", "neox"])
@pytest.mark.parametrize("pos,n_split,window,softcap", [
    (0, None, 0, 0.0),        # the first token: no cached key, the new one alone
    (5, None, 0, 0.0),
    (47, None, 0, 0.0),       # 3 tiles of 16 keys: the new key in the last program's range
    (79, None, 0, 0.0),       # the cache's last row
    (60, 3, 0, 0.0),          # 3 splits of 32 keys: programs with and without the new key
    (60, 8, 0, 0.0),          # splits past the keys (empty programs)
    (60, None, 7, 0.0),       # sliding window: only the last 7 keys
    (60, None, 0, 5.0),       # gemma2's score soft-cap
])
def test_rope_decode_attention_matches_rope_write_attend(M, style, pos, n_split, window, softcap, prewait):
    """One launch of the attention kernel (+ the merge) does what rope_kv_write and
    decode_attention did: the output equals the reference's rope + attention over the cache
    with the new row; the new row holds rope(k) and v; no other row changes."""
    A = M["attention"]
    R = M["decode_attn_rope"]
    N = M["norm_rope_act"]
    H, Hkv, Dh, S = 8, 2, 64, 80
    cfg = RopeConfig(theta=1e4, style=style, n_rot=Dh)
    g = torch.Generator().manual_seed(pos + 1)
    qkv = torch.randn(1, (H + 2 * Hkv) * Dh, generator=g)
    q, k, v = torch.split(qkv, [H * Dh, Hkv * Dh, Hkv * Dh], dim=1)     # column views, as the GEMV gives
    q, k, v = q.view(1, H, Dh), k.view(1, Hkv, Dh), v.view(1, Hkv, Dh)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    kc0, vc0 = kc.clone(), vc.clone()
    p = torch.tensor([pos])
    out = R.rope_decode_attention(q, k, v, p, N._turns(cfg, "cpu"), style == "neox", kc, vc, window=window,
                                  softcap=softcap, n_split=n_split, prewait=prewait)
    kr = reference.rope(k, p, cfg)
    assert rel_err(kc[pos], kr[0]) < 1e-6 and torch.equal(vc[pos], v[0])
    rest = torch.arange(S) != pos
    assert torch.equal(kc[rest], kc0[rest]) and torch.equal(vc[rest], vc0[rest])   # nothing else written
    kc0[pos], vc0[pos] = kr[0], v[0]
    ref = reference.attention(reference.rope(q, p, cfg), kc0, vc0, pos, window, softcap)
    assert rel_err(out, ref) < 1e-5


def test_rope_attention_routing(M):
    """ops' entry: the fused kernel counted as attention.decode.rope; None (the caller's rope +
    write + attention) for what it cannot take, and when switched off."""
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    A = M["attention"]
    R = M["decode_attn_rope"]
    H, Hkv, Dh, S = 4, 2, 32, 20
    q, k, v = torch.randn(1, H, Dh), torch.randn(1, Hkv, Dh), torch.randn(1, Hkv, Dh)
    kc, vc = torch.zeros(S, Hkv, Dh), torch.zeros(S, Hkv, Dh)
    pos = torch.tensor([4])
    on = Context(Switches(decode_attn_rope=True), None)
    paths.reset()
    assert R.rope_attention(q, k, v, pos, RopeConfig(theta=1e4, style="neox", n_rot=Dh), kc, vc, on) is not None
    assert R.rope_attention(q, k, v, pos, RopeConfig(theta=1e4, style="neox", n_rot=Dh), kc, vc, on,
                            window=3) is not None
    assert R.rope_attention(q, k, v, pos, RopeConfig(theta=1e4, style="neox", n_rot=16), kc, vc, on) is None
    assert R.rope_attention(q.half(), k, v, pos, RopeConfig(theta=1e4, style="neox", n_rot=Dh), kc, vc, on) is None
    off = Context(Switches(decode_attn_rope=False), None)
    assert R.rope_attention(q, k, v, pos, RopeConfig(theta=1e4, style="neox", n_rot=Dh), kc, vc, off) is None
    snap = paths.snapshot()
    assert snap["counts"].get("attention.decode.rope") == 1
    assert snap["counts"].get("attention.decode.rope.window") == 1
    assert snap["switched_off"] == {"attention.decode.rope (switched off by MINFER_DECODE_ATTN_ROPE=0)": 1}


@pytest.mark.parametrize("n_keys,window", [(5, 0), (37, 0), (37, 16)])
def test_decode_attention_preload_is_the_same_kernel(M, n_keys, window):
    """Switches.decode_attn_preload: reading the key count before the PDL wait (PRE) changes
    where the load sits, not the result: bit for bit the kernel without it, both the reference's
    attention; the count as a device tensor plus n_keys_add, as a graph passes it."""
    A = M["attention"]
    g = torch.Generator().manual_seed(n_keys)
    H, Hkv, Dh, S = 8, 2, 64, 50
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    a = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, pre=True)
    b = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, pre=False)
    assert torch.equal(a, b)
    assert rel_err(a, reference.decode_attention(q, kc, vc, n_keys, window)) < 1e-5


@pytest.mark.parametrize("n_keys,window,n_split", [(5, 0, None), (37, 0, None), (37, 16, None), (50, 0, 1),
                                                    (33, 0, 2), (17, 0, 4), (40, 7, 3)])
def test_decode_attention_kvpre_matches_the_reference(M, n_keys, window, n_split):
    """Switches.decode_attn_kvpre: the first cached tile read before the PDL wait, this step's
    row (n_keys - 1) after it -- alone when it falls in that tile's span, in the loop otherwise.
    Against the reference's attention and the kernel without it (the order of the sums differs
    only where the new row is folded in alone), with the new row's values distinct from every
    cached one, so a stale or dropped row shows; splits of one, two and more tiles (16-key tiles
    in the interpreter), empty splits, a window."""
    A = M["attention"]
    g = torch.Generator().manual_seed(n_keys * 7 + (n_split or 0))
    H, Hkv, Dh, S = 8, 2, 64, 50
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    kc[n_keys - 1] *= 4.0
    vc[n_keys - 1] += 3.0
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    a = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, kvpre=True, n_split=n_split)
    b = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, pre=True, n_split=n_split)
    ref = reference.decode_attention(q, kc, vc, n_keys, window)
    assert rel_err(a, ref) < 1e-5
    assert rel_err(a, b) < 1e-6


@pytest.mark.parametrize("H,Hkv,n_keys,window,kvpre", [(8, 2, 5, 0, False), (8, 2, 29, 0, False),
                                                       (28, 4, 32, 0, False), (8, 2, 30, 9, False),
                                                       (8, 2, 29, 0, True)])
def test_decode_attention_one_split_writes_the_merged_output(M, H, Hkv, n_keys, window, kvpre):
    """With one key split (a span of up to two 16-key tiles in the interpreter: a cache, or a
    graph's short view of one, of <= 32 rows) the kernel writes the output and its int8 form
    itself (DIRECT). Bit for bit what the partials + combine launch give for the same split
    (direct=False), words and chunk scales included; counted as attention.decode.one_split;
    7 heads a group (padded rows masked), a window, the preloaded tile."""
    from minfer.ops import paths

    A = M["attention"]
    g = torch.Generator().manual_seed(n_keys * 3 + H)
    Dh = 64
    S = 32 if n_keys <= 32 else 50
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    paths.reset()
    a = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, q8=True, kvpre=kvpre)
    assert paths.snapshot()["counts"].get("attention.decode.one_split") == 1
    b = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, q8=True, kvpre=kvpre, direct=False)
    assert paths.snapshot()["counts"].get("attention.decode.one_split") == 1
    assert torch.equal(a, b)
    assert torch.equal(a.q8[0], b.q8[0]) and torch.equal(a.q8[1], b.q8[1])
    assert rel_err(a, reference.decode_attention(q, kc, vc, n_keys, window)) < 1e-5
    # more rows than two tiles: splits and the merge, as before
    big = torch.randn(S + 40, Hkv, Dh, generator=g)
    paths.reset()
    A.decode_attention(q, big, big, pos, n_keys_add=1, q8=True)
    assert "attention.decode.one_split" not in paths.snapshot()["counts"]


@pytest.mark.parametrize("n_keys,window,n_split,kvpre,S", [(5, 0, None, False, 32), (29, 0, None, False, 32),
                                                           (50, 0, 1, False, 50), (37, 0, 2, False, 50),
                                                           (40, 7, 3, False, 50), (37, 16, None, False, 50),
                                                           (50, 0, 1, True, 50), (29, 0, None, True, 32)])
def test_decode_attention_ahead_gives_the_same_bits(M, n_keys, window, n_split, kvpre, S):
    """Switches.decode_attn_ahead: the next key tile's loads issued before this tile's math gives
    the same bits as the loop that loads each tile in its turn -- output, int8 words and chunk
    scales -- with one split (the DIRECT kernel of a short cache), several tiles a split, empty
    splits, a window, and the preloaded first tile (kvpre). 16-key tiles in the interpreter."""
    A = M["attention"]
    g = torch.Generator().manual_seed(n_keys * 5 + S)
    H, Hkv, Dh = 28, 4, 64
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    kw = dict(window=window, n_keys_add=1, q8=True, kvpre=kvpre, n_split=n_split)
    a = A.decode_attention(q, kc, vc, pos, ahead=True, **kw)
    b = A.decode_attention(q, kc, vc, pos, ahead=False, **kw)
    assert torch.equal(a, b)
    assert torch.equal(a.q8[0], b.q8[0]) and torch.equal(a.q8[1], b.q8[1])
    assert rel_err(a, reference.decode_attention(q, kc, vc, n_keys, window)) < 1e-5


@pytest.mark.parametrize("n_keys,S", [(5, 32), (29, 32), (33, 80), (70, 80), (80, 80)])
def test_decode_attention_one_tile_splits_match_the_reference(M, n_keys, S):
    """Switches.decode_attn_tiles=1: splits of one key tile each at the cache's full length (more
    splits and partials to merge) give the reference's attention; a span of up to two tiles stays
    one split (the direct kernel) whatever the setting. 16-key tiles in the interpreter."""
    from minfer.ops import paths

    A = M["attention"]
    g = torch.Generator().manual_seed(n_keys + S)
    H, Hkv, Dh = 8, 2, 64
    q = torch.randn(1, H, Dh, generator=g)
    kc, vc = torch.randn(S, Hkv, Dh, generator=g), torch.randn(S, Hkv, Dh, generator=g)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    paths.reset()
    a = A.decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, tiles=1)
    assert ("attention.decode.one_split" in paths.snapshot()["counts"]) == (S <= 32)
    assert A._n_split(S, 16, Hkv, 264, None, 1) == (1 if S <= 32 else S // 16)
    assert rel_err(a, reference.decode_attention(q, kc, vc, n_keys, 0)) < 1e-5


def _sliced_and_whole(A, seed: int, S: int, Dh: int, n_keys: int, window: int, sliced: dict, whole: dict) -> tuple:
    """The 28 / 4 heads over an S-row float32 cache at n_keys: (q, kc, vc, pos, path counts of the
    sliced launch, its output, the whole-V output) in the interpreter."""
    from minfer.ops import paths

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 28, Dh, generator=g)
    kc, vc = torch.randn(S, 4, Dh, generator=g), torch.randn(S, 4, Dh, generator=g)
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    paths.reset()
    a = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, q8=True, **sliced)
    counts = paths.snapshot()["counts"]
    b = A.decode_attention(q, kc, vc, pos, window=window, n_keys_add=1, q8=True, **whole)
    return q, kc, vc, pos, counts, a, b


def _same_within_rounding(a, b, ref):
    assert rel_err(a, b) < 1e-6
    assert rel_err(a, ref) < 1e-5
    qa, qb = a.q8[0].view(torch.int8).to(torch.int32), b.q8[0].view(torch.int8).to(torch.int32)
    assert int((qa - qb).abs().max()) <= 1 and rel_err(a.q8[1], b.q8[1]) < 1e-5


@pytest.mark.parametrize("Dh,vsplit,n_keys,window", [(128, 4, 5, 0), (128, 4, 32, 0), (128, 2, 29, 9), (64, 2, 17, 0),
                                                     (64, 4, 17, 0)])
def test_decode_attention_v_split_one_split(M, Dh, vsplit, n_keys, window):
    """Switches.decode_attn_vsplit: the one-split kernel spread over V slices -- each program all of K's
    dims, 1/vsplit of V's -- writes the output and its int8 words and chunk scales as the whole-V
    program does (the same scores; the interpreter's dots: within float32 rounding) and the
    reference's values; counted as `attention.decode.one_split.v<n>`; a slice under 32 dims (64 /
    4) keeps one program a KV head, uncounted."""
    A = M["attention"]
    q, kc, vc, pos, counts, a, b = _sliced_and_whole(A, n_keys * 7 + Dh + vsplit, 32, Dh, n_keys, window,
                                                     {"vsplit": vsplit}, {"vsplit": 1})
    split = Dh // vsplit >= 32
    assert counts.get("attention.decode.one_split") == 1
    assert counts.get(f"attention.decode.one_split.v{vsplit}") == (1 if split else None), counts
    _same_within_rounding(a, b, reference.decode_attention(q, kc, vc, n_keys, window))
    with pytest.raises(Exception, match="MINFER_DECODE_ATTN_VSPLIT=3"):
        A.decode_attention(q, kc, vc, pos, n_keys_add=1, vsplit=3)


@pytest.mark.parametrize("split_vs,n_keys,S,window", [(2, 70, 80, 0), (4, 80, 80, 0), (2, 37, 80, 16), (4, 33, 50, 0)])
def test_decode_attention_v_split_key_splits(M, split_vs, n_keys, S, window):
    """Switches.decode_attn_split_vs: each key split's program spread over V slices (slice 0 stores
    the split's max and sum) gives, after the combine, the whole-V kernel's output and q8 form
    (within float32 rounding) and the reference's values; counted `attention.decode.split.v<n>`.
    16-key tiles in the interpreter: several splits from 33 rows on."""
    A = M["attention"]
    q, kc, vc, pos, counts, a, b = _sliced_and_whole(A, n_keys * 11 + S + split_vs, S, 128, n_keys, window,
                                                     {"split_vs": split_vs}, {})
    assert counts.get(f"attention.decode.split.v{split_vs}") == 1 and "attention.decode.one_split" not in counts
    _same_within_rounding(a, b, reference.decode_attention(q, kc, vc, n_keys, window))


@pytest.mark.parametrize("S,n_keys,window,vsplit", [(80, 70, 0, 1), (80, 65, 0, 1), (80, 49, 0, 1), (80, 70, 16, 1),
                                                    (80, 33, 0, 1), (32, 29, 0, 4), (32, 29, 0, 1), (32, 5, 0, 4),
                                                    (32, 17, 0, 1), (32, 30, 7, 4), (32, 1, 0, 4), (80, 1, 0, 1)])
@pytest.mark.parametrize("softcap", [0.0, 30.0])
def test_decode_attention_pipe(M, S, n_keys, window, vsplit, softcap):
    """Switches.decode_attn_pipe: every tile's cached rows copied by the pipelined loop (its first
    iteration takes the PDL wait and reads q and this step's row), this step's row folded in after
    the tiles, gives the plain loop's output and q8 form within float32 rounding and the
    reference's values -- whether this step's row starts a split, falls inside a tile, is the only
    key (a tile with no cached row), a sliding window empties a split, or one split writes the
    output itself (over V slices or not); soft-capped scores too. 16-key tiles in the interpreter:
    three splits at 80 rows, one at 32."""
    A = M["attention"]
    extra = {"softcap": softcap} if softcap else {}
    q, kc, vc, pos, counts, a, b = _sliced_and_whole(A, n_keys * 13 + S + window, S, 128, n_keys, window,
                                                     {"pipe": True, "vsplit": vsplit, **extra},
                                                     {"vsplit": vsplit, **extra})
    ref = reference.decode_attention(q, kc, vc, n_keys, window, softcap)
    _same_within_rounding(a, b, ref)
    assert ("attention.decode.one_split" in counts) == (S <= 32)


@pytest.mark.parametrize("chunk", [64, 128])
@pytest.mark.parametrize("n_keys,window", [(70, 0), (37, 16)])
def test_decode_combine_chunk(M, chunk, n_keys, window):
    """Switches.decode_combine_chunk: the combine launch's programs merging 64 or 128 values each
    (fewer programs) give the 32-value programs' output and q8 form within float32 rounding and the
    reference's values; a value other than 32, 64 or 128 is refused by name."""
    A = M["attention"]
    q, kc, vc, pos, counts, a, b = _sliced_and_whole(A, n_keys * 17 + chunk, 80, 128, n_keys, window,
                                                     {"combine_chunk": chunk}, {})
    assert "attention.decode.one_split" not in counts
    _same_within_rounding(a, b, reference.decode_attention(q, kc, vc, n_keys, window))
    with pytest.raises(Exception, match="MINFER_DECODE_COMBINE_CHUNK=48"):
        A.decode_attention(q, kc, vc, pos, n_keys_add=1, combine_chunk=48)
