"""BlockManager: allocation from one pool, reference counts, prefix reuse by content hash."""

from __future__ import annotations

import pytest

from minfer.errors import MinferError
from minfer.runtime.block_manager import BlockManager
from minfer.runtime.sampling import SamplingParams
from minfer.runtime.sequence import Sequence


def _seq(tokens):
    return Sequence(list(tokens), SamplingParams(temperature=0), 8)


def test_grow_and_free_return_every_block():
    bm = BlockManager(9, 4)                 # 8 usable (block 0 is the padding block)
    a, b = _seq(range(10)), _seq(range(100, 107))
    bm.grow(a, 10)
    bm.grow(b, 7)
    assert len(a.block_table) == 3 and len(b.block_table) == 2
    assert 0 not in a.block_table + b.block_table
    assert len(set(a.block_table) | set(b.block_table)) == 5
    assert bm.n_free == 3 and bm.n_used == 5
    assert not bm.can_grow(a, 25)   # 7 blocks: 4 more, only 3 free
    with pytest.raises(MinferError):
        bm.grow(a, 25)
    bm.free(a)
    bm.free(b)
    assert bm.n_free == 8 and a.block_table == [] and b.block_table == []
    bm.check()


def test_prefix_hit_shares_full_blocks_and_never_the_last_token():
    bm = BlockManager(17, 4)
    a = _seq(range(12))
    bm.grow(a, 12)
    a.n_computed = 12
    bm.commit(a)                            # 3 full blocks hashed
    assert len(a.block_hashes) == 3
    # same 12 tokens: at most (12 - 1) // 4 = 2 blocks reused; the last token's block is new
    b = _seq(range(12))
    assert bm.match_prefix(b) == 8
    assert b.block_table == a.block_table[:2]
    assert [bm.ref[x] for x in a.block_table] == [2, 2, 1]
    # a longer prompt sharing 9 tokens: 2 full blocks
    c = _seq(list(range(9)) + [99, 98, 97])
    assert bm.match_prefix(c) == 8
    # a different first token: no hit (hashes chain over the prefix)
    d = _seq([7] + list(range(1, 12)))
    assert bm.match_prefix(d) == 0
    for s in (a, b, c, d):
        bm.free(s)
    bm.check()
    assert bm.n_free == 16


def test_finished_prefix_stays_cached_until_evicted():
    bm = BlockManager(5, 4)                 # 4 usable blocks
    a = _seq(range(9))
    bm.grow(a, 9)
    a.n_computed = 9
    bm.commit(a)
    bm.free(a)                              # 2 hashed blocks kept as cached, 1 plain free
    assert bm.n_free == 4
    b = _seq(range(9))
    assert bm.match_prefix(b) == 8          # reused after its owner finished
    bm.free(b)
    # a sequence that needs every block evicts the cached ones
    c = _seq(range(50, 66))
    bm.grow(c, 16)
    assert bm.n_free == 0 and not bm.by_hash
    bm.free(c)
    e = _seq(range(9))
    assert bm.match_prefix(e) == 0
    bm.check()


def test_tokens_are_compared_not_only_hashes():
    bm = BlockManager(9, 2)
    a = _seq([1, 2, 3, 4, 5])
    bm.grow(a, 5)
    a.n_computed = 5
    bm.commit(a)
    h = a.block_hashes[0]
    bm.tokens_of[bm.by_hash[h]] = (9, 9)    # as if another content had hashed the same
    b = _seq([1, 2, 3, 4, 5])
    assert bm.match_prefix(b) == 0


def test_prefix_cache_off():
    bm = BlockManager(9, 2, prefix_cache=False)
    a = _seq([1, 2, 3, 4, 5])
    bm.grow(a, 5)
    a.n_computed = 5
    bm.commit(a)
    assert bm.match_prefix(_seq([1, 2, 3, 4, 5])) == 0


def test_too_small_pool_is_an_error():
    with pytest.raises(MinferError, match="at least 2 blocks"):
        BlockManager(1, 16)
