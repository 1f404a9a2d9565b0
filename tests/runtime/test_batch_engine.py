"""The batch engine on the CPU: batched sampling against the single-sequence sampler, and
whole generations through the paged cache against the single-user Engine.

Greedy outputs must not depend on batching: a prompt alone or among others, through chunked
prefill, prefix hits or preemption, gives the tokens the contiguous-cache Engine gives.
"""

from __future__ import annotations

import math

import pytest
import torch

from minfer.runtime.batch_sampling import sample_rows, token_logprobs, uniforms
from minfer.runtime.sampling import SamplingParams, probabilities


def test_uniforms_are_a_function_of_seed_position_and_token():
    seeds = torch.tensor([1, 2, 1, 2**40 + 5])
    pos = torch.tensor([7, 7, 7, 3])
    u = uniforms(seeds, pos, 1000)
    assert torch.equal(u[0], u[2])
    assert not torch.equal(u[0], u[1])
    assert torch.equal(uniforms(seeds[3:], pos[3:], 1000)[0], u[3])   # independent of the other rows
    assert float(u.min()) > 0 and float(u.max()) < 1
    big = uniforms(torch.arange(64), torch.arange(64) * 3, 5000)   # 320k draws: mean 0.5 +- 0.0005
    assert abs(float(big.mean()) - 0.5) < 0.003 and abs(float((big < 0.1).double().mean()) - 0.1) < 0.003


def test_greedy_rows_and_penalties_match_the_single_sampler():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, repeat_penalty=1.5,
                                                            presence_penalty=0.5, frequency_penalty=0.2),
              SamplingParams(temperature=0)]
    hist = [[1, 2], [int(logits[1].argmax()), 3, 3], []]
    toks = sample_rows(logits, params, hist, [0, 0, 0], [5, 5, 5])
    for r in range(3):
        want = int(probabilities(logits[r], params[r], hist[r]).argmax())
        assert int(toks[r]) == want


@pytest.mark.parametrize("p", [SamplingParams(temperature=0.7, top_k=4, top_p=0.9, min_p=0.05),
                               SamplingParams(temperature=1.3, top_k=0, top_p=1.0, min_p=0.0),
                               SamplingParams(temperature=1.0, top_k=3, top_p=0.5, min_p=0.2)])
def test_draws_follow_the_single_samplers_distribution(p):
    """Many rows of the same logits with different seeds: the empirical frequencies are those of
    sampling.probabilities (the llama.cpp chain), and filtered tokens never appear."""
    g = torch.Generator().manual_seed(1)
    row = torch.randn(12, generator=g) * 2
    n = 6000
    logits = row.expand(n, -1).contiguous()
    toks = sample_rows(logits, [p] * n, [[]] * n, list(range(n)), [0] * n)
    freq = torch.bincount(toks, minlength=12).double() / n
    want = probabilities(row, p)
    assert set(torch.nonzero(freq).flatten().tolist()) <= set(torch.nonzero(want).flatten().tolist())
    assert float((freq - want).abs().max()) < 0.025
    # the same seeds and positions draw the same tokens again
    again = sample_rows(logits[:50], [p] * 50, [[]] * 50, list(range(50)), [0] * 50)
    assert torch.equal(again, toks[:50])


def test_token_logprobs():
    logits = torch.tensor([[0.0, 1.0, 2.0], [3.0, 0.0, 0.0]])
    lp, top = token_logprobs(logits, torch.tensor([2, 1]), [2, 0])
    ref = torch.log_softmax(logits, -1)
    assert math.isclose(lp[0], float(ref[0, 2]), rel_tol=1e-6) and math.isclose(lp[1], float(ref[1, 1]), rel_tol=1e-6)
    assert [i for i, _ in top[0]] == [2, 1] and top[1] == []


# ---- whole generations on a tiny random model -------------------------------------------------

from minfer.gguf_file import GGUFFile  # noqa: E402
from minfer.models import load_model  # noqa: E402
from minfer.runtime.batch_engine import BatchEngine  # noqa: E402
from minfer.runtime.engine import Engine  # noqa: E402
from models.tiny import TinySpec, write_tiny_model  # noqa: E402

GREEDY = SamplingParams(temperature=0)


def _alone(model, prompt, n):
    """The single-user Engine's greedy tokens (contiguous cache, one sequence)."""
    return [e.token_id for e in Engine(model, None, 128).generate(prompt, GREEDY, n)]


def _prompts(k, lo=1, hi=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 64, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
            for _ in range(k)]


