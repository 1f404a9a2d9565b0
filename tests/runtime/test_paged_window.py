"""Sliding windows, soft-capping and a custom scale in the paged cache's decode attention: the
Triton paged decode kernel's WINDOW / CAP variants and runtime scale (Triton's interpreter) against
a float64 formula written here; the torch paths (paged_attention_ref, windowed_attention,
PagedKVCache.attend) with scale against reference.attention; then the batch engine on the gemma2
fixture (window 8 and attention soft-cap 3 on its local layers, the cap alone on its global ones)
and the gemma4 fixture (scale 1.0, per-layer geometry): batched greedy with chunked prefill and the
interpreted kernel serving every decode row equals single-sequence greedy, and differs with the
kernel's window, soft-cap or scale dropped."""

from __future__ import annotations

import math

import pytest
import torch

from minfer.ops import paths, reference
from minfer.runtime.paged_kv import paged_attention_ref, windowed_attention
from minfer.runtime.sampling import SamplingParams
from runtime.paged_helpers import batched_logits, kernel_loads, paged_data, ragged_step
from runtime.test_paged_kv import _scatter
from runtime.test_paged_sinks import PA, PROMPTS, N_NEW, SINKS  # noqa: F401  (PA: a fixture)

pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning",
                                        "ignore:overflow encountered in exp:RuntimeWarning",
                                        "ignore:invalid value encountered in subtract:RuntimeWarning")


def formula(q, k, v, window=0, softcap=0.0, scale=None, sinks=None):
    """float64, head by head: the query q (H, D) at position p = n - 1 over keys/values (n, Hkv, D)
    sees keys j with p - j < window (all with window 0); scores scale * q.k (scale default
    1/sqrt(D)), then softcap * tanh(s / softcap), then the softmax (with a sink logit per head,
    its column dropped) -> (H, Dv)."""
    n, H, D = k.shape[0], q.shape[0], q.shape[1]
    g = H // k.shape[1]
    lo = max(0, n - window) if window > 0 else 0
    c = 1.0 / math.sqrt(D) if scale is None else scale
    out = torch.empty(H, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        s = (k[lo:, h // g].double() @ q[h].double()) * c
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        if sinks is not None:
            s = torch.cat((s, sinks[h].double().reshape(1)))
        out[h] = torch.softmax(s, 0)[:n - lo] @ v[lo:, h // g].double()
    return out


def _check(out, q, conts, **kw):
    for i, (k, v) in enumerate(conts):
        torch.testing.assert_close(out[i].double(), formula(q[i], k, v, **kw), rtol=1e-4, atol=1e-4)


# rows of 1 key to several tiles' worth (page 4: 40 keys span 10 pages); tiles of 4, 8 and 16 keys
# on pages of 4 or 8 (a tile of 16 spans 4 pages); windows of 1 (the key itself), mid-tile (5), at
# tile/page edges (8, 16), equal to a row's length (5, 40) and longer than every row (64): the
# window's first key falls at a tile edge or mid-tile depending on the row (40 - 8 = 32, 40 - 16:
# edges; 41 - 8, 23 - 8, 40 - 5: mid-tile)
LENS = [1, 5, 23, 40, 41]
WINDOWS = [1, 5, 8, 16, 40, 64]


@pytest.mark.parametrize("page,block_keys,H,hkv,n_split", [(4, 4, 4, 4, 1), (4, 8, 8, 4, 3), (8, 4, 8, 2, 2),
                                                           (4, 16, 4, 1, 4)],
                         ids=["G1-bs4-1split", "G2-bs8-3splits", "G4-page8-2splits", "G4-bs16-4splits"])
def test_window_kernel_matches_formula(PA, page, block_keys, H, hkv, n_split):
    q, kp, vp, bt, cl, conts = paged_data(LENS, page, H, hkv, seed=page + H)
    for window in WINDOWS:
        out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys, window=window)
        _check(out, q, conts, window=window)
    # the rule is needed: without the window the rows longer than it differ
    full = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys)
    assert all((full[i] - out[i]).abs().max() < 1e-5 for i, n in enumerate(LENS) if n <= 64)
    out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=block_keys, window=5)
    assert all((full[i] - out[i]).abs().max() > 1e-2 for i, n in enumerate(LENS) if n > 5)


@pytest.mark.parametrize("window,n_split,merge_in_kernel", [(0, 3, False), (6, 1, True), (6, 3, True)])
def test_softcap_and_scale_in_the_kernel(PA, window, n_split, merge_in_kernel):
    """CAP (scores 3x larger than the cap, so it bites) and a runtime scale, with and without a
    window, over 1 and 3 splits merged either way; each needed."""
    q, kp, vp, bt, cl, conts = paged_data(LENS, 4, 8, 2, seed=5, amp=6.0)
    kw = dict(n_split=n_split, block_keys=4, merge_in_kernel=merge_in_kernel, window=window)
    capped = PA.paged_decode_attention(q, kp, vp, bt, cl, softcap=3.0, **kw)
    _check(capped, q, conts, window=window, softcap=3.0)
    scaled = PA.paged_decode_attention(q, kp, vp, bt, cl, scale=0.05, **kw)
    _check(scaled, q, conts, window=window, scale=0.05)
    both = PA.paged_decode_attention(q, kp, vp, bt, cl, softcap=3.0, scale=1.0, **kw)
    _check(both, q, conts, window=window, softcap=3.0, scale=1.0)
    plain = PA.paged_decode_attention(q, kp, vp, bt, cl, **kw)
    long = [i for i, n in enumerate(LENS) if n > 1]        # one key: softmax 1 whatever the scores
    assert all((capped[i] - plain[i]).abs().max() > 1e-2 for i in long)
    assert all((scaled[i] - plain[i]).abs().max() > 1e-2 for i in long)


@pytest.mark.parametrize("H,hkv,n_split,merge_in_kernel", [(4, 4, 1, True), (8, 4, 3, False), (8, 2, 6, True)],
                         ids=["G1-1split", "G2-3splits-merge_kernel", "G4-6splits-merge_in_kernel"])
def test_window_with_sinks_in_the_kernel(PA, H, hkv, n_split, merge_in_kernel):
    """gpt-oss: WINDOW + SINK, split 0 starting from the sink, the splits dividing the window's
    tiles (some of them empty); soft-capped too at window 8."""
    q, kp, vp, bt, cl, conts = paged_data(LENS, 4, H, hkv, seed=H + hkv)
    sinks = SINKS[:H]
    for window in (1, 8, 64):
        out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=4, window=window,
                                        sinks=sinks, merge_in_kernel=merge_in_kernel, softcap=4.0 if window == 8 else 0)
        _check(out, q, conts, window=window, sinks=sinks, softcap=4.0 if window == 8 else 0)
    no_sink = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=4, window=5)
    out = PA.paged_decode_attention(q, kp, vp, bt, cl, n_split=n_split, block_keys=4, window=5, sinks=sinks)
    assert (out - no_sink).abs().max() > 1e-2


