"""The fused draw (ops/cuda/draw.py) on the GPU against the torch draw it replaces
(batch_sampling.sample_rows + chosen_logprobs on CUDA): the same tokens over many (seed,
position) pairs at the 7B's vocabulary and small ones (with and without the merge stage), the
logprob to float32 rounding, the flags; the merge keeps the row's top order keys, and other chunk
and merge sizes draw the same tokens; and generate() with it: the torch draw's tokens
(MINFER_FUSED_DRAW=0) and the CUDA batch engine's draw for the same seed, counted as
`sampling.device.fused`. (The host's greedy answer is
test_device_sampling_gpu's: the device draw, fused or not, against the host draw.)"""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.batch_sampling import _order_keys, _row_keys, chosen_logprobs, draw_seed, sample_rows
from minfer.runtime.sampling import SamplingParams
from minfer.switches import Switches

pytestmark = pytest.mark.gpu

CASES = {
    "greedy": SamplingParams(temperature=0),
    "default": SamplingParams(seed=5),
    "top_p": SamplingParams(seed=6, top_k=100, top_p=0.5, min_p=0.0, temperature=1.3),
    "top_k1": SamplingParams(seed=7, top_k=1),
    "min_p": SamplingParams(seed=8, top_k=128, top_p=1.0, min_p=0.3, temperature=0.2),
    "hot": SamplingParams(seed=9, top_k=64, top_p=0.99, min_p=0.0, temperature=3.0),
}


# 152064: 75 sampled chunks of 2048, merged (2-10 merge programs); 40961: 21 chunks, 2-3 merge
# programs (none at top_k 1: G 64); 4097 and 50: no merge
@pytest.mark.parametrize("v", [152064, 40961, 4097, 50])
@pytest.mark.parametrize("name", list(CASES))
def test_the_same_tokens_as_the_torch_draw(name, v):
    from minfer.ops.cuda import draw

    p = CASES[name]
    fd = draw.FusedDraw(p, "cuda")
    g = torch.Generator(device="cuda").manual_seed(v)
    seed = draw_seed(p.seed if p.seed is not None else 0)
    diff, worst = 0, 0.0
    for trial in range(60):
        x = torch.randn(v, device="cuda", generator=g) * (1 + trial % 4)
        if trial % 3 == 1:
            x[::7] = x[2].clone()              # ties: broken by id on both paths
        pos = 17 + trial
        out, tok = fd(x, *_row_keys(seed, pos))
        ref = sample_rows(x[None], [p], [[]], [seed], [pos])
        lp = chosen_logprobs(x[None], ref)
        got = out.tolist()
        diff += int(got[0]) != int(ref[0]) or int(tok[0]) != int(ref[0])
        worst = max(worst, abs(got[1] - float(lp[0])))
        assert got[2:] == [0.0, 0.0]
    assert diff == 0
    assert worst < 1e-5


@pytest.mark.parametrize("v", [152064, 40961])
@pytest.mark.parametrize("k", [1, 40, 100, 128])
def test_the_merge_keeps_the_top_keys_and_other_sizes_the_tokens(k, v):
    """The default sizes' candidates hold the row's KB largest order keys; the old design (4096
    logits a chunk, no merge) and other chunk / merge sizes draw the default's tokens."""
    from minfer.ops.cuda import draw

    p = SamplingParams(seed=4, top_k=k)
    fd = draw.FusedDraw(p, "cuda")
    sizes = ((4096, 0), (512, 1024), (1024, 2048))          # (4096, 0): the design before the merge
    others = [draw.FusedDraw(p, "cuda", ch=ch, merge_keys=mk) for ch, mk in sizes]
    g = torch.Generator(device="cuda").manual_seed(k)
    seed = draw_seed(p.seed)
    for trial in range(10):
        x = torch.randn(v, device="cuda", generator=g) * (1 + trial % 4)
        if trial % 2:
            x[::7] = x[2].clone()
        out, tok = fd(x, *_row_keys(seed, trial))
        assert fd.merge == (k > 1 or v > 64 * 2048)         # (top_k 1: 64 chunks a merge program)
        want = torch.topk(_order_keys(x[None])[0], fd.kb).values
        assert torch.equal(torch.topk(fd.cand, fd.kb).values, want)
        for o in others:
            assert int(o(x, *_row_keys(seed, trial))[1][0]) == int(tok[0])


