"""The L2 prefetch plan of the one-row decode (minfer.ops.cuda.l2_prefetch.L2Plan): which bytes of
later weights each q8 GEMV launch fetches into L2. Checked on CPU tensors standing for the planes
(only their addresses and sizes matter): the learned cycle, the claims (no byte twice, the
budget, whole rows of every plane, stop at the first large weight) and the 16-byte alignment the
bulk prefetch instruction needs."""

from __future__ import annotations

import torch

from minfer.ops.cuda.gemv_repack_layout import Q4_K, Q6_K, Repacked
from minfer.ops.cuda.l2_prefetch import MAX_REGIONS, L2Plan, region_args


def planes(qtype, n, k):
    nb = k // 256
    if qtype == Q4_K:
        shapes = [((n, nb * 32), torch.int32), ((n, nb * 8), torch.int16), ((n, nb * 2), torch.float16)]
    else:
        shapes = [((n, nb * 32), torch.int32), ((n, nb * 32), torch.int16), ((n, nb * 16), torch.int8),
                  ((n, nb), torch.float16)]
    return Repacked(qtype, n, k, tuple(torch.zeros(s, dtype=d) for s, d in shapes))


def layer(d=1024, f=4096, q6_v=False):
    qk = planes(Q4_K, d + 256, d)
    qkv = (qk, planes(Q6_K, 256, d)) if q6_v else (planes(Q4_K, d + 512, d),)
    return [qkv, (planes(Q4_K, d, d),), (planes(Q4_K, 2 * f, d),), (planes(Q6_K, d, f),)]


def spans(regs):
    return [(a, a + n) for a, n in regs]


def owner(addr, segs_list):
    """(launch, segment, plane) whose bytes hold addr."""
    for i, segs in enumerate(segs_list):
        for s, rw in enumerate(segs):
            for p, t in enumerate(rw.planes):
                lo = t.data_ptr()
                if lo <= addr < lo + t.numel() * t.element_size():
                    return i, s, p
    return None


def learned(launches, reps=2):
    plan = L2Plan()
    pos = [plan.note(segs) for _ in range(reps) for segs in launches]
    return plan, pos


def test_cycle_learned_when_a_launch_comes_back():
    launches = layer() + layer()
    plan, pos = learned(launches)
    n = len(launches)
    assert pos[:n] == [None] * n                     # the first step only learns
    assert pos[n:] == list(range(n))
    # a stray launch before the cycle (a prefill's one-row head) is not part of it
    plan = L2Plan()
    stray = (planes(Q4_K, 256, 1024),)
    assert plan.note(stray) is None
    got = [plan.note(s) for _ in range(2) for s in launches]
    assert got[n:] == list(range(n)) and plan.note(stray) is None


def total(regs):
    return sum(n for _, n in regs)


def test_small_launches_claim_the_next_weights_up_to_the_budget():
    launches = layer() + layer()
    plan, _ = learned(launches)
    small = 2 << 20
    o_bytes = launches[1][0].nbytes()
    budget = o_bytes + (1 << 20)
    r_qkv = plan.regions(0, budget, small, False)
    r_o = plan.regions(1, budget, small, False)
    # q/k/v: o whole, then gate+up's head (whole rows of its three planes), within the budget
    owners = [owner(a, launches) for a, _ in r_qkv]
    assert {o[0] for o in owners} == {1, 2}
    assert sum(n for (a, n), o in zip(r_qkv, owners) if o[0] == 1) == o_bytes
    gu_row = 1024 // 256 * 148                       # bytes of one gate+up row over its three planes
    assert budget - gu_row < total(r_qkv) <= budget
    # o: more of gate+up, starting where q/k/v's claim ended (no byte twice)
    assert {owner(a, launches)[0] for a, _ in r_o} == {2}
    got = sorted(spans(r_qkv) + spans(r_o))
    assert all(b0 >= a1 for (_, a1), (b0, _) in zip(got, got[1:]))
    # the large launches prefetch nothing without big_next
    assert plan.regions(2, budget, small, False) == [] and plan.regions(3, budget, small, False) == []


