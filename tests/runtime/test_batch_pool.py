"""The batch engine's KV pool sizing (BatchEngine.from_engine -> batch_engine.plan_pool): the
CUDA default pool, sized from the memory free after the load, holds at least one full context
when the memory allows, and is a one-line MinferError naming the sizes when it does not (it was
a pool shorter than the context: prompts past it refused, answers cut there). The CUDA sizing
is a pure function of the free bytes, checked here on the CPU."""

from __future__ import annotations

import pytest

from minfer.errors import MinferError
from minfer.runtime.batch_engine import KV_MEMORY_FRACTION, KV_RESERVE_MIN, BatchEngine, plan_pool
from minfer.runtime.engine import Engine

MiB, GiB = 1 << 20, 1 << 30
BS = 16
PER_BLOCK = 1 * MiB
N_CTX = BS * 8191            # 8,191 blocks: one full context is 8,192 blocks (block 0 pads) = 8 GiB
ONE_CTX_BLOCKS = 8191 + 1


def test_default_pool_grows_to_one_full_context_when_the_memory_allows():
    free = int(9.25 * GiB)  # 85% is 8,051 MiB (the old pool: 8,051 blocks, short of a context); 8 GiB leaves 1.25
    assert free * KV_MEMORY_FRACTION < ONE_CTX_BLOCKS * PER_BLOCK <= free - KV_RESERVE_MIN
    slots, n_blocks = plan_pool(N_CTX, BS, PER_BLOCK, free=free, default_slots=256)
    assert n_blocks == ONE_CTX_BLOCKS
    assert slots == 4                        # a quarter context each, as the default sizing gives
    # with the slots given, the same floor
    slots, n_blocks = plan_pool(N_CTX, BS, PER_BLOCK, max_seqs=8, free=free)
    assert (slots, n_blocks) == (8, ONE_CTX_BLOCKS)


def test_default_pool_that_cannot_hold_one_context_is_a_one_line_error_naming_the_sizes():
    free = int(8.5 * GiB)  # 8 GiB would leave 0.5 GiB, under KV_RESERVE_MIN
    with pytest.raises(MinferError) as e:
        plan_pool(N_CTX, BS, PER_BLOCK, free=free, device="cuda:0")
    msg = str(e.value)
    assert "\n" not in msg
    for part in (f"{N_CTX} tokens", "8192 MiB", "8192 blocks of 16 positions", "8704 MiB", "cuda:0", "-c/--ctx"):
        assert part in msg, (part, msg)
    # the context it suggests does fit
    fit = int(msg.split("-c/--ctx ")[-1].split(" ")[0])
    slots, n_blocks = plan_pool(fit, BS, PER_BLOCK, free=free)
    assert n_blocks >= -(-fit // BS) + 1
    with pytest.raises(MinferError):
        plan_pool(fit + BS, BS, PER_BLOCK, free=free)


def test_ample_memory_keeps_the_fraction_and_the_slot_cap():
    free = 100 * GiB                          # 85% = 87,040 blocks: 42 slots at a quarter context each
    slots, n_blocks = plan_pool(N_CTX, BS, PER_BLOCK, free=free)
    assert (slots, n_blocks) == (42, 87040)
    slots, n_blocks = plan_pool(N_CTX, BS, PER_BLOCK, max_seqs=2, free=free)   # at most 2 full contexts
    assert (slots, n_blocks) == (2, 2 * 8191 + 1)


def test_a_given_kv_memory_and_the_cpu_rule_are_unchanged():
    # a --kv-memory below a context is taken as given (the CLI refuses it before the load)
    assert plan_pool(N_CTX, BS, PER_BLOCK, max_seqs=2, kv_memory=100 * MiB, free=None) == (2, 100)
    assert plan_pool(N_CTX, BS, PER_BLOCK, kv_memory=100 * MiB, free=8 * GiB) == (1, 100)   # at least 1 slot
    assert plan_pool(N_CTX, BS, PER_BLOCK, free=None, default_slots=4) == (4, 4 * 8191 + 1)
    with pytest.raises(MinferError, match="--kv-memory"):
        plan_pool(N_CTX, BS, PER_BLOCK, kv_memory=1 * MiB)


def test_from_engine_on_the_cpu(tiny):
    be = BatchEngine.from_engine(Engine(tiny, None, 128), max_seqs=2)
    assert be.max_seqs == 2 and be.blocks.n_blocks == 2 * (128 // 16) + 1
    assert be.blocks.capacity_tokens >= be.n_ctx
