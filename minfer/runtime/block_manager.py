"""Fixed-size KV blocks from one pool: reference counts, and prefix reuse by content hash.

The paged cache (paged_kv.py) holds `n_blocks` blocks of `block_size` positions per layer. A
sequence's block table lists the blocks holding its positions in order: position p lives in
block `block_table[p // block_size]` at offset `p % block_size`.

Prefix reuse (the design of vLLM's automatic prefix caching and nano-vllm's block_manager.py):
a block that is full gets a hash of its tokens chained with the previous block's hash, so
equal hashes mean equal token prefixes; a new sequence whose first blocks hash the same takes
those blocks (reference count + 1) and skips their prefill. The tokens are kept beside the
hash and compared, so a hash collision can only cost a miss. A block whose last user finished
keeps its content and hash in an LRU list: it is reused by a later equal prefix, or evicted
(hash dropped) when a fresh block is needed and no never-hashed block is free.

Shared blocks are never written: a hit covers at most the prompt's first n - 1 tokens rounded
down to whole blocks, so the prompt's last token (recomputed for its logits) and every later
token land in blocks the sequence owns alone.

Block 0 is reserved: padding rows of a batched decode write their keys there (paged_kv.py).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from itertools import islice

from minfer.errors import MinferError
from minfer.runtime.sequence import Sequence


def block_hash(prev: int | None, tokens) -> int:
    """The chained content hash of one full block (Python's tuple hash: deterministic for ints)."""
    return hash((prev, tuple(tokens)))


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int, prefix_cache: bool = True) -> None:
        if n_blocks < 2:
            raise MinferError(f"the KV cache needs at least 2 blocks (1 is reserved), got {n_blocks}; "
                              "raise --kv-memory or --ctx")
        self.n_blocks = n_blocks
        self.block_size = block_size
        self.prefix_cache = prefix_cache
        self.ref = [0] * n_blocks
        self.hash_of: list[int | None] = [None] * n_blocks
        self.tokens_of: list[tuple | None] = [None] * n_blocks
        self.by_hash: dict[int, int] = {}
        self._free: deque[int] = deque(range(1, n_blocks))   # never hashed, or evicted
        self._cached: OrderedDict[int, None] = OrderedDict()  # ref 0, content kept (LRU first)
        self.ref[0] = 1                                       # the padding block, never handed out
        self.hits = 0      # prompt tokens served from the prefix cache
        self.lookups = 0   # prompt tokens looked up

    # ---- accounting --------------------------------------------------------------------

    @property
    def n_free(self) -> int:
        """Blocks that can be handed out now (free, or cached and unused)."""
        return len(self._free) + len(self._cached)

    @property
    def n_used(self) -> int:
        return self.n_blocks - 1 - self.n_free

    @property
    def capacity_tokens(self) -> int:
        return (self.n_blocks - 1) * self.block_size

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // self.block_size)

    # ---- allocation ----------------------------------------------------------------------

    def _take(self) -> int:
        if self._free:
            b = self._free.popleft()
        elif self._cached:
            b, _ = self._cached.popitem(last=False)  # evict the least recently used
            h = self.hash_of[b]
            if h is not None and self.by_hash.get(h) == b:
                del self.by_hash[h]
            self.hash_of[b] = self.tokens_of[b] = None
        else:
            raise MinferError("no free KV block (the scheduler checks before allocating)")
        self.ref[b] = 1
        return b

    def _hold(self, b: int) -> None:
        if self.ref[b] == 0:
            self._cached.pop(b, None)
        self.ref[b] += 1

    def _release(self, b: int) -> None:
        self.ref[b] -= 1
        if self.ref[b] > 0:
            return
        if self.hash_of[b] is not None and self.by_hash.get(self.hash_of[b]) == b:
            self._cached[b] = None
        else:
            self.hash_of[b] = self.tokens_of[b] = None
            self._free.append(b)

    def match_prefix(self, seq: Sequence) -> int:
        """Attach the cached blocks of the longest cached prefix of seq's tokens to seq (which holds
        no blocks); return the number of tokens they cover (a multiple of block_size)."""
        assert not seq.block_table
        bs = self.block_size
        seq.block_hashes = []
        if not self.prefix_cache:
            return 0
        limit = (len(seq.tokens) - 1) // bs        # the last token is always recomputed
        prev = None
        for i in range(limit):
            toks = tuple(seq.tokens[i * bs:(i + 1) * bs])
            h = block_hash(prev, toks)
            b = self.by_hash.get(h)
            if b is None or self.tokens_of[b] != toks:
                break
            self._hold(b)
            seq.block_table.append(b)
            seq.block_hashes.append(h)
            prev = h
        return len(seq.block_table) * bs

    # ---- predictions (batch_engine._chain: what the next schedule() would do) ----------------

    @property
    def n_fresh(self) -> int:
        """Free blocks that hold no cached prefix: taking one evicts nothing."""
        return len(self._free)

    def releases(self, seqs) -> dict[int, int]:
        """Block -> how many of seqs hold it: what freeing them all would release."""
        drop: dict[int, int] = {}
        for s in seqs:
            for b in s.block_table:
                drop[b] = drop.get(b, 0) + 1
        return drop

    def n_released(self, drop: dict[int, int]) -> int:
        """Blocks that releasing `drop` (releases()) would make free (their last holder gone)."""
        return sum(1 for b, c in drop.items() if self.ref[b] == c)

    def evictions(self, n_take: int) -> set[int]:
        """The cached blocks that taking n_take blocks now would evict (_take: never-hashed
        blocks first, then the least recently used cached ones)."""
        n = n_take - len(self._free)
        return set(islice(self._cached, n)) if n > 0 else set()

    def prefix_cost(self, seq: Sequence, drop: dict[int, int], limit: int, gone: set[int] = frozenset()) -> int:
        """How many free blocks match_prefix(seq) would take (cached blocks no one holds) once
        `drop` is released and the blocks `gone` are evicted, counted up to `limit`; changes
        nothing. The same walk as match_prefix."""
        if not self.prefix_cache or limit <= 0:
            return 0
        bs = self.block_size
        prev = None
        n = 0
        for i in range((len(seq.tokens) - 1) // bs):
            toks = tuple(seq.tokens[i * bs:(i + 1) * bs])
            h = block_hash(prev, toks)
            b = self.by_hash.get(h)
            if b is None or b in gone or self.tokens_of[b] != toks:
                break
            if self.ref[b] == drop.get(b, 0):
                n += 1
                if n >= limit:
                    break
            prev = h
        return n

    def touch_prefix(self, seq: Sequence) -> None:
        """What a failed admission leaves behind (scheduler step 3: match_prefix, then free): seq's
        cached prefix blocks become the most recently used. A chained step that stands in for
        such a step repeats it, so later evictions (and prefix hits) stay the synchronous ones."""
        self.match_prefix(seq)
        self.free(seq)

    def can_grow(self, seq: Sequence, n_tokens: int) -> bool:
        return self.blocks_for(n_tokens) - len(seq.block_table) <= self.n_free

    def grow(self, seq: Sequence, n_tokens: int) -> None:
        """Give seq blocks for its first n_tokens positions."""
        need = self.blocks_for(n_tokens) - len(seq.block_table)
        if need > self.n_free:
            raise MinferError(f"KV cache: {need} blocks needed, {self.n_free} free")
        for _ in range(need):
            seq.block_table.append(self._take())

    def commit(self, seq: Sequence) -> None:
        """Hash seq's blocks that became full (its first n_computed tokens are in the cache)."""
        if not self.prefix_cache:
            return
        bs = self.block_size
        n_full = min(seq.n_computed // bs, len(seq.block_table))
        for i in range(len(seq.block_hashes), n_full):
            toks = tuple(seq.tokens[i * bs:(i + 1) * bs])
            h = block_hash(seq.block_hashes[-1] if seq.block_hashes else None, toks)
            seq.block_hashes.append(h)
            b = seq.block_table[i]
            if h not in self.by_hash:          # an equal block computed by another sequence wins
                self.by_hash[h] = b
                self.hash_of[b] = h
                self.tokens_of[b] = toks

    def free(self, seq: Sequence) -> None:
        """Release all of seq's blocks (finish, cancel, preemption); last blocks evicted first."""
        for b in reversed(seq.block_table):
            self._release(b)
        seq.block_table = []
        seq.block_hashes = []

    def check(self) -> None:
        """Invariants (tests): every block is exactly one of held, cached or free."""
        held = {b for b in range(1, self.n_blocks) if self.ref[b] > 0}
        free = set(self._free)
        cached = set(self._cached)
        assert not (held & free) and not (held & cached) and not (free & cached)
        assert len(held) + len(free) + len(cached) == self.n_blocks - 1
        assert len(free) == len(self._free)
