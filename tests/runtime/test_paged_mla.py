"""deepseek2's multi-head latent attention through the paged KV cache (runtime/paged_kv.py v_in_k):
the paged MLA decode kernel (minfer/ops/cuda/paged_attention_mla.py) in Triton's interpreter
against a float64 formula written here (rows of 1..40 keys over shuffled pages of 4 and 8, head
counts of 4 to 40 over one or more head blocks, one split and several, a block table wider than
the rows as under a CUDA graph); PagedKVCache with V a view of K against KVCache on the same
writes (layout, bytes, a ragged step of decode rows and chunks); then the batch engine on the
deepseek2 / deepseek3 fixtures: batched greedy of concurrent prompts with chunked prefill identical
to single-sequence greedy, on the CPU and with the interpreted kernel serving the decode rows, and
different with the scale or the value dims changed."""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.ops import paths
from minfer.runtime.kv_cache import KVCache, kv_bytes_per_position
from minfer.runtime.paged_kv import PagedKVCache, PagedStep, paged_attention_ref
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.scheduler import StepItem
from minfer.runtime.sequence import Sequence

pytest.importorskip("triton")
pytestmark = pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")

PATH = "attention.paged_decode.mla.triton"


@pytest.fixture
def interpreter(monkeypatch):
    """attention_mla's kernels (which the paged one shares) build for the mode TRITON_INTERPRET says."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def formula(q, k, dv, scale):
    """softmax(scale q . K^T) K[:, :dv] in float64: q (H, Dk), k (n, Dk) -> (H, dv)."""
    s = q.double() @ k.double().T * scale
    return torch.softmax(s, dim=-1) @ k[:, :dv].double()


def scatter(lens, page, dk, n_blocks, seed=0, dtype=torch.float32, extra_width=1):
    """Random key rows per sequence scattered into shuffled pages (1, dk); every other slot holds
    1e4 (a read of a wrong slot shows). -> (pages, block tables, per-row keys (n, dk))."""
    g = torch.Generator().manual_seed(seed)
    kp = torch.full((n_blocks, page, 1, dk), 1e4, dtype=dtype)
    order = (torch.randperm(n_blocks - 1, generator=g) + 1).tolist()       # block 0 reserved
    conts, tables = [], []
    for n in lens:
        k = torch.randn(n, dk, generator=g).to(dtype)
        table = [order.pop() for _ in range(-(-n // page))]
        for p in range(n):
            kp[table[p // page], p % page, 0] = k[p]
        conts.append(k)
        tables.append(table)
    bt = torch.zeros(len(lens), max(len(t) for t in tables) + extra_width, dtype=torch.int32)
    for i, t in enumerate(tables):
        bt[i, :len(t)] = torch.tensor(t)
    return kp, bt, conts


# (page, H, splits, R, Dr, extra block-table width): one head block (H <= 16) and several (20, 40,
# the last one partial), one split (the direct store) and several (the merge launch, splits that
# short rows leave empty), None = the programs' choice, a table much wider than the rows (a CUDA
# graph's grid: splits of the span, most of them empty for these rows)
CASES = [(4, 4, 1, 32, 8, 1), (4, 16, None, 32, 8, 1), (8, 20, 3, 32, 16, 1), (4, 40, 6, 32, 8, 1),
         (8, 4, 2, 48, 16, 1), (4, 16, None, 32, 16, 24)]


@pytest.mark.parametrize("page,H,splits,R,DR,extra", CASES)
def test_paged_mla_kernel_matches_formula(interpreter, page, H, splits, R, DR, extra):
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

    lens = [1, 7, 2 * page + 3, 40, 16]
    dk = R + DR
    kp, bt, conts = scatter(lens, page, dk, n_blocks=48, seed=page + H, extra_width=extra)
    q = torch.randn(len(lens), H, dk, generator=torch.Generator().manual_seed(H))
    scale = 0.37
    out = paged_mla_decode(q, kp, kp[..., :R], bt, torch.tensor(lens, dtype=torch.int32), scale=scale,
                           n_split=splits)
    assert out.shape == (len(lens), H, R) and out.dtype == q.dtype
    for i, k in enumerate(conts):
        torch.testing.assert_close(out[i].double(), formula(q[i], k, R, scale), rtol=1e-5, atol=1e-5)
    # the torch path of the CPU (paged_attention_ref: V narrower than K) agrees
    ref = paged_attention_ref(q, kp, kp[..., :R], bt, torch.tensor(lens), scale=scale)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_paged_mla_kernel_fp16_default_scale_and_padding_rows(interpreter):
    """fp16 pages (the interpreter's bf16 dot is not the GPU's: tests/gpu checks bf16), the default
    scale 1/sqrt(Dk), and a CUDA-graph bucket's padding row (table [0], one key in block 0)."""
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

    R, DR, page = 32, 16, 8
    lens = [3, 29, 1]
    kp, bt, conts = scatter(lens, page, R + DR, n_blocks=16, seed=3, dtype=torch.float16)
    kp[0] = 0.5                                  # the padding block: finite
    bt[2] = 0
    conts[2] = kp[0, :1, 0]
    q = torch.randn(3, 8, R + DR, generator=torch.Generator().manual_seed(2)).half()
    out = paged_mla_decode(q, kp, kp[..., :R], bt, torch.tensor(lens, dtype=torch.int32), n_split=2)
    assert out.dtype == torch.float16
    for i, k in enumerate(conts):
        want = formula(q[i], k, R, 1 / math.sqrt(R + DR))
        torch.testing.assert_close(out[i].double(), want, rtol=2e-3, atol=2e-3)


