"""The decode attention's key/value loop is pipelined through shared memory as it is launched (no
GPU): built for sm_90 with the divisibility hints a launch gives (Triton marks pointer and integer
arguments that are multiples of 16; the caches' pointers and strides are), the split build (4
warps) and the one-split build of the short graph (8 warps) load their tiles with cp.async.
perf-log Z8: a build without those hints shows no cp.async, which once read as "unpipelined"
and led to a lookahead (Switches.decode_attn_ahead) that only turned this pipeline off; this
test pins what the kernel as launched does, so a change that loses the pipeline shows here.
llama4's CHUNK variant (key ranges from the row's chunk start) is built the same ways: still
pipelined, PIPE's copies still before the wait, no spill.
Built in a fresh interpreter without TRITON_INTERPRET (tests/conftest.py sets it on a machine
without a GPU)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import DECODE_ATTN_SIG, sm90_builds  # noqa: E402

_COMPILE = r"""
import importlib, json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
A = importlib.import_module("minfer.ops.cuda.attention")   # (the package exports a function of that name)

T = GPUTarget("cuda", 90, 32)
import sys
names, types = zip(*json.loads(sys.argv[1]))
# what a 7B launch specializes: every buffer and the strides (128, 512) multiples of 16; not the
# key count's pointer (a view 8 bytes into the graph's input), not H = 28, G = 7
hints = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)}
out = {}
for name, direct, gm, warps, vs, pipe in (("split", False, False, 4, 1, False), ("one_split", True, False, 8, 1, False),
                                          ("grid_merge", False, True, 4, 1, False),
                                          ("one_split_v4", True, False, 4, 4, False),
                                          ("split_v2", False, False, 4, 2, False), ("split_pipe", False, False, 4, 1, True),
                                          ("one_split_v4_pipe", True, False, 4, 4, True),
                                          # llama4's chunked layers (CHUNK: the range from the row's chunk start)
                                          ("chunk_split", False, False, 4, 1, False),
                                          ("chunk_one_split_v4", True, False, 4, 4, False),
                                          ("chunk_one_split_v4_pipe", True, False, 4, 4, True)):
    cex = dict(D=128, BD=128, GP=16, BS=64, IEEE=False, PDL=1, CAP=False, PRE=True, KVPRE=False,
               DIRECT=direct, Q8=direct or gm, GM=gm, NSP=32, VS=vs, PIPE=pipe, CHUNK=name.startswith("chunk"))
    sig = dict(zip(names, types)) | ({"chunk": "i32"} if cex["CHUNK"] else {}) | {c: "constexpr" for c in cex}
    k = triton.compile(ASTSource(A._decode_attn_kernel, sig, cex, hints), target=T, options={"num_warps": warps})
    out[name] = {"ptx": k.asm["ptx"], "shared": k.metadata.shared, "regs": k.n_regs if hasattr(k, "n_regs") else None}
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def builds():
    return sm90_builds(_COMPILE, DECODE_ATTN_SIG)


@pytest.mark.parametrize("name", ["split", "one_split", "grid_merge", "one_split_v4", "split_v2", "split_pipe",
                                  "one_split_v4_pipe", "chunk_split", "chunk_one_split_v4",
                                  "chunk_one_split_v4_pipe"])
def test_the_key_value_tiles_are_loaded_with_cp_async(builds, name):
    ptx, shared = builds[name]["ptx"], builds[name]["shared"]
    assert ptx.count("cp.async.cg.shared.global") >= 4        # a 64 x 128 bf16 K tile: >= 4 16-byte copies a thread
    assert ptx.count("cp.async.wait_group") >= 1
    # more than one stage of the tiles in shared memory (K 16 KB + V 16 KB, or 4 KB of a V slice):
    # the next tile's copies are in flight during this tile's math
    v = 64 * 128 * 2 // {"_v4": 4, "_v2": 2}.get(name.removesuffix("_pipe")[-3:], 1)
    assert shared > 2 * (64 * 128 * 2 + v)


@pytest.mark.parametrize("name", ["split_pipe", "one_split_v4_pipe", "chunk_one_split_v4_pipe"])
def test_pipe_issues_the_first_tiles_before_the_wait_and_reads_q_after_it(builds, name):
    """Switches.decode_attn_pipe: the pipelined loop's prologue copies (the first tiles' cached rows:
    K and V, >= 4 16-byte copies a thread) come before the first griddepcontrol.wait, and the only
    global load before it is the key count's (8 bytes): q and this step's key and value row,
    written by the rope + KV kernel just before, are read after the wait. Without PIPE no copy
    precedes the wait."""
    lines = builds[name]["ptx"].split("\n")
    waits = [i for i, ln in enumerate(lines) if "griddepcontrol.wait" in ln]
    assert waits
    before = lines[:waits[0]]
    assert sum("cp.async.cg.shared.global" in ln for ln in before) >= 4
    loads = [ln for ln in before if "ld.global" in ln]
    assert len(loads) == 1 and "ld.global.b64" in loads[0], loads
    plain = builds[name.removesuffix("_pipe")]["ptx"].split("\n")
    w0 = next(i for i, ln in enumerate(plain) if "griddepcontrol.wait" in ln)
    assert not any("cp.async" in ln for ln in plain[:w0])


@pytest.mark.parametrize("name", ["chunk_split", "chunk_one_split_v4", "chunk_one_split_v4_pipe"])
def test_chunk_builds_do_not_spill(builds, name):
    """llama4's CHUNK variant (the row's chunk start from the key count, the splits over [start, L)):
    built as launched, no local-memory spill (st.local) where the plain builds have none."""
    plain = name.removeprefix("chunk_")
    assert "st.local" not in builds[plain]["ptx"]
    assert "st.local" not in builds[name]["ptx"]
