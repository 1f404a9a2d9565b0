"""The residual add + RMSNorm made by a one-row GEMV's last program (Switches.gemv_raw_resnorm for the raw-block
GEMV, gemv.py; Switches.gemv_q8_resnorm for the Triton q8 GEMV, gemv_q8.py): each program that has stored its
rows takes an acq_rel ticket, and the one that takes the last ticket adds the residual to the whole stored row and
norms it, then resets the ticket for the next launch (CUDA graph replays)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def resnorm_tail(nx, out, ng, s_out, h_rn, eps, N, cnt, target, BD: tl.constexpr):
    """After this program's stores of `out` (N values, the GEMV's output in its dtype): the program taking the
    target-th ticket on cnt makes s_out = nx + out (float32) and h_rn = rms_norm(s_out) * ng in one BD-wide block
    (BD >= N, a power of two) -- norm_rope_act._add_rms_norm_kernel's operations, in its order -- and resets cnt.
    A CTA barrier, then one acq_rel ticket per program, orders every program's stores before the last one's
    loads (the split-K ticket of gemv_repack.py); its loads of out bypass L1 (.cg)."""
    tl.debug_barrier()
    ticket = tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
    if ticket == target - 1:
        d = tl.arange(0, BD)
        dm = d < N
        v = tl.load(nx + d, mask=dm, other=0.0).to(tl.float32) \
            + tl.load(out + d, mask=dm, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(s_out + d, v, mask=dm)
        r = 1.0 / tl.sqrt(tl.sum(v * v, axis=0) / N + eps)
        g = tl.load(ng + d, mask=dm, other=0.0).to(tl.float32)
        tl.store(h_rn + d, (v * r * g).to(h_rn.dtype.element_ty), mask=dm)
        tl.atomic_xchg(cnt, 0)                        # ready for the next launch (graph replays)