def test_big_next_claims_the_next_small_weight_whole():
    launches = layer() + layer(q6_v=True)
    plan, _ = learned(launches)
    small = 2 << 20
    r = plan.regions(3, 0, small, True)               # down of layer 0 -> layer 1's q/k + Q6_K v
    assert {owner(a, launches)[0] for a, _ in r} == {4}
    assert total(r) == sum(rw.nbytes() for rw in launches[4])
    r = plan.regions(7, 0, small, True)               # the last down wraps to the first q/k/v
    assert {owner(a, launches)[0] for a, _ in r} == {0}
    assert plan.regions(0, 0, small, True) == []      # small launches: budget 0, nothing


def test_regions_are_aligned_inside_their_planes_and_capped():
    launches = layer(d=768, f=2304) + layer(d=768, f=2304, q6_v=True)   # row bytes of 3 blocks (dm: 12 B)
    plan, _ = learned(launches)
    for big_next in (False, True):
        for budget in (1000, 300_000, 5 << 20):
            for i in range(len(launches)):
                regs = plan.regions(i, budget, 1 << 20, big_next)
                assert len(regs) <= MAX_REGIONS
                for a, n in regs:
                    assert a % 16 == 0 and n % 16 == 0 and n > 0
                    o1, o2 = owner(a, launches), owner(a + n - 1, launches)
                    assert o1 is not None and o1 == o2        # inside one plane
    flat, npf = region_args([(16, 32), (48, 64)])
    assert npf == 2 and len(flat) == 2 * MAX_REGIONS and flat[:4] == (16, 32, 48, 64) and flat[4:] == (0,) * 12


def test_heads_of_a_tile_major_next_launch_cover_its_first_blocks_of_every_tile():
    """L2Plan.head_ranges (Switches.l2_heads): only the launch before a tile-major weight of >= 4x its
    bytes (o before gate+up) gets ranges, and each range -- read through the bytes to_tiles actually
    moved -- holds exactly the first h K blocks of every row of one tile, in every plane."""
    from minfer.ops.cuda.gemv_repack_layout import to_tiles

    d, f, t, h = 512, 1024, 32, 2
    nb = d // 256
    gu = planes(Q4_K, 2 * f, d)
    # the quants plane's per-block entries hold their row * 1000 + block, so the tiled bytes can be traced back
    tag = (torch.arange(2 * f).view(-1, 1, 1) * 1000 + torch.arange(nb).view(1, -1, 1)).expand(-1, -1, 32)
    tg = to_tiles(Repacked(Q4_K, 2 * f, d, (tag.reshape(2 * f, nb * 32).to(torch.int32).contiguous(),) + gu.planes[1:]), t)
    launches = [(planes(Q4_K, d + 512, d),), (planes(Q4_K, d, d),), (tg,), (planes(Q6_K, d, f),)]
    plan, _ = learned(launches)
    assert plan.head_ranges(0, h) is None                        # q/k/v: o is smaller
    assert plan.head_ranges(2, h) is None and plan.head_ranges(3, h) is None
    r = plan.head_ranges(1, h)
    assert r is not None and r[0] == 2 * f // t and len(r) == 4
    p0 = tg.planes[0]
    addr, run, head = r[1]
    assert addr == p0.data_ptr() and run == t * nb * 128 and head == t * h * 128
    flat = p0.reshape(-1)                                          # int32 entries, row * 1000 + block
    for tile in (0, 5, r[0] - 1):
        lo = (tile * run) // 4
        got = flat[lo:lo + head // 4].view(-1, 32)                  # one row's block: 32 int32 words
        assert (got == got[:, :1]).all()
        keys = sorted(set(got[:, 0].tolist()))
        want = sorted(row * 1000 + b for row in range(tile * t, tile * t + t) for b in range(h))
        assert keys == want, (tile, keys[:4], want[:4])
        after = flat[lo + head // 4:lo + run // 4].view(-1, 32)[:, 0]
        assert all(v % 1000 >= h for v in after.tolist())
    # the scale planes' ranges: the same tiles' first h blocks, at 16 and 4 bytes a row and block
    assert [x[1:] for x in r[2:]] == [(t * nb * 16, t * h * 16), (t * nb * 4, t * h * 4)]
    planes_, args = plan.heads(1, h)
    assert planes_ == 3 and args == tuple([r[0]] + [v for pl in r[1:] for v in pl] + [0, 0, 0])
    assert plan.heads(0, h) is None and plan.heads(None, h) is None
    # row-major next weight: nothing
    launches[2] = (planes(Q4_K, 2 * f, d),)
    plan, _ = learned(launches)
    assert plan.head_ranges(1, h) is None
