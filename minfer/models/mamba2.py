"""The Mamba-2 mixer of a hybrid model's recurrent layers (granitehybrid: IBM Granite 4.0 H; nemotron_h;
falcon-h1).

    [z; xBC; dt] = W_in h                              ssm_in (2*di + 2*G*N + H, D)
    xBC_p = silu(b + sum_k w[k] * xBC_{p-K+1+k})       ssm_conv1d.weight (conv_dim, K), .bias (conv_dim,);
                                                       xBC_j = 0 for j < 0 (a causal depthwise conv)
    [x; B; C] = xBC_p                                  x (H, P), B and C (G, N): head h reads group h // (H/G)
    dt_p = softplus(dt_p + dt_bias)                    ssm_dt.bias (H,)
    S_p = exp(dt_p * A) S_{p-1} + dt_p x_p B_p^T       per head: S (P, N); A = ssm_a (H,) < 0; S_{-1} = 0
    y_p = S_p C_p + D x_p                              ssm_d (H,)
    out = W_out (w * grouped_rmsnorm(y * silu(z)))     ssm_norm (G, di/G): RMS over each group of di/G
                                                       channels; ssm_out (D, di)

with di = ssm.inner_size, N = ssm.state_size, H = ssm.time_step_rank (the number of heads), P = di / H,
G = ssm.group_count, K = ssm.conv_kernel, conv_dim = di + 2*G*N. Each rule and its source:
- The projection's order z, xBC, dt and xBC's order x, B, C: llama.cpp src/models/mamba-base.cpp
  build_mamba2_layer (its views of zxBCdt and xBC); HF modeling_granitemoehybrid
  GraniteMoeHybridMambaLayer.forward (projected_states.split([di, conv_dim, H]), then [di, G*N, G*N]).
- The conv: ggml_ssm_conv over [the K-1 previous rows; this step's rows], a cross-correlation with tap
  K-1 on the current position (ggml/src/ggml-cpu/ops.cpp ssm_conv_f32: sumf += s[i0 + i1*ncs] * c[i0 +
  i1*nc]), then the bias and SiLU (build_mamba2_layer; HF nn.Conv1d(groups=conv_dim, padding=K-1) cut
  to the sequence, then the activation). The converter squeezes HF's (conv_dim, 1, K) to (conv_dim, K).
- The scan: ggml ssm_scan_f32 (ops.cpp): dt_soft_plus = softplus(dt) (threshold 20, as torch's),
  dA = exp(dt_soft_plus * A[h]), g = h / (nh / ng), state = s0 * dA + B[g] * x * dt_soft_plus,
  y = sum(state * C[g]); HF mamba2_selective_state_update / mamba2_chunk_scan are the same with
  A = -exp(A_log). The converter stores A itself: conversion/mamba.py Mamba2Model.modify_tensors
  (`data_torch = -torch.exp(data_torch)` for A_log), so ssm_a holds negative values (checked at load).
  dt_bias: the converter renames HF's dt_bias to ssm_dt.bias. HF's time_step_limit defaults to
  (0, inf): no clamp (llama.cpp has none).
- D: y + x * D (build_mamba2_layer ggml_mul(x, ssm_d); HF `D` skip in the scan).
- The gate and the norm: ggml_swiglu_split(z, y) = silu(z) * y, then RMSNorm over groups of di/G
  (build_mamba2_layer reshapes y to (di/G, G) before build_norm, eps = the model's
  layer_norm_rms_epsilon); HF GraniteMoeHybridRMSNormGated(group_size = di / n_groups): the gate
  multiplies before the norm. The converter reshapes ssm_norm to (G, di/G).
- Options other archs need (the defaults are granitehybrid's): `inner_twice=False` in read_dims takes
  an inner size other than 2 * D (nemotron_h: llama.cpp asserts 2 * n_embd == d_inner only in
  granite-hybrid.cpp and jamba.cpp; Nemotron Nano 9B v2 has 128 heads of 80 at a width of 4480);
  `norm_required=False` in load_mamba2 takes a layer without ssm_norm (falcon-h1: llama.cpp loads it
  TENSOR_NOT_REQUIRED and build_mamba2_layer skips the norm when it is absent, leaving
  y * silu(z); HF FalconH1Mixer with mamba_rms_norm false: `scan_output * act(gate)`).

The state a sequence keeps (the cache's recurrent_state(layer), runtime/kv_cache.py):
- conv: a ring of K rows of xBC (float32), position p's row at slot p % K. A step first reads the
  K-1 rows before its first position, then writes its own last min(T, K) rows.
- ssm: a ring of 2 states S (H, P, N) (float32): the state after position p at slot p % 2. A step at
  p0 reads slot (p0 - 1) % 2 (zero at p0 = 0) and writes the state after its last position.
Both are indexed by device positions (no host value: a CUDA-graph decode step runs it), and a step
repeated at the same position reads what it read the first time (its slots differ from the ones
it reads), as the decode graph's warm-up runs do and a token computed ahead (device_draw) that is
then dropped. The state before an earlier position is gone: a cache that holds positions [0, n)
continues at n or starts again at 0 (Engine: `recurrent` models reuse a cached prefix only whole).

The batch engine (minfer serve -np N; runtime/paged_state.py): the same two rings per state slot
of a pool, one slot per running sequence (zeroed when a sequence takes it, so nothing is masked
at position 0 there), handed to the mixer as a BatchState: decode rows gathered, stepped and
scattered back by their device slot indices in one set of ops (conv_scan_batch; a CUDA graph
replays it), prefill chunks by the single-sequence code on their slot's rings.

The prefill's scan is chunked (the SSD form, CHUNK positions at a time: within a chunk the
outputs are a masked (CHUNK, CHUNK) mixing of the chunk's inputs plus the carried state's
contribution, then the state is carried on); it and the conv are torch ops on every device,
counted on CUDA as `ssm.scan.torch` / `ssm.conv.torch`. On CUDA the decode rows (a single
sequence's one-token step, the batch engine's decode rows) take ops/cuda/ssm_step.py's kernel
instead: the conv ring, conv, SiLU, dt, the state update and the D skip of every row and head in
one launch on the same rings (`ssm.step.triton`), and every row's gate and group norm one more
(`ssm.norm.triton`): two launches between the projections where the torch step ran 61 ops (one
sequence) or 38 (batch rows). scan_sequential below is the step-by-step recurrence, kept as the
tests' reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.errors import MinferError
from minfer.weights import QWeight, load_dense, load_qweight, load_vector

CHUNK = 64      # positions per chunk of the prefill's scan: (CHUNK, CHUNK, H) float32 per chunk


@dataclass(frozen=True)
class Mamba2Dims:
    d_inner: int     # di  ssm.inner_size
    d_state: int     # N   ssm.state_size
    n_heads: int     # H   ssm.time_step_rank
    n_groups: int    # G   ssm.group_count
    d_conv: int      # K   ssm.conv_kernel

    @property
    def head_dim(self) -> int:
        return self.d_inner // self.n_heads

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def in_dim(self) -> int:
        return 2 * self.d_inner + 2 * self.n_groups * self.d_state + self.n_heads

    def state_shapes(self) -> tuple:
        """The cache's per-sequence state of one layer: the conv ring (K, conv_dim), the SSM ring (2, H, P, N)."""
        return ((self.d_conv, self.conv_dim), (2, self.n_heads, self.head_dim, self.d_state))