def test_batched_greedy_equals_each_alone(tiny):
    prompts = _prompts(6)
    be = BatchEngine(tiny, n_ctx=128, max_seqs=8, n_blocks=64, block_size=4, token_budget=24)
    got = be.generate_many(prompts, GREEDY, 12)
    for p, evs in zip(prompts, got):
        assert [e.token_id for e in evs] == _alone(tiny, p, 12)
        assert evs[-1].finish_reason == "length" and all(e.finish_reason is None for e in evs[:-1])
    assert be.blocks.n_used == 0
    assert be.stats["prefill_tokens"] == sum(len(p) for p in prompts)


def test_preemption_and_resume_give_the_same_tokens(tiny):
    prompts = _prompts(5, 10, 30, seed=1)
    n = 16
    be = BatchEngine(tiny, n_ctx=128, max_seqs=5, n_blocks=1 + 24, block_size=4, token_budget=32,
                     prefix_cache=False)           # 96 positions for 5 x (10..30 + 16): preemption certain
    got = be.generate_many(prompts, GREEDY, n)
    assert be.scheduler.n_preemptions > 0
    for p, evs in zip(prompts, got):
        assert [e.token_id for e in evs] == _alone(tiny, p, n)
    assert be.blocks.n_used == 0


def test_seeded_sampling_is_independent_of_batching_and_preemption(tiny):
    p = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=77)
    prompts = _prompts(4, 10, 30, seed=2)
    alone = BatchEngine(tiny, n_ctx=128, max_seqs=1, n_blocks=64, block_size=4).generate_many(prompts[:1], p, 10)
    crowd = BatchEngine(tiny, n_ctx=128, max_seqs=4, n_blocks=1 + 20, block_size=4, token_budget=16,
                        prefix_cache=False).generate_many(prompts, p, 10)
    assert [e.token_id for e in alone[0]] == [e.token_id for e in crowd[0]]


def test_prefix_hit_skips_prefill_and_keeps_the_answer(tiny):
    shared = _prompts(1, 30, 31, seed=3)[0]
    be = BatchEngine(tiny, n_ctx=128, max_seqs=4, n_blocks=64, block_size=4)
    first = be.generate_many([shared + [1, 2]], GREEDY, 6)[0]
    before = be.stats["prefill_tokens"]
    second = be.generate_many([shared + [3, 4, 5]], GREEDY, 6)[0]
    assert be.stats["prefill_tokens"] - before == 3 + 2   # 28 of 33 tokens cached (7 blocks of 4)
    assert be.blocks.hits == 28
    assert [e.token_id for e in first] == _alone(tiny, shared + [1, 2], 6)
    assert [e.token_id for e in second] == _alone(tiny, shared + [3, 4, 5], 6)


def test_cancel_frees_blocks_and_others_finish(tiny):
    prompts = _prompts(3, 10, 20, seed=4)
    be = BatchEngine(tiny, n_ctx=128, max_seqs=4, n_blocks=64, block_size=4)
    seqs = [be.add(p, GREEDY, 20) for p in prompts]
    be.step()
    be.step()
    assert be.blocks.n_used > 0
    be.cancel(seqs[1].seq_id)
    out = be.step()
    assert (seqs[1], None) in out and seqs[1].finish_reason == "cancel" and seqs[1].block_table == []
    evs = {s.seq_id: [] for s in seqs}
    while be.has_work:
        for s, ev in be.step():
            evs[s.seq_id].append(ev)
    assert seqs[0].finish_reason == "length" and seqs[2].finish_reason == "length"
    assert be.blocks.n_used == 0
    be.blocks.check()


def test_request_checks(tiny):
    be = BatchEngine(tiny, n_ctx=32, max_seqs=2, n_blocks=64, block_size=4)
    from minfer.errors import MinferError
    with pytest.raises(MinferError, match="empty"):
        be.add([], GREEDY, 4)
    with pytest.raises(MinferError, match="vocabulary"):
        be.add([99], GREEDY, 4)
    with pytest.raises(MinferError, match="at most 32"):
        be.add(list(range(33)), GREEDY, 4)
    s = be.add(list(range(30)), GREEDY, 100)
    assert s.max_new_tokens == 3                        # clamped to the context, as Engine does


# ---- dense planes (CUDA batch path), run by Triton's interpreter on the CPU ----------------------

@pytest.fixture(scope="module")
def interp_mods():
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "ops"))
    from kernel_data import interpreted_modules
    for mods in interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.qmatmul"]):
        yield mods


