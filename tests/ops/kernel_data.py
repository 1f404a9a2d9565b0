"""Random raw ggml blocks for the kernel tests (shared by the interpreter and GPU suites).

Random bytes are valid blocks of every type once the float16 scale fields hold finite,
moderate values: the quant bits and 6-bit scales may be anything. The offsets of the f16
fields come from ggml-common.h's block structs.
"""

from __future__ import annotations

import numpy as np

# qtype -> (values per block, bytes per block, byte offsets of f16 fields)
BLOCKS = {
    2: (32, 18, (0,)),          # Q4_0: d
    3: (32, 20, (0, 2)),        # Q4_1: d, m
    6: (32, 22, (0,)),          # Q5_0: d
    7: (32, 24, (0, 2)),        # Q5_1: d, m
    8: (32, 34, (0,)),          # Q8_0: d
    10: (256, 84, (80, 82)),    # Q2_K: d, dmin
    11: (256, 110, (108,)),     # Q3_K: d
    12: (256, 144, (0, 2)),     # Q4_K: d, dmin
    13: (256, 176, (0, 2)),     # Q5_K: d, dmin
    14: (256, 210, (208,)),     # Q6_K: d
    20: (32, 18, (0,)),         # IQ4_NL: d
    23: (256, 136, (0,)),       # IQ4_XS: d (the 6-bit group scales may be anything)
    39: (32, 17, ()),           # MXFP4: its scale is the e8m0 byte 0, set below
    34: (256, 54, (52,)),       # TQ1_0: qs[48], qh[4], d (ggml-common.h block_tq1_0); base-3 bytes may be anything
    35: (256, 66, (64,)),       # TQ2_0: qs[64], d (block_tq2_0); the 2-bit code 3 decodes to 2, as ggml's
}
QUANT_NAMES = {2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
               12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 0: "F32", 1: "F16", 30: "BF16",
               20: "IQ4_NL", 23: "IQ4_XS", 39: "MXFP4", 34: "TQ1_0", 35: "TQ2_0"}