@pytest.mark.parametrize("bad,flag", [(math.nan, 2), (math.inf, 3)])
def test_non_finite_logits_raise_their_flag(bad, flag):
    from minfer.ops.cuda import draw

    x = torch.randn(152064, device="cuda")
    x[100_000] = bad
    for p in (CASES["greedy"], CASES["default"]):
        out, _ = draw.FusedDraw(p, "cuda")(x, 1, 2)
        assert out[flag].item() == 1.0 and out[5 - flag].item() == 0.0


def test_generate_draws_the_torch_draws_tokens_fused(tiny_path):
    from minfer.ops import paths
    from minfer.runtime.batch_engine import BatchEngine
    from minfer.runtime.engine import Engine

    path, vocab = tiny_path
    eng = Engine.load(path, device="cuda", ctx=128, progress=False)
    off = Engine.load(path, device="cuda", ctx=128, progress=False, switches=Switches(fused_draw=False))
    prompt = torch.randint(0, vocab, (11,), generator=torch.Generator().manual_seed(5)).tolist()
    for params in (SamplingParams(seed=77), SamplingParams(temperature=0),
                   SamplingParams(seed=78, top_k=20, top_p=0.8, min_p=0.0, temperature=1.5)):
        paths.reset()
        a = list(eng.generate(prompt, params, max_new_tokens=40))
        counts = paths.snapshot()["counts"]
        assert counts.get("sampling.device.fused") == len(a) and "sampling.device.torch" not in counts
        b = list(off.generate(prompt, params, max_new_tokens=40))
        assert [e.token_id for e in a] == [e.token_id for e in b]
        assert max(abs(x.logprob - y.logprob) for x, y in zip(a, b)) < 1e-4
    params = SamplingParams(seed=77)
    a = [e.token_id for e in eng.generate(prompt, params, max_new_tokens=24)]
    be = BatchEngine.from_engine(eng, max_seqs=2, kv_memory=64 << 20)
    c = [e.token_id for e in be.generate_many([prompt], params, 24)[0]]
    # (the batched kernels' logits equal within their numerics: a flip later needs a near-tie, as
    # test_device_sampling_gpu says)
    assert a[:8] == c[:8]


def test_top_logprobs_and_penalties_take_the_torch_draw(tiny_path):
    from minfer.ops import paths
    from minfer.runtime.engine import Engine

    path, vocab = tiny_path
    eng = Engine.load(path, device="cuda", ctx=128, progress=False)
    prompt = list(range(5, 14))
    for kw in ({"top_logprobs": 2}, {"repeat_penalty": 1.2}):
        paths.reset()
        n = len(list(eng.generate(prompt, max_new_tokens=8, seed=1, **kw)))
        counts = paths.snapshot()["counts"]
        assert counts.get("sampling.device.torch") == n and "sampling.device.fused" not in counts


def test_no_new_compile_for_new_hash_keys():
    """The hash keys change at every position and are random per generation: a key that is 1 or a
    multiple of 16 must not make Triton compile another variant of the final kernel mid-generation."""
    from minfer.ops.cuda import draw

    x = torch.randn(152064, device="cuda")
    for p in (CASES["greedy"], CASES["default"]):
        fd = draw.FusedDraw(p, "cuda")
        fd(x, 3, 5)
        torch.cuda.synchronize()
        cache = draw._final_kernel.device_caches[torch.cuda.current_device()][0]
        n = len(cache)
        for a, b in ((16, 32), (1, 1), (2**31 - 16, 48), (7, 2**30)):
            fd(x, a, b)
        torch.cuda.synchronize()
        assert len(cache) == n