@dataclass
class Mamba2Weights:
    ssm_in: QWeight                  # (in_dim, D)
    conv_w: torch.Tensor             # (K, conv_dim) float32: tap k on position p - K + 1 + k
    conv_b: torch.Tensor | None      # (conv_dim,)
    dt_bias: torch.Tensor            # (H,)
    A: torch.Tensor                  # (H,), negative
    D: torch.Tensor                  # (H,)
    norm: torch.Tensor | None        # (di,): G groups of di / G; None: no norm after the gate
    ssm_out: QWeight                 # (D, di)


def recurrent_state(cache, arch: str, layers: str = "Mamba-2"):
    """cache.recurrent_state (layer -> that layer's state: KVCache's tuple, or the paged cache's
    BatchState), or a MinferError naming the cache: the recurrent layers keep state only in a cache
    made for it (granitehybrid, nemotron_h, falcon-h1, mamba2, the qwen35 family)."""
    state = getattr(cache, "recurrent_state", None)
    if state is None:
        raise MinferError(f"{arch}: the {layers} layers need a cache that keeps their recurrent state (KVCache, or the "
                          f"batch engine's PagedKVCache with state slots); {type(cache).__name__} keeps none")
    return state


def read_ssm_keys(gf, arch: str, fields: tuple, layers: str) -> dict:
    """{field: value of `{arch}.ssm.{suffix}`} for fields' (field, suffix) pairs, each required and a
    positive integer (at most 2^20); a missing or wrong one is named with the file (layers: what needs
    them, for the message). The recurrent mixers' read_dims (here and deltanet.py)."""
    md, vals = gf.metadata, {}
    for name, suffix in fields:
        key = f"{arch}.ssm.{suffix}"
        if key not in md:
            raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model's "
                              f"{layers} layers)")
        v = md[key]
        if not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= 1 << 20:
            raise MinferError(f"{gf.path}: metadata key '{key}' = {v!r}: expected a positive integer")
        vals[name] = v
    return vals


