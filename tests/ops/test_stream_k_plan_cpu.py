"""The stream-K deal of gemv_q8_gluon_sk._gemv_q8g_sk_kernel, its integer formulas evaluated in
Python (the kernel's own expressions, copied from its body): every step of every tile goes to
exactly one program, runs differ by at most one step, a program's partial slot p + t is unique,
and tile t's contributors pf..pl (from the step-to-program formula) are exactly the programs
whose runs touch it, in K order. The kernel's numbers on the GPU: tests/gpu/test_gemv_q8_stream_k_gpu.py."""

from __future__ import annotations

import pytest


def deal(tiles: int, s: int, p_count: int):
    u = tiles * s
    runs, slots, contrib = [], set(), {}
    for pid in range(p_count):
        u0 = pid * u // p_count
        u1 = (pid + 1) * u // p_count
        runs.append(u1 - u0)
        for t in range(u0 // s, (u1 - 1) // s + 1):
            lo = max(u0, t * s) - t * s
            hi = min(u1, t * s + s) - t * s
            pf = ((t * s + 1) * p_count - 1) // u
            pl = ((t * s + s) * p_count - 1) // u
            assert 0 <= lo < hi <= s
            assert pid + t not in slots
            slots.add(pid + t)
            contrib.setdefault(t, []).append((pid, lo, hi, pf, pl))
    return runs, slots, contrib


@pytest.mark.parametrize("tiles,s,p_count", [(112, 37, 528), (112, 37, 660), (224, 37, 1056), (17, 3, 7),
                                             (33, 10, 1), (3, 10, 30), (25, 7, 13), (2, 37, 74), (5, 4, 19)])
def test_deal(tiles, s, p_count):
    runs, slots, contrib = deal(tiles, s, p_count)
    assert max(runs) - min(runs) <= 1 and min(runs) >= 1
    assert sorted(contrib) == list(range(tiles))
    for t, parts in contrib.items():
        steps = sorted((lo, hi) for _, lo, hi, _, _ in parts)
        assert steps[0][0] == 0 and steps[-1][1] == s
        assert all(a[1] == b[0] for a, b in zip(steps, steps[1:]))            # contiguous, no overlap
        pids = [pid for pid, *_ in parts]
        pf, pl = parts[0][3], parts[0][4]
        assert all((q[3], q[4]) == (pf, pl) for q in parts)                    # every contributor agrees
        assert pids == list(range(pf, pl + 1))                                 # pf..pl, in K order
    assert max(slots) < p_count + tiles