def test_window_skips_the_tiles_before_it(PA, monkeypatch):
    """A window layer reads about `window` keys, not the whole row: the interpreted kernel issues
    as many loads for a row of 302 keys as for one of 30 (window 8 from key 22 / 294: the tiles
    of 4 from 20 / 292, 3 each), while the full row's loads grow with its length."""
    w30, w302 = kernel_loads(PA, monkeypatch, 30, window=8), kernel_loads(PA, monkeypatch, 302, window=8)
    assert w30 == w302
    assert kernel_loads(PA, monkeypatch, 302, window=0) > 10 * w302


# ---- the torch paths with scale ------------------------------------------------------------------

@pytest.mark.parametrize("window,softcap", [(0, 0.0), (5, 0.0), (0, 3.0), (5, 3.0)])
def test_torch_paths_with_scale_match_reference(window, softcap):
    bs, H, hkv, dh = 4, 8, 2, 8
    lens = [1, 3, 9, 14]
    kp, vp, bt, conts = _scatter(lens, bs, hkv, dh, n_blocks=32, seed=9)
    q = 3 * torch.randn(len(lens), H, dh, generator=torch.Generator().manual_seed(4))
    cl = torch.tensor(lens, dtype=torch.int32)
    out = paged_attention_ref(q, kp, vp, bt, cl, window, softcap, scale=0.9)
    for i, (n, (k, v)) in enumerate(zip(lens, conts)):
        ref = reference.attention(q[i:i + 1], k, v, n - 1, window, softcap, scale=0.9)
        torch.testing.assert_close(out[i:i + 1], ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[i].double(), formula(q[i], k, v, window, softcap, 0.9), rtol=1e-5, atol=1e-5)
    assert (out - paged_attention_ref(q, kp, vp, bt, cl, window, softcap)).abs().max() > 1e-2
    k, v = conts[3]
    qc = 3 * torch.randn(6, H, dh, generator=torch.Generator().manual_seed(5))
    got = windowed_attention(qc, k, v, 8, window, softcap, scale=0.9)                   # positions 8..13
    torch.testing.assert_close(got, reference.attention(qc, k, v, 8, window, softcap, scale=0.9),
                               rtol=1e-5, atol=1e-5)
    assert (got - windowed_attention(qc, k, v, 8, window, softcap)).abs().max() > 1e-2


SPECS = [(6, 1), (17, 1), (0, 7), (8, 5)]         # 2 decode rows, a fresh prompt, a chunk after a prefix


@pytest.mark.parametrize("window,softcap,sinks", [(0, 0.0, False), (5, 0.0, False), (0, 3.0, False),
                                                  (5, 3.0, False), (5, 0.0, True)])