def test_paged_mla_refusals(interpreter):
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode, paged_mla_refusal

    kp = torch.randn(4, 4, 1, 40)
    q = torch.randn(2, 4, 40)
    assert paged_mla_refusal(q, kp, kp[..., :32]) is None
    assert "view" in paged_mla_refusal(q, kp, kp[..., :32].clone())
    assert "view" in paged_mla_refusal(q, kp, kp[..., 8:])
    assert "window" in paged_mla_refusal(q, kp, kp[..., :32], window=4)
    assert "cap" in paged_mla_refusal(q, kp, kp[..., :32], softcap=5.0)
    assert "sink" in paged_mla_refusal(q, kp, kp[..., :32], sinks=torch.zeros(4))
    two = torch.randn(4, 4, 2, 40)
    assert "2 KV heads" in paged_mla_refusal(q, two, two[..., :32])
    with pytest.raises(MinferError, match="not a view"):
        paged_mla_decode(q, kp, kp[..., :32].clone(), torch.zeros(2, 1, dtype=torch.int32),
                         torch.ones(2, dtype=torch.int32))


# ---- the cache ----------------------------------------------------------------------------------

R, DR, H = 32, 8, 4


def test_paged_cache_v_in_k_layout_and_bytes():
    """V is the view of K's first R dims (stored once): nbytes, bytes_per_block and the preflight's
    kv_bytes_per_position count K only, as KVCache's."""
    from minfer.config import ModelConfig

    c = PagedKVCache(3, 10, 4, 1, R + DR, v_in_k=R)
    assert c.v.data_ptr() == c.k.data_ptr() and c.v.shape == (3, 40, 1, R) and c.v_is_view()
    assert c.nbytes() == 3 * 40 * (R + DR) * 4
    kp, vp = c.pages(1)
    assert kp.shape == (10, 4, 1, R + DR) and vp.shape == (10, 4, 1, R) and vp.data_ptr() == kp.data_ptr()
    cfg = object.__new__(ModelConfig)
    for k, v in dict(n_layers=3, n_kv_heads=1, head_dim=R + DR, cache_v_in_k=R, kv_layers=None).items():
        object.__setattr__(cfg, k, v)
    assert PagedKVCache.bytes_per_block(cfg, 4) == kv_bytes_per_position(cfg, 4) * 4 == c.nbytes() // 10
    assert KVCache.for_config(cfg, 40).nbytes() == c.nbytes()
    assert PagedKVCache.for_config(cfg, 10, 4).v_is_view()
    with pytest.raises(MinferError, match="first 40 dims"):
        PagedKVCache(1, 4, 4, 1, 40, v_in_k=40)


