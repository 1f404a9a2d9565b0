"""Switches.decode_attn_merge in Triton's interpreter: the one-token decode attention with its key
splits merged by the last program of each KV head (attention_merge.merge_tail) against the same
kernel followed by the combine launch, and both against the torch reference. The merge sums the
splits in rounds of CH with a running max, the combine all at once, so the outputs agree to
float32 rounding (1e-5 relative), not bit for bit; the int8 form is the same but for a value on a
rounding edge (one quant step). Plus: the tickets are zero after a call (a CUDA graph replays
them), two calls agree bit for bit, the routing counts the path (and the rope-fused kernel's
fallback), and the sm_90 build (no GPU needed) has one ticket atomic and no spills.

The interpreter computes tl.dot on bf16 wrongly: these run float32 (paged_attention's rule)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules, rel_err  # noqa: E402

from minfer.ops import reference  # noqa: E402
from minfer.ops.cuda.q8_rows import dequantize_q8  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning",
                                        "ignore:overflow encountered:RuntimeWarning",
                                        "ignore:invalid value encountered:RuntimeWarning")


@pytest.fixture(scope="module")
def M():
    for mods in interpreted_modules(["minfer.ops.cuda.gemv_repack", "minfer.ops.cuda.q8_rows",
                                     "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.attention_merge",
                                     "minfer.ops.cuda.attention"]):
        yield mods


def _inputs(h, hkv, dh, s, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, dh, generator=g)
    kc, vc = torch.randn(s, hkv, dh, generator=g), torch.randn(s, hkv, dh, generator=g)
    return q, kc, vc


def _both(A, q, kc, vc, n_keys, **kw):
    """(merged in the kernel, merged by the combine launch) of one input; n_keys as a graph
    passes it (the position tensor, plus 1 in the kernel)."""
    pos = torch.tensor([n_keys - 1], dtype=torch.int64)
    a = A.decode_attention(q, kc, vc, pos, n_keys_add=1, merge=True, **kw)
    b = A.decode_attention(q, kc, vc, pos, n_keys_add=1, merge=False, **kw)
    return a, b


def _q8_close(a, b, k: int):
    """The int8 forms of two nearly equal rows: scales within float32 rounding, each quantized
    value equal unless the combine's value sits within 1e-3 of a rounding edge (then one step)."""
    (qa, fa), (qb, fb) = a.q8, b.q8
    da, db = fa.view(-1, 4)[:, 0].double(), fb.view(-1, 4)[:, 0].double()
    assert torch.allclose(da, db, rtol=1e-5, atol=0)
    va = qa.view(torch.int8).view(-1, 8, 4).permute(0, 2, 1).reshape(-1, 32).int()   # [chunk, value]
    vb = qb.view(torch.int8).view(-1, 8, 4).permute(0, 2, 1).reshape(-1, 32).int()
    t = b.reshape(-1, 32).double() / db[:, None]                     # the combine's value in quant steps
    edge = (t.abs() - t.abs().floor() - 0.5).abs() < 1e-3
    assert torch.equal(va[~edge], vb[~edge])
    assert (va - vb).abs().max() <= 1
    assert (dequantize_q8(a.q8, k) - dequantize_q8(b.q8, k)).abs().max() <= float(db.max()) * 1.0001