@pytest.mark.parametrize("kernel", [False, True], ids=["torch", "interpreted_kernel"])
def test_cache_attend_with_scale(PA, window, softcap, sinks, kernel):
    """A ragged step through PagedKVCache.attend(..., scale=) equals reference.attention with the
    scale, sequence by sequence, with the decode rows by paged_attention_ref or (as on CUDA) the
    interpreted kernel; each path counted where it ran."""
    H, hkv, dh = 8, 2, 8
    cache, T, full = ragged_step(4, hkv, dh, SPECS)
    cache.decode_attention = PA.paged_decode_attention if kernel else None
    q = 3 * torch.randn(T, H, dh, generator=torch.Generator().manual_seed(8))
    sk = SINKS[:H] if sinks else None
    paths.reset()
    out = cache.attend(0, q, window=window, softcap=softcap, sinks=sk, scale=0.7)
    counts = paths.snapshot()["counts"]
    t = 0
    for (nb, n), (k, v) in zip(SPECS, full):
        ref = reference.attention(q[t:t + n], k, v, nb, window, softcap, sk, scale=0.7)
        torch.testing.assert_close(out[t:t + n], ref, rtol=1e-4, atol=1e-4)
        t += n
    variant = (".softcap" if softcap else "") + (".window" if window else "") + (".sinks" if sinks else "")
    assert counts.get(f"attention.paged_decode{variant}.triton", 0) == (1 if kernel else 0)
    assert counts.get(f"attention.paged_decode{variant}.torch", 0) == (1 if not kernel and variant not in
                                                                       ("", ".sinks") else 0)
    assert counts.get(f"attention.paged_prefill{variant}.torch", 0) == (2 if window or softcap else 0)
    assert (out - cache.attend(0, q, window=window, softcap=softcap, sinks=sk)).abs().max() > 1e-2


# ---- the batch engine: gemma2 (window + soft-cap) and gemma4 (scale 1.0) -------------------------

def _engine(name):
    from models.test_arch_vs_transformers import engine
    return engine(name)


def _singles(eng):
    return [[ev.token_id for ev in eng.generate(p, SamplingParams(temperature=0), max_new_tokens=N_NEW)]
            for p in PROMPTS]


@pytest.fixture(scope="module")
def gemma2():
    eng = _engine("gemma2")
    return eng, _singles(eng)


@pytest.fixture(scope="module")
def gemma4():
    eng = _engine("gemma4")
    return eng, _singles(eng)


def _without(PA, what):
    """The interpreted kernel with one of its arguments dropped (window, softcap or scale)."""
    return lambda *a, **kw: PA.paged_decode_attention(*a, **{k: x for k, x in kw.items() if k != what})


def test_batch_engine_gemma2_with_the_interpreted_window_softcap_kernel(gemma2, PA):
    """Every decode row through the interpreted kernel: the local layers' by WINDOW + CAP, the
    global layers' by CAP; the chunks by windowed_attention (the CPU reference). Batched greedy
    (3 prompts, chunked prefill at budget 8, blocks of 4 under the window of 8) equals single, and
    its logits the CPU torch path's; without the kernel's window or soft-cap they differ (the
    fixture's greedy answers repeat one token, so the logits show it)."""
    eng, singles = gemma2
    paths.reset()
    toks, ref = batched_logits(eng, PROMPTS, N_NEW, None)                         # the CPU's torch paths
    assert toks == singles
    assert paths.snapshot()["counts"].get("attention.paged_decode.softcap.window.torch", 0) > 0
    paths.reset()
    toks, got = batched_logits(eng, PROMPTS, N_NEW, PA.paged_decode_attention)
    assert toks == singles
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.softcap.window.triton", 0) > 0
    assert counts.get("attention.paged_decode.softcap.triton", 0) > 0
    assert not [p for p in counts if p.startswith("attention.paged_decode") and p.endswith(".torch")]
    for what in ("window", "softcap"):
        assert (batched_logits(eng, PROMPTS, N_NEW, _without(PA, what))[1] - ref).abs().max() > 1e-2, what


def test_batch_engine_gemma4_scale_through_the_kernel(gemma4, PA):
    """gemma4's attention scale 1.0 reaches the kernel (scale=, no pre-scaled q): batched greedy
    with the interpreted kernel equals single greedy, its logits the CPU torch path's; with the
    kernel's default scale they differ."""
    eng, singles = gemma4
    toks, ref = batched_logits(eng, PROMPTS, N_NEW, None)
    assert toks == singles
    paths.reset()
    toks, got = batched_logits(eng, PROMPTS, N_NEW, PA.paged_decode_attention)
    assert toks == singles
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    counts = paths.snapshot()["counts"]
    assert counts.get("attention.paged_decode.window.triton", 0) > 0
    assert counts.get("attention.paged_decode.triton", 0) > 0
    assert (batched_logits(eng, PROMPTS, N_NEW, _without(PA, "scale"))[1] - ref).abs().max() > 1e-2