def random_weight(qtype: int, n: int, k: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """uint8 (n, row_bytes) raw blocks of a random (n, k) weight of `qtype`."""
    if qtype == 0:
        return rng.standard_normal((n, k)).astype(np.float32).view(np.uint8).reshape(n, -1)
    if qtype == 1:
        return (rng.standard_normal((n, k)) * 0.5).astype(np.float16).view(np.uint8).reshape(n, -1)
    if qtype == 30:
        f = (rng.standard_normal((n, k)) * 0.5).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, -1)
    qk, ts, f16s = BLOCKS[qtype]
    assert k % qk == 0
    nb = n * (k // qk)
    raw = rng.integers(0, 256, size=(nb, ts), dtype=np.uint8)
    for off in f16s:
        # scales of either sign and a spread of magnitudes, like real files (dmin may be negative)
        v = (rng.standard_normal(nb) * scale).astype(np.float16)
        raw[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    if qtype == 39:
        # MXFP4's scale 2^(e - 128) (ggml-common.h block_mxfp4, ggml_e8m0_to_fp32_half) times codes up
        # to 12: e near log2(scale / 4) + 128 keeps the values about `scale` (e 255 would be NaN)
        e = int(np.round(np.log2(scale / 4))) + 128
        raw[:, 0] = rng.integers(e - 2, e + 3, size=nb)
    return raw.reshape(n, -1)


def reference_dequant(raw: np.ndarray, qtype: int, n: int, k: int) -> np.ndarray:
    """float32 (n, k) by the gguf package (the independent format reference)."""
    import gguf.quants

    if qtype == 30:
        u = raw.reshape(n, k * 2).view(np.uint16).astype(np.uint32) << 16
        return u.view(np.float32).reshape(n, k)
    if qtype in (0, 1):
        return raw.view(np.float32 if qtype == 0 else np.float16).reshape(n, k).astype(np.float32)
    out = gguf.quants.dequantize(raw.reshape(n, -1), qtype)
    return np.asarray(out, dtype=np.float32).reshape(n, k)


def rel_err(out, ref) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    import torch

    o = torch.as_tensor(out).double().cpu()
    r = torch.as_tensor(ref).double().cpu()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


class ModelStub:
    """What repack_model / attach_dense_planes read of a model: its matrices, its declared groups,
    the embedding (left raw) and the float32 CPU activations."""

    def __init__(self, ws, groups=(), token_embd=None):
        self.ws, self.groups, self.token_embd, self.output = ws, groups, token_embd, None
        import torch

        self.act_dtype, self.device = torch.float32, torch.device("cpu")

    def qweights(self):
        return self.ws

    def linear_groups(self):
        return self.groups


def qweights_with_reference(specs, seed: int) -> list:
    """[(QWeight of random blocks, its gguf-dequantized float64 values)] for (name, qtype, n, k) specs."""
    import torch

    from minfer.weights import QWeight

    rng = np.random.default_rng(seed)
    out = []
    for name, qt, n, k in specs:
        raw = random_weight(qt, n, k, rng)
        out.append((QWeight(name, qt, (n, k), torch.from_numpy(raw)),
                    torch.from_numpy(reference_dequant(raw, qt, n, k)).double()))
    return out


def interpreted_modules(names: list[str]):
    """Generator for a module-scoped fixture: the kernel modules `names` (re)loaded with
    TRITON_INTERPRET=1, yielded as {short name: module}; afterwards the variable is restored
    and the modules reloaded as they were."""
    import importlib
    import os
    import sys

    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    mods = {}
    for name in names:
        mods[name.rsplit(".", 1)[-1]] = importlib.reload(sys.modules[name]) if name in sys.modules \
            else importlib.import_module(name)
    yield mods
    if old is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = old
    for name in names:
        importlib.reload(sys.modules[name])


# ops/cuda/gemv_q8_gluon.py _gemv_q8g_kernel's runtime arguments after its eight plane pointers, as Triton's
# compile signature types, for the CPU builds of tests/ops/test_gemv_q8_gluon_configs_cpu.py,
# test_gemv_q8g_rule_build_cpu.py and test_l2_heads_cpu.py (each passes it to its build script)
GEMV_Q8G_TAIL = (["*i32", "*fp32", "*bf16", "*fp32", "*fp32", "*fp32", "*i32"] + ["i32"] * 6
                 + ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32",
                    "*fp32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"])


# ops/cuda/attention.py _decode_attn_kernel's runtime arguments as Triton's compile signature
# (name, type), for the CPU builds of tests/ops/test_pdl_preload_cpu.py and
# test_decode_attn_pipeline_cpu.py (bf16 q and caches, float32 partials)
DECODE_ATTN_SIG = list(zip(
    ["q", "kc", "vc", "n_keys", "part_o", "part_m", "part_l", "out", "xq", "xf", "bar", "stride_qh", "stride_ks",
     "stride_kh", "stride_vs", "stride_vh", "H", "G", "sm_scale", "window", "n_keys_add", "softcap"],
    ["*bf16", "*bf16", "*bf16", "*i64", "*fp32", "*fp32", "*fp32", "*bf16", "*i32", "*fp32", "*i32"] + ["i32"] * 7
    + ["fp32", "i32", "i32", "fp32"]))


def sm90_builds(code: str, arg, timeout: int = 600):
    """Run a build script (`code`, given json.dumps(arg) as argv[1]) in a fresh interpreter without
    TRITON_INTERPRET -- tests/conftest.py sets it on a machine without a GPU, and Triton's sm_90
    compiler (Gluon's refuses the interpreter's wrapped helpers) must not see it -- and return the
    JSON the script prints last (the CPU build tests: test_*_cpu.py)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", code, json.dumps(arg)], capture_output=True, text=True, env=env,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])



# the CUDA backend's modules a dense model's forward runs through, for interpreted_modules (tests that
# route a model or linear_many to the interpreted backend)
DENSE_MODS = ["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
              "minfer.ops.cuda.norm_rope_act", "minfer.ops.cuda.embedding", "minfer.ops.cuda.attention",
              "minfer.ops.cuda"]


def route_to_cuda(monkeypatch, C):
    """minfer.ops dispatches CPU tensors to the reference; send them to the CUDA backend C (the
    interpreted minfer.ops.cuda of `interpreted_modules`), keyword arguments passed through."""
    import minfer.ops as O

    monkeypatch.setattr(O, "_backend", lambda x: C)
    monkeypatch.setattr(O, "linear", lambda x, w, bias=None, ctx=None, out_dtype=None: C.linear(x, w, bias, ctx, out_dtype))
    monkeypatch.setattr(O, "linear_many", lambda x, ws, b, ctx=None: C.linear_many(x, ws, b, ctx))
    monkeypatch.setattr(O, "add_rms_norm", lambda x, y, w, e, d, ctx=None, **kw: C.add_rms_norm(x, y, w, e, d, ctx, **kw))
    monkeypatch.setattr(O, "linear_add_rms_norm", lambda a, w, x, g, e, d, ctx=None, **kw:
                        C.linear_add_rms_norm(a, w, x, g, e, d, ctx, **kw))
    monkeypatch.setattr(O, "attention", lambda q, k, v, s, ctx=None, **kw: C.attention(q, k, v, s, ctx, **kw))
    monkeypatch.setattr(O, "moe_ffn", lambda h, *a, **kw: C.moe_ffn(h, *a, **kw))
    monkeypatch.setattr(O, "rope_attention", lambda *a, **kw: C.rope_attention(*a, **kw))


def interpreted_loads(monkeypatch, fn) -> int:
    """How many loads (tl.load calls: masked or not, whole tiles) Triton's interpreter issues while
    fn() runs: a kernel that skips tiles issues fewer (the window / chunk tests)."""
    from triton.runtime import interpreter

    b = interpreter.interpreter_builder
    real, calls = b.create_masked_load, [0]

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(b, "create_masked_load", counted)
    try:
        fn()
    finally:
        monkeypatch.setattr(b, "create_masked_load", real)
    return calls[0]


# ops that move no data (views, allocations): left out of an OpCounter's count
VIEW_OPS = frozenset({"view", "_unsafe_view", "reshape", "split", "split_with_sizes", "unsqueeze", "squeeze", "t",
                      "transpose", "select", "slice", "expand", "alias", "as_strided", "detach", "empty", "new_empty",
                      "empty_like"})


def op_counter():
    """A torch dispatch mode counting the compute ops run under it by name (`.c`, a Counter; VIEW_OPS left
    out), and its `quiet(f, name)`: f wrapped so that its own ops are not counted and each call counts once as
    `name` (a kernel launch, a GEMV) -- the recurrent step tests' "what runs between the projections"."""
    from collections import Counter

    from torch.utils._python_dispatch import TorchDispatchMode

    class OpCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.on, self.c = True, Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if self.on and func.overloadpacket.__name__ not in VIEW_OPS:
                self.c[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

        def quiet(self, f, name=None):
            def g(*a, **k):
                self.on = False
                try:
                    return f(*a, **k)
                finally:
                    self.on = True
                    if name:
                        self.c[name] += 1
            return g

    return OpCounter()