@pytest.mark.filterwarnings("ignore:Conversion of an array with ndim:DeprecationWarning")
def test_dense_planes_equal_the_dequantized_weights_and_feed_linear(tmp_path, interp_mods):
    """attach_dense_planes decodes each matrix once (Q8_0 blocks, the dequant kernel) into a plane
    equal to the reference dequantization; linear() then multiplies through the plane (counted)."""
    from gguf import GGMLQuantizationType as T

    from minfer.ops import paths
    from minfer.runtime.dense_planes import attach_dense_planes, detach_dense_planes

    qm = interp_mods["qmatmul"]
    path = write_tiny_model(tmp_path / "q8.gguf", TinySpec(arch="llama", qtype=T.Q8_0, seed=2, vocab=64))
    model = load_model(GGUFFile(path), progress=False)
    n = attach_dense_planes(model, free_bytes=1 << 40)
    ws = [w for w in model.qweights() if w is not model.token_embd]
    assert n == sum(w.shape[0] * w.shape[1] * 4 for w in ws)
    assert getattr(model.token_embd, "batch_dense", None) is None        # gathered, never multiplied
    for w in ws:
        ref = w.dense if w.dense is not None else w.dequantize_rows(torch.arange(w.shape[0]))
        assert torch.equal(w.batch_dense, ref.float()), w.name
    w = model.blocks[0].attn_q
    x = torch.randn(5, w.shape[1], generator=torch.Generator().manual_seed(0))
    paths.reset()
    out = qm.linear(x, w)
    assert paths.snapshot()["counts"].get("qmatmul.Q8_0.dense_plane") == 1
    torch.testing.assert_close(out, x @ w.batch_dense.T)
    # a declared group (q/k/v) holds one plane, its members row views of it: one GEMM for the group
    b0 = model.blocks[0]
    grp = (b0.attn_q, b0.attn_k, b0.attn_v)
    assert b0.attn_q.batch_dense_group[0] == grp
    plane = b0.attn_q.batch_dense_group[1]
    assert all(m.batch_dense.untyped_storage().data_ptr() == plane.untyped_storage().data_ptr() for m in grp)
    paths.reset()
    outs = qm.linear_many(x, grp, (b0.attn_q_bias, b0.attn_k_bias, b0.attn_v_bias))
    assert paths.snapshot()["counts"].get("qmatmul.group3.dense_plane") == 1
    for o, m, bias in zip(outs, grp, (b0.attn_q_bias, b0.attn_k_bias, b0.attn_v_bias)):
        want = x @ m.batch_dense.T + (0 if bias is None else bias.float())
        torch.testing.assert_close(o, want)
    detach_dense_planes(model)
    assert all(getattr(w, "batch_dense", None) is None for w in ws)
    assert all(getattr(w, "batch_dense_group", None) is None for w in ws)
    from minfer.switches import Switches

    assert attach_dense_planes(model, free_bytes=1 << 40, switches=Switches(dense_plane_groups=False)) == n
    assert all(getattr(w, "batch_dense_group", None) is None for w in ws)     # a plane per weight
    detach_dense_planes(model)
    assert attach_dense_planes(model, free_bytes=1000) == 0              # too big for the memory: none


def test_zero_new_tokens_ends_at_once(tiny):
    be = BatchEngine(tiny, n_ctx=64, max_seqs=2, n_blocks=16, block_size=4)
    s = be.add([1, 2, 3], GREEDY, 0)
    assert be.step() == [(s, None)] and s.finish_reason == "length" and not be.has_work


class _Tok:
    """A stand-in tokenizer: token i reads PIECES[i]; token 6 ends the turn."""
    PIECES = ["Hel", "lo", " w", "or", "ld", "!", "<eos>"]
    eog_ids = {6}

    def stream_decoder(self):
        class D:
            def push(self, i):
                return _Tok.PIECES[i]

            def flush(self):
                return ""
        return D()


@pytest.mark.parametrize("seq_ids,stop,n", [([0, 1, 2, 3, 4, 5], ["or"], 6), ([0, 1, 6, 2], [], 4),
                                            ([0, 1, 2, 3], ["zz"], 3), ([0, 1, 2, 3, 4], ["ld!"], 5)])
def test_event_text_rules_equal_generate(tiny, seq_ids, stop, n):
    """Stop strings (held back, never emitted), end of turn, length: the batch engine's events are
    generate.generate()'s for the same tokens."""
    from minfer.runtime.generate import generate

    def logits_for(i):
        x = torch.full((7,), -5.0)
        x[seq_ids[i]] = 5.0
        return x
    state = {"i": 0}

    def step(tok):
        state["i"] += 1
        return logits_for(state["i"])
    ref = [(e.token_id, e.text, e.finish_reason)
           for e in generate(logits_for(0), step, GREEDY, n, stop=stop, decoder=_Tok().stream_decoder(), eog_ids={6})]
    be = BatchEngine(tiny, _Tok(), n_ctx=64, max_seqs=1, n_blocks=16, block_size=4)
    s = be.add([1, 2], GREEDY, n, stop=stop)
    got = []
    for tok in seq_ids:
        s.tokens.append(tok)
        ev = be._event(s, tok, 0.0, [])
        got.append((ev.token_id, ev.text, ev.finish_reason))
        if ev.finish_reason:
            break
    assert got == ref