CASES = {   # name: (H, Hkv, Dh, cache rows, n_keys, window, extra kwargs)
    "7b_d1": (28, 4, 128, 800, 1, 0, {}),
    "7b_d16": (28, 4, 128, 800, 16, 0, {}),
    "7b_d700": (28, 4, 128, 800, 700, 0, {}),              # 22 live splits of 25: two merge rounds
    "7b_d700_window": (28, 4, 128, 800, 700, 100, {}),     # the live splits start past split 0
    "7b_d700_kvpre": (28, 4, 128, 800, 700, 0, {"kvpre": True}),
    "small_d37": (8, 2, 64, 50, 37, 0, {}),
    "small_d37_splits3": (8, 2, 64, 50, 37, 0, {"n_split": 3}),
    "small_window": (8, 2, 64, 50, 45, 7, {"n_split": 5}),
    "small_softcap": (8, 2, 64, 50, 30, 0, {"softcap": 5.0}),
    "one_split": (8, 2, 64, 50, 20, 0, {"n_split": 1}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_merge_matches_the_combine(M, name):
    A = M["attention"]
    h, hkv, dh, s, n_keys, window, kw = CASES[name]
    q, kc, vc = _inputs(h, hkv, dh, s, seed=len(name) * 31 + n_keys)
    a, b = _both(A, q, kc, vc, n_keys, window=window, q8=True, **kw)
    ref = reference.decode_attention(q, kc, vc, n_keys, window, kw.get("softcap", 0.0))
    assert rel_err(b, ref) < 1e-5
    assert rel_err(a, ref) < 1e-5
    assert rel_err(a, b) < 1e-5
    _q8_close(a, b, h * dh)


def test_a_head_without_the_int8_form(M):
    """Dh 48 (padded to 64 in the kernel, no whole 32-value chunks): the merge writes the first
    48 values of each head and, as the combine, no int8 form."""
    A = M["attention"]
    q, kc, vc = _inputs(6, 3, 48, 40, seed=5)
    a, b = _both(A, q, kc, vc, 33, q8=True)
    assert getattr(a, "q8", None) is None and getattr(b, "q8", None) is None
    assert rel_err(a, reference.decode_attention(q, kc, vc, 33)) < 1e-5
    assert rel_err(a, b) < 1e-5


def test_tickets_reset_and_calls_repeat(M):
    """After each call every ticket is back to 0 (a graph replays the same counters: a ticket
    left behind would keep the next launch's last program from merging, and its output would be
    the empty buffer); two calls give the same bits."""
    A, AM = M["attention"], M["attention_merge"]
    q, kc, vc = _inputs(28, 4, 128, 800, seed=3)
    pos = torch.tensor([650], dtype=torch.int64)
    outs = []
    for _ in range(2):
        outs.append(A.decode_attention(q, kc, vc, pos, n_keys_add=1, q8=True, merge=True))
        assert not AM.counters(q.device, 4).any()
    assert torch.equal(outs[0], outs[1])
    assert all(torch.equal(x, y) for x, y in zip(outs[0].q8, outs[1].q8))
    assert rel_err(outs[0], reference.decode_attention(q, kc, vc, 651)) < 1e-5


def test_routing_counts_the_merge_and_the_rope_fallback(M):
    """ops' entry with decode_attn_merge: attention() takes the merging kernel
    (attention.decode.merge); the rope-fused kernel has no MERGE, keeps the combine and says so
    (a fallback of attention.decode.merge), and its result is still right."""
    from minfer.config import RopeConfig
    from minfer.ops import paths
    from minfer.ops.context import Context
    from minfer.switches import Switches

    A, N = M["attention"], M["norm_rope_act"]
    H, Hkv, Dh, S = 8, 2, 64, 40
    q, kc, vc = _inputs(H, Hkv, Dh, S, seed=11)
    on = Context(Switches(decode_attn_merge=True), None)
    paths.reset()
    out = A.attention(q, kc, vc, torch.tensor([29]), on)
    snap = paths.snapshot()
    assert snap["counts"].get("attention.decode.merge") == 1 and not snap["fallbacks"], snap
    assert rel_err(out, reference.decode_attention(q, kc, vc, 30)) < 1e-5

    cfg = RopeConfig(theta=1e4, style="neox", n_rot=Dh)
    k, v = torch.randn(1, Hkv, Dh), torch.randn(1, Hkv, Dh)
    p = torch.tensor([29])
    kc0, vc0 = kc.clone(), vc.clone()
    paths.reset()
    out = A.rope_attention(q, k, v, p, cfg, kc, vc, Context(Switches(decode_attn_merge=True, decode_attn_rope=True),
                                                            None))
    snap = paths.snapshot()
    assert "attention.decode.merge" not in snap["counts"], snap
    assert [n for f, n in snap["fallbacks"].items() if f.startswith("attention.decode.merge ")] == [1], snap
    kc0[29], vc0[29] = reference.rope(k, p, cfg)[0], v[0]
    assert rel_err(out, reference.attention(reference.rope(q, p, cfg), kc0, vc0, 29)) < 1e-5


_COMPILE = r"""
import importlib, json, os, subprocess, tempfile
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
A = importlib.import_module("minfer.ops.cuda.attention")   # (the package exports a function of that name)
AM = importlib.import_module("minfer.ops.cuda.attention_merge")

names = ["q", "kc", "vc", "n_keys", "part_o", "part_m", "part_l", "stride_qh", "stride_ks", "stride_kh",
         "stride_vs", "stride_vh", "H", "G", "sm_scale", "window", "n_keys_add", "softcap", "out", "xq", "xf", "cnt"]
types = ["*bf16", "*bf16", "*bf16", "*i64", "*fp32", "*fp32", "*fp32"] + ["i32"] * 7 + ["fp32", "i32", "i32",
         "fp32", "*bf16", "*i32", "*fp32", "*i32"]
aligned = {(i,): [["tt.divisibility", 16]] for i in list(range(12)) + [18, 19, 20, 21]}   # as the launcher sees them
tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
out = {}
for merge in (False, True):
    # the 7B's heads (28 / 4 x 128) at a 4096-row cache: 32 splits
    cex = dict(D=128, BD=128, GP=16, BS=64, IEEE=False, PDL=1, CAP=False, PRE=True, KVPRE=False, MERGE=merge,
               Q8=merge) | (AM.merge_meta(7, 32, 128) if merge else {})
    sig = dict(zip(names, types)) | {c: "constexpr" for c in cex}
    k = triton.compile(ASTSource(A._decode_attn_kernel, sig, cex, aligned), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    usage = ""
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
            f.write(k.asm["cubin"])
        usage = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
        os.unlink(f.name)
    out[str(int(merge))] = {"ptx": k.asm["ptx"], "usage": usage, "CH": cex.get("CH")}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_sm90_build_one_ticket_no_spills(builds):
    """The MERGE build: one ticket (atom add, acq_rel, gpu scope) and one reset (atom exch) per
    program; the partials read through L2 (ld.global.cg), the acc rows 128 bits a load; 16
    splits a round; no spills (cuobjdump's STACK and LOCAL 0, registers within sm_90's 255).
    The plain build has no atomics and no .cg loads."""
    plain, merged = builds["0"]["ptx"], builds["1"]["ptx"]
    assert len(re.findall(r"atom\.global\.gpu\.acq_rel\.add", merged)) == 1
    assert len(re.findall(r"\batom\.[\w.]*add", merged)) == 1
    assert len(re.findall(r"\batom\.[\w.]*exch", merged)) == 1
    assert "atom." not in plain and "ld.global.cg" not in plain
    assert merged.count("ld.global.cg.v4") >= 16
    assert builds["1"]["CH"] == 16
    for b in ("0", "1"):
        usage = builds[b]["usage"]
        if not usage:
            pytest.skip("no cuobjdump in this Triton install: register use not read")
        m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:\d+ LOCAL:(\d+)", usage)
        assert m, usage
        regs, stack, local = map(int, m.groups())
        assert regs <= 255 and stack == 0 and local == 0, (b, usage)