def _ragged(cache, specs, g):
    """A step of specs [(cached positions, new tokens)] (n == 1: a decode row), the cached keys
    written at their slots, a fresh KVCache per sequence holding the same keys. -> step, items' keys,
    the KVCaches."""
    bs = cache.block_size
    free = list(range(cache.n_blocks - 1, 0, -1))
    items, keys, caches = [], [], []
    for nb, n in specs:
        s = Sequence(list(range(nb + (n if n > 1 else 0))), SamplingParams(temperature=0), 4)
        if n == 1:
            s.tokens.append(0)
        s.block_table = [free.pop() for _ in range(-(-(nb + n) // bs))]
        k = torch.randn(nb + n, 1, R + DR, generator=g)
        for p in range(nb):
            cache.k[0, s.block_table[p // bs] * bs + p % bs] = k[p]
        kv = KVCache(1, 64, 1, R + DR, v_in_k=R)
        kv.write(0, k, None, Step.at(0, nb + n, "cpu"))
        items.append(StepItem(s, nb, n, True, n == 1))
        keys.append(k)
        caches.append(kv)
    return PagedStep.build(items, bs, "cpu"), keys, caches


@pytest.mark.parametrize("kernel", [False, True], ids=["cpu", "interpreted_kernel"])
def test_paged_cache_attend_equals_kv_cache(monkeypatch, kernel):
    """A ragged step (3 decode rows, a fresh prompt, a chunk after a cached prefix) through
    PagedKVCache(v_in_k).write + attend(scale=) equals KVCache(v_in_k).attend on the same writes,
    sequence by sequence; write() stores K only (the v it is given is ignored, as KVCache's)."""
    if kernel:
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    cache = PagedKVCache(1, 32, 4, 1, R + DR, v_in_k=R)
    if kernel:
        from minfer.ops.cuda.paged_attention_mla import paged_mla_decode
        cache.decode_attention = paged_mla_decode
    g = torch.Generator().manual_seed(5)
    specs = [(6, 1), (0, 1), (13, 1), (0, 7), (9, 5)]
    cache.step, keys, kvs = _ragged(cache, specs, g)
    new = torch.cat([k[nb:] for k, (nb, _) in zip(keys, specs)])
    cache.write(0, new, torch.full((new.shape[0], 1, R), float("nan")))
    T = sum(n for _, n in specs)
    q = torch.randn(T, H, R + DR, generator=g)
    paths.reset()
    out = cache.attend(0, q, scale=0.29)
    counts = paths.snapshot()["counts"]
    assert counts.get(PATH, 0) == (1 if kernel else 0)
    assert counts.get("attention.paged_decode.mla.torch", 0) == (0 if kernel else 1)
    assert out.shape == (T, H, R)
    t = 0
    for (nb, n), kv in zip(specs, kvs):
        want = kv.attend(0, q[t:t + n], Step.at(nb, n, "cpu"), scale=0.29)
        torch.testing.assert_close(out[t:t + n], want, rtol=1e-5, atol=1e-5)
        t += n
    # the default scale (1/sqrt(R + Dr)) is another result
    assert (cache.attend(0, q) - out).abs().max() > 1e-3


# ---- the batch engine on the deepseek2 fixtures ---------------------------------------------------

N_NEW = 8


@pytest.fixture(scope="module")
def fixtures():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from models.test_arch_vs_transformers import engine, ref

    out = {}
    for name in ("deepseek2", "deepseek3"):
        ids = ref(name)["ids"].tolist()
        prompts = [ids[:20], ids[20:23], ids[5:16]]
        eng = engine(name)
        singles = [[ev.token_id for ev in eng.generate(p, SamplingParams(temperature=0), max_new_tokens=N_NEW)]
                   for p in prompts]
        out[name] = (eng, prompts, singles)
    return out


def batched(eng, prompts, decode_attention=None):
    """The prompts together through a batch engine: blocks of 4, a token budget of 8 (the 20- and
    11-token prompts prefill in chunks, next to decode rows)."""
    from minfer.runtime.batch_engine import BatchEngine

    assert eng.model.paged_kv
    be = BatchEngine(eng.model, eng.tokenizer, n_ctx=64, max_seqs=3, n_blocks=48, block_size=4, token_budget=8)
    assert be.cache.v_is_view()
    be.cache.decode_attention = decode_attention
    outs = be.generate_many(prompts, SamplingParams(temperature=0), N_NEW)
    return [[ev.token_id for ev in o] for o in outs]


@pytest.mark.parametrize("name", ["deepseek2", "deepseek3"])
def test_batch_engine_serves_as_single_greedy(fixtures, name):
    eng, prompts, singles = fixtures[name]
    paths.reset()
    assert batched(eng, prompts) == singles
    assert paths.snapshot()["counts"].get("attention.paged_decode.mla.torch", 0) > 0


@pytest.mark.parametrize("name", ["deepseek2", "deepseek3"])
def test_batch_engine_with_the_interpreted_paged_mla_kernel(fixtures, name, interpreter):
    """The decode rows through the paged MLA kernel in Triton's interpreter (as the CUDA engine sets
    cache.decode_attention), the chunks by ops.attention with V the gathered keys' first dims."""
    from minfer.ops.cuda.paged_attention_mla import paged_mla_decode

    eng, prompts, singles = fixtures[name]
    paths.reset()
    assert batched(eng, prompts, paged_mla_decode) == singles
    snap = paths.snapshot()
    assert snap["counts"].get(PATH, 0) > 0 and snap["counts"].get("attention.paged_decode.mla.torch", 0) == 0
    assert not [f for f in snap["fallbacks"] if f.startswith(PATH)]


@pytest.mark.parametrize("rule", ["scale", "value_dims"])
def test_batch_engine_needs_the_rules(fixtures, rule, monkeypatch):
    """With the default scale 1/sqrt(R + Dr) instead of the model's, or the decode rows' V read as
    the last R dims of the key rows instead of the first, batched greedy differs from single greedy."""
    eng, prompts, singles = fixtures["deepseek3"]
    if rule == "scale":
        attend = PagedKVCache.attend
        monkeypatch.setattr(PagedKVCache, "attend", lambda self, *a, scale=None, **kw: attend(self, *a, **kw))
    else:
        pages = PagedKVCache.pages

        def shifted(self, layer):
            kp, vp = pages(self, layer)
            return kp, kp[..., kp.shape[-1] - vp.shape[-1]:]
        monkeypatch.setattr(PagedKVCache, "pages", shifted)
    assert batched(eng, prompts) != singles