def read_dims(gf, arch: str, d_model: int, inner_twice: bool = True) -> Mamba2Dims:
    """The ssm.* keys (llama.cpp llama_model_granite_hybrid::load_arch_hparams reads all five as
    required), checked against each other; a missing or wrong one is named. inner_twice: the inner
    size must be 2 * d_model (granitehybrid's graph asserts it; module doc)."""
    d = Mamba2Dims(**read_ssm_keys(gf, arch, (("d_conv", "conv_kernel"), ("d_inner", "inner_size"),
                                              ("d_state", "state_size"), ("n_heads", "time_step_rank"),
                                              ("n_groups", "group_count")), "Mamba-2"))
    if d.d_inner % d.n_heads or d.n_heads % d.n_groups:
        raise MinferError(f"{gf.path}: {arch}.ssm.inner_size={d.d_inner}, time_step_rank={d.n_heads}, "
                          f"group_count={d.n_groups}: the heads must divide the inner size and the groups the heads")
    if d.d_conv < 2:
        raise MinferError(f"{gf.path}: metadata key '{arch}.ssm.conv_kernel' = {d.d_conv}: expected at least 2")
    if inner_twice and d.d_inner != 2 * d_model:   # granite-hybrid.cpp: GGML_ASSERT(2 * n_embd == d_inner)
        raise MinferError(f"{gf.path}: {arch}.ssm.inner_size={d.d_inner} is not twice embedding_length={d_model} "
                          "(llama.cpp loads an expansion of 2 only)")
    return d


def load_mamba2(gf, i: int, d: Mamba2Dims, d_model: int, device, dtype, norm_required: bool = True) -> Mamba2Weights:
    """blk.i's Mamba-2 tensors, each shape checked by name (llama.cpp load_arch_tensors' shapes);
    norm_required=False: ssm_norm may be absent (falcon-h1; module doc)."""
    p = f"blk.{i}."
    conv = gf.tensor(p + "ssm_conv1d.weight")
    if tuple(conv.shape) != (d.conv_dim, d.d_conv):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_conv1d.weight' has shape {tuple(conv.shape)}, expected "
                          f"({d.conv_dim}, {d.d_conv}) (ssm.inner_size + 2 * group_count * state_size, conv_kernel)")
    conv_w = load_dense(gf, p + "ssm_conv1d.weight").reshape(d.conv_dim, d.d_conv).t().contiguous().to(device)
    conv_b = (load_vector(gf, p + "ssm_conv1d.bias", device, d.conv_dim)
              if p + "ssm_conv1d.bias" in gf.tensors else None)        # TENSOR_NOT_REQUIRED in llama.cpp
    A = load_vector(gf, p + "ssm_a", device, d.n_heads)
    if not bool((A < 0).all()):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_a' has values >= 0: expected A = -exp(A_log) < 0, which "
                          "llama.cpp's converter stores (a file holding A_log itself is not supported)")
    has_norm = norm_required or p + "ssm_norm.weight" in gf.tensors
    norm = gf.tensor(p + "ssm_norm.weight") if has_norm else None
    if norm is not None and tuple(norm.shape) not in ((d.n_groups, d.d_inner // d.n_groups), (d.d_inner,)):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_norm.weight' has shape {tuple(norm.shape)}, expected "
                          f"({d.n_groups}, {d.d_inner // d.n_groups}) (ssm.group_count, inner_size / group_count)")
    return Mamba2Weights(
        ssm_in=load_qweight(gf, p + "ssm_in.weight", device, (d.in_dim, d_model), dtype=dtype),
        conv_w=conv_w, conv_b=conv_b,
        dt_bias=load_vector(gf, p + "ssm_dt.bias", device, d.n_heads), A=A,
        D=load_vector(gf, p + "ssm_d", device, d.n_heads),
        norm=load_vector(gf, p + "ssm_norm.weight", device, d.d_inner) if has_norm else None,
        ssm_out=load_qweight(gf, p + "ssm_out.weight", device, (d_model, d.d_inner), dtype=dtype))


def causal_conv(xbc: torch.Tensor, w: Mamba2Weights, ring: torch.Tensor, positions: torch.Tensor,
                masked: bool = True) -> torch.Tensor:
    """silu(conv(xBC) + b) of the step's rows xbc (T, conv_dim) float32 at the consecutive positions
    `positions`, the K-1 rows before them read from the ring (zeros before position 0), this
    step's last rows written to it. (T, conv_dim) float32. masked=False: the rows before position
    0 are read from the ring as they are (the batch engine's slots, zeroed when a sequence takes
    one: runtime/paged_state.py)."""
    T, W = xbc.shape
    K = w.conv_w.shape[0]
    R = ring.shape[0]
    prev_pos = positions[:1] + torch.arange(1 - K, 0, device=positions.device)        # (K-1,)
    prev = ring.index_select(0, prev_pos.remainder(R))
    if masked:
        prev = prev * (prev_pos >= 0).unsqueeze(-1).to(ring.dtype)
    m = min(T, R)                                      # read before written: the slots may coincide
    ring.index_copy_(0, positions[T - m:].remainder(R), xbc[T - m:])
    seq = torch.cat([prev, xbc], 0)                                                   # (K-1+T, W)
    out = (seq.unfold(0, K, 1) * w.conv_w.t()).sum(-1)      # (T, W, K) * (W, K): tap K-1 on the current row
    if w.conv_b is not None:
        out = out + w.conv_b
    return F.silu(out)


def _initial_state(ring: torch.Tensor, positions: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """The state after position p0 - 1 (slot (p0 - 1) % 2), zero when p0 = 0 (masked=False: the
    slot as it is, zeroed by the batch engine's state pool): (H, P, N)."""
    p0 = positions[:1]
    s = ring.index_select(0, (p0 - 1).remainder(ring.shape[0]))[0]
    return s * (p0 > 0).to(s.dtype).view(1, 1, 1) if masked else s


def _store_state(ring: torch.Tensor, s: torch.Tensor, positions: torch.Tensor) -> None:
    ring.index_copy_(0, positions[-1:].remainder(ring.shape[0]), s.unsqueeze(0))


def _discretize(x, dt_raw, B, C, w: Mamba2Weights):
    """dt = softplus(dt_raw + dt_bias) (T, H); B, C repeated to one row per head (T, H, N)."""
    H, G = x.shape[1], B.shape[1]
    dt = F.softplus(dt_raw + w.dt_bias)          # ggml_compute_softplus_f32: x > 20 ? x : log1p(exp(x))
    return dt, B.repeat_interleave(H // G, dim=1), C.repeat_interleave(H // G, dim=1)   # head h: group h // (H/G)


def scan_sequential(x, dt_raw, B, C, w: Mamba2Weights, ring: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """The recurrence one position at a time (ggml ssm_scan_f32): x (T, H, P), dt_raw (T, H), B, C
    (T, G, N), all float32 -> y = S C (T, H, P), without D; the ring updated."""
    dt, Bh, Ch = _discretize(x, dt_raw, B, C, w)
    dA = torch.exp(dt * w.A)                                                   # (T, H)
    s = _initial_state(ring, positions)
    ys = []
    for t in range(x.shape[0]):
        s = s * dA[t].view(-1, 1, 1) + (x[t] * dt[t].unsqueeze(-1)).unsqueeze(-1) * Bh[t].unsqueeze(1)
        ys.append((s * Ch[t].unsqueeze(1)).sum(-1))                            # (H, P)
    _store_state(ring, s, positions)
    return torch.stack(ys)


def scan_chunked(x, dt_raw, B, C, w: Mamba2Weights, ring: torch.Tensor, positions: torch.Tensor,
                 chunk: int = CHUNK, masked: bool = True) -> torch.Tensor:
    """The same recurrence, `chunk` positions at a time (the SSD form of HF's mamba2_chunk_scan):
    with a_t = dt_t * A and c_t = a_1 + ... + a_t inside a chunk,
        y_t = exp(c_t) C_t S_0 + sum_{s<=t} exp(c_t - c_s) (C_t . B_s) dt_s x_s
        S_L = exp(c_L) S_0 + sum_s exp(c_L - c_s) dt_s x_s B_s^T
    (exp of non-positive numbers only: A < 0, dt > 0). Same shapes as scan_sequential; masked as
    _initial_state's."""
    dt, Bh, Ch = _discretize(x, dt_raw, B, C, w)
    a = dt * w.A                                                               # (T, H) <= 0
    s = _initial_state(ring, positions, masked)                                # (H, P, N)
    ys = []
    for c0 in range(0, x.shape[0], chunk):
        xc, dtc, Bc, Cc = x[c0:c0 + chunk], dt[c0:c0 + chunk], Bh[c0:c0 + chunk], Ch[c0:c0 + chunk]
        L = xc.shape[0]
        cum = a[c0:c0 + chunk].cumsum(0)                                       # (L, H)
        diff = cum.unsqueeze(1) - cum.unsqueeze(0)                              # (t, s, H): c_t - c_s
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril().unsqueeze(-1)
        decay = torch.exp(diff.masked_fill(~causal, float("-inf")))             # 0 above the diagonal
        mix = decay * torch.einsum("thn,shn->tsh", Cc, Bc) * dtc.unsqueeze(0)   # (t, s, H)
        y = torch.einsum("tsh,shp->thp", mix, xc)
        y = y + torch.exp(cum).unsqueeze(-1) * torch.einsum("thn,hpn->thp", Cc, s)
        to_end = torch.exp(cum[-1:] - cum) * dtc                               # (L, H): exp(c_L - c_s) dt_s
        s = torch.exp(cum[-1]).view(-1, 1, 1) * s + torch.einsum("sh,shp,shn->hpn", to_end, xc, Bc)
        ys.append(y)
    _store_state(ring, s, positions)
    return torch.cat(ys)


def mamba2_mixer(h: torch.Tensor, w: Mamba2Weights, d: Mamba2Dims, state: tuple, positions: torch.Tensor,
                 eps: float, ctx) -> torch.Tensor:
    """The mixer of the normed input h (T, D) at the consecutive `positions` -> W_out(...) (T, D) in h's
    dtype; state: the layer's (conv ring, ssm ring) from the cache, updated in place, or the batch
    engine's slots of several sequences (runtime/paged_state.py BatchState: conv_scan_batch)."""
    T = h.shape[0]
    H, G, di = d.n_heads, d.n_groups, d.d_inner
    be = ops._backend(h)
    if be is not ops.reference:                  # the CUDA backend (or the tests' interpreted one)
        if ctx is None or ctx.switches.recurrent_step_kernels:
            return _mixer_cuda(h, w, d, state, positions, eps, ctx, be)
        ops.paths.count("ssm.conv.torch")        # Switches.recurrent_step_kernels off: every row by torch ops
        ops.paths.count("ssm.scan.torch")
    zxbcdt = ops.linear(h, w.ssm_in, None, ctx).float()                     # (T, in_dim)
    z, xbc, dt = zxbcdt.split([di, d.conv_dim, H], dim=-1)
    if isinstance(state, tuple):
        x, y = conv_scan(xbc, dt, w, d, state, positions)
    else:
        x, y = conv_scan_batch(xbc, dt, w, d, state, positions)
    y = y + x * w.D.view(1, H, 1)                                            # the D skip
    y = gated_group_norm(y.reshape(T, di), z, w.norm, G, eps)
    return ops.linear(y.to(h.dtype), w.ssm_out, None, ctx)


def _mixer_cuda(h, w: Mamba2Weights, d: Mamba2Dims, state, positions: torch.Tensor, eps: float, ctx, be):
    """mamba2_mixer on the CUDA backend `be`: the decode rows (a single sequence's one-token step, the
    batch engine's decode rows) through ops/cuda/ssm_step.py's kernel, one launch for the conv and the
    state update of every row and head (`ssm.step.triton`); prefill rows through conv_scan's torch ops
    (`ssm.conv.torch`, `ssm.scan.torch`); then the gate and the group norm in one kernel
    (`ssm.norm.triton`). The in-projection's rows are read in their dtype (float32 inside)."""
    T = h.shape[0]
    H, di = d.n_heads, d.d_inner
    zxbcdt = ops.linear(h, w.ssm_in, None, ctx)                              # (T, in_dim)
    single = isinstance(state, tuple)
    nd = (1 if T == 1 else 0) if single else state.n_decode                  # host values only
    y = torch.empty((T, di), dtype=torch.float32, device=h.device) if nd < T else None
    if nd:
        conv, ssm = state if single else (state.conv, state.ssm)
        yd = be.ssm_step(zxbcdt[:nd], w.conv_w, w.conv_b, w.dt_bias, w.A, w.D, conv, ssm, positions[:nd],
                         None if single else state.decode_slots)
        if y is None:
            y = yd
        else:
            y[:nd] = yd
    if nd < T:
        ops.paths.count("ssm.conv.torch")
        ops.paths.count("ssm.scan.torch")
        _, xbc, dt = zxbcdt.float().split([di, d.conv_dim, H], dim=-1)
        pieces = [(0, T, state, True)] if single else [(q0, n, (state.conv[slot], state.ssm[slot]), False)
                                                       for q0, n, slot in state.chunks]
        for q0, n, st, masked in pieces:
            x, yc = conv_scan(xbc[q0:q0 + n], dt[q0:q0 + n], w, d, st, positions[q0:q0 + n], masked=masked)
            y[q0:q0 + n] = (yc + x * w.D.view(1, H, 1)).reshape(n, di)
    y = be.ssm_gate_norm(y, zxbcdt, w.norm, d.n_groups, eps, h.dtype)
    return ops.linear(y, w.ssm_out, None, ctx)


def conv_scan(xbc, dt, w: Mamba2Weights, d: Mamba2Dims, state: tuple, positions: torch.Tensor,
              masked: bool = True) -> tuple:
    """One sequence's conv and scan at the consecutive `positions`: xbc (T, conv_dim), dt (T, H)
    float32, state its (conv ring, ssm ring) -> x (T, H, P), y = S C (T, H, P), the rings updated."""
    T = xbc.shape[0]
    G, N, di = d.n_groups, d.d_state, d.d_inner
    conv_ring, ssm_ring = state
    kw = {} if masked else {"masked": False}          # the single-sequence calls as they were
    xbc = causal_conv(xbc, w, conv_ring, positions, **kw)
    x, B, C = xbc.split([di, G * N, G * N], dim=-1)
    x = x.reshape(T, d.n_heads, d.head_dim)
    return x, scan_chunked(x, dt, B.reshape(T, G, N), C.reshape(T, G, N), w, ssm_ring, positions, **kw)


def conv_scan_batch(xbc, dt, w: Mamba2Weights, d: Mamba2Dims, state, positions: torch.Tensor) -> tuple:
    """conv_scan over the batch engine's ragged step (runtime/paged_state.py BatchState): state.conv
    (S, K, conv_dim) and state.ssm (S, 2, H, P, N) hold one ring each per state slot. The decode rows
    (tokens [0, n_decode), one per sequence, slots state.decode_slots on the device) in one set of
    batched ops (gather by slot, the recurrence's step, scatter), so a CUDA graph replays them; each
    prefill chunk (q0, n, slot) by conv_scan on its slot's rings. Nothing is masked at position 0:
    a slot is zeroed when a sequence takes it."""
    xs, ys = [], []
    nd = state.n_decode
    if nd:
        x, y = _decode_rows(xbc[:nd], dt[:nd], w, d, state.conv, state.ssm, state.decode_slots, positions[:nd])
        xs.append(x)
        ys.append(y)
    for q0, n, slot in state.chunks:
        x, y = conv_scan(xbc[q0:q0 + n], dt[q0:q0 + n], w, d, (state.conv[slot], state.ssm[slot]),
                         positions[q0:q0 + n], masked=False)
        xs.append(x)
        ys.append(y)
    return (xs[0], ys[0]) if len(xs) == 1 else (torch.cat(xs), torch.cat(ys))


def _decode_rows(xbc, dt_raw, w: Mamba2Weights, d: Mamba2Dims, conv, ssm, slots, positions) -> tuple:
    """One token per row b at positions[b] of the sequence in slots[b]: the conv reads the slot's
    ring rows of positions p-K+1 .. p-1 and writes row p % K; the scan reads the state after p - 1
    (ring slot (p - 1) % 2) and writes the state after p at p % 2 (the single-sequence layout, so a
    repeated step reads what it read before). xbc (B, conv_dim), dt_raw (B, H) -> x, y (B, H, P)."""
    Bn = xbc.shape[0]
    K = conv.shape[1]
    H, P, G, N, di = d.n_heads, d.head_dim, d.n_groups, d.d_state, d.d_inner
    prev_idx = (positions.unsqueeze(1) + torch.arange(1 - K, 0, device=positions.device)).remainder(K)
    prev = conv[slots.unsqueeze(1), prev_idx]                                 # (B, K-1, W)
    conv[slots, positions.remainder(K)] = xbc                                 # read before written
    seq = torch.cat([prev, xbc.unsqueeze(1)], 1)                               # (B, K, W)
    out = (seq.transpose(1, 2) * w.conv_w.t()).sum(-1)                         # tap K-1 on the current row
    if w.conv_b is not None:
        out = out + w.conv_b
    x, B, C = F.silu(out).split([di, G * N, G * N], dim=-1)
    x = x.reshape(Bn, H, P)
    dt = F.softplus(dt_raw + w.dt_bias)                                        # (B, H)
    Bh = B.reshape(Bn, G, N).repeat_interleave(H // G, dim=1)                  # (B, H, N)
    Ch = C.reshape(Bn, G, N).repeat_interleave(H // G, dim=1)
    s = ssm[slots, (positions - 1).remainder(ssm.shape[1])]                    # (B, H, P, N)
    s = s * torch.exp(dt * w.A).view(Bn, H, 1, 1) + (x * dt.unsqueeze(-1)).unsqueeze(-1) * Bh.unsqueeze(2)
    ssm[slots, positions.remainder(ssm.shape[1])] = s
    return x, (s * Ch.unsqueeze(2)).sum(-1)


def gated_group_norm(y: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, groups: int, eps: float) -> torch.Tensor:
    """weight * RMSNorm(y * silu(z)) over each of `groups` groups of channels: y, z (T, di) float32;
    weight None: y * silu(z) alone (module doc)."""
    T, di = y.shape
    if weight is None:
        return y * F.silu(z)
    g = (y * F.silu(z)).view(T, groups, di // groups)
    return (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)).reshape(T, di) * weight
