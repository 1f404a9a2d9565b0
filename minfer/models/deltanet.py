"""The gated DeltaNet linear attention of the Qwen3.5 family's recurrent layers (qwen35, qwen35moe,
qwen3next: models/qwen35.py).

    qkv = W_qkv h; z = W_z h                         attn_qkv (2*Hk*Dk + Hv*Dv, D), attn_gate (Hv*Dv, D)
    beta = sigmoid(W_beta h)                         ssm_beta (Hv, D)
    g = ssm_a * softplus(W_alpha h + dt_bias)        ssm_alpha (Hv, D), ssm_dt.bias (Hv,), ssm_a (Hv,) < 0
    qkv_p = silu(sum_k w[k] qkv_{p-K+1+k})           ssm_conv1d.weight (conv_dim, K): causal, depthwise,
                                                     no bias; qkv_j = 0 for j < 0
    [q; k; v] = qkv_p                                q, k (Hk, Dk), v (Hv, Dv)
    q = l2norm(q) / sqrt(Dk); k = l2norm(k)
    per value head j (with key head kh(j)), S (Dk, Dv), S_{-1} = 0:
        S = exp(g_p) S
        S = S + k (beta_p (v - S^T k))^T
        o_p = S^T q
    out = W_out (w * RMSNorm(o) * silu(z))           per head of Dv; ssm_norm (Dv,), ssm_out (D, Hv*Dv)

with Dk = ssm.state_size, Hk = ssm.group_count, Hv = ssm.time_step_rank, Hv*Dv = ssm.inner_size,
K = ssm.conv_kernel.

Each rule and its source (llama.cpp src/models/qwen35.cpp build_layer_attn_linear, qwen3next.cpp,
delta-net-base.cpp build_delta_net_autoregressive / _chunking; the converter conversion/qwen.py
Qwen3NextModel / _LinearAttentionVReorderBase; HF modeling_qwen3_5 Qwen3_5GatedDeltaNet and
torch_recurrent_gated_delta_rule):
- beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias) (HF forward; qwen35.cpp `beta_sigmoid`,
  `alpha_softplus` times ssm_a). The converter stores ssm_a = -exp(A_log) (Qwen3NextModel.modify_tensors)
  and renames dt_bias to ssm_dt.bias: ssm_a must be negative (checked at load).
- The conv: HF nn.Conv1d(bias=False, groups=conv_dim, padding K-1) then silu; qwen35.cpp ggml_ssm_conv
  + ggml_silu over the qkv channels (z, beta, alpha are not convolved). The converter squeezes the
  weight to (conv_dim, K).
- L2 norm of q and k per head: HF l2norm x * rsqrt(sum x^2 + 1e-6) (use_qk_l2norm_in_kernel=True);
  llama.cpp build_gdn_l2_norm x / max(|x|, eps) with eps = the rms eps: the two differ only for
  |x|^2 near 1e-6. minfer takes HF's.
- The q scale 1/sqrt(Dk) after the norm (HF `query / query.shape[-1] ** 0.5`; delta-net-base.cpp
  `scale = 1.0f / sqrtf(S_k)`).
- The delta rule: HF torch_recurrent_gated_delta_rule (decay, kv_mem = S^T k, delta = (v - kv_mem)
  beta, S += k delta^T, o = S^T q); build_delta_net_autoregressive is the same.
- Which key head a value head reads (Hv > Hk): HF repeat_interleave (value head j reads key head
  j // (Hv/Hk)). qwen3next.cpp does the same (its "repeat interleave" reshape). The Qwen3.5 converter
  reorders the value heads to tiled order (_LinearAttentionVReorderBase._reorder_v_heads: rows of
  in_proj_qkv's v part, in_proj_z, in_proj_a/b, A_log, dt_bias, the conv's v channels and out_proj's
  columns) so that qwen35.cpp's ggml_repeat_4d (value head j reads key head j % Hk) is HF's: the
  `tiled` switch (True for qwen35 / qwen35moe).
- The output norm: HF Qwen3_5RMSNormGated (norm first, times the weight, then silu(z); eps = the rms
  eps), qwen35.cpp build_norm_gated; per value head of Dv. ssm_norm is used as stored (no +1: the
  converter adds 1 only to the other norms).

The state a sequence keeps (the cache's recurrent_state(layer), runtime/kv_cache.py), float32: a
conv ring (K, conv_dim) of qkv rows, position p at slot p % K (mamba2.causal_conv's ring), and a
ring of two states (2, Hv, Dk, Dv), the state after position p at slot p % 2 (mamba2's), so a step
repeated at its position reads what it read before (CUDA-graph warm-up, a token computed ahead).

The batch engine (minfer serve -np N; runtime/paged_state.py, as mamba2.py's): the same two rings
per state slot of a pool, one slot per running sequence (zeroed when a sequence takes it, so nothing
is masked at position 0 there), handed to the mixer as a BatchState: the decode rows gathered by
their device slot indices, stepped once and scattered back in one set of batched ops (a CUDA graph
replays it: no host value), each prefill chunk by the single-sequence conv and chunked scan on its
slot's rings (conv_scan_batch).

The prefill runs the chunked form (CHUNK positions at a time; scan_chunked, the WY form of HF's
torch_chunk_gated_delta_rule written out below); scan_sequential is the recurrence, the tests'
reference. Both are torch ops on every device, counted on CUDA as `deltanet.conv.torch` and
`deltanet.scan.torch`. On CUDA the decode rows (one token each: the single sequence's T = 1 step,
the batch engine's n_decode rows) take one Triton launch instead (ops/cuda/deltanet_step.py,
`deltanet.step.triton`): the conv ring update + conv + SiLU, the q/k norms, beta and the decay, the
delta rule of every value head on the same rings, and the gated output norm, reading the
projections' rows in their dtype and writing the out projection's input; the torch step here
(_decode_rows, scan_sequential) stays the CPU's and the kernel's reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.errors import MinferError
from minfer.models.mamba2 import _initial_state, _store_state, causal_conv, read_ssm_keys
from minfer.weights import QWeight, load_dense, load_qweight, load_vector

CHUNK = 64      # positions per chunk of the prefill's scan (delta-net-base.cpp: CS = 64)
L2_EPS = 1e-6   # HF l2norm


@dataclass(frozen=True)
class DeltaNetDims:
    d_conv: int      # K   ssm.conv_kernel
    d_inner: int     # Hv * Dv   ssm.inner_size
    d_state: int     # Dk  ssm.state_size (the key head size)
    n_v_heads: int   # Hv  ssm.time_step_rank
    n_k_heads: int   # Hk  ssm.group_count

    @property
    def v_dim(self) -> int:
        return self.d_inner // self.n_v_heads

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.d_state

    @property
    def conv_dim(self) -> int:
        return 2 * self.key_dim + self.d_inner

    def state_shapes(self) -> tuple:
        """One layer's per-sequence state: the conv ring (K, conv_dim), the state ring (2, Hv, Dk, Dv)."""
        return ((self.d_conv, self.conv_dim), (2, self.n_v_heads, self.d_state, self.v_dim))


@dataclass
class DeltaNetWeights:
    attn_qkv: QWeight              # (conv_dim, D)
    attn_gate: QWeight             # z: (Hv*Dv, D)
    ssm_beta: QWeight | None       # (Hv, D); None with ssm_ba
    ssm_alpha: QWeight | None      # (Hv, D)
    conv_w: torch.Tensor           # (K, conv_dim) float32: tap k on position p - K + 1 + k
    dt_bias: torch.Tensor          # (Hv,)
    A: torch.Tensor                # (Hv,) < 0
    norm: torch.Tensor             # (Dv,)
    ssm_out: QWeight               # (D, Hv*Dv)
    ssm_ba: QWeight | None = None  # qwen3next: (2 Hv, D), per key head r beta rows then r alpha rows
    conv_b = None                  # no conv bias (mamba2.causal_conv reads it)

    def matrices(self) -> list[QWeight]:
        """The layer's matrices that exist."""
        return [w for w in (self.attn_qkv, self.attn_gate, self.ssm_beta, self.ssm_alpha, self.ssm_ba, self.ssm_out)
                if w is not None]


def read_dims(gf, arch: str) -> DeltaNetDims:
    """The ssm.* keys (llama.cpp load_arch_hparams of qwen35 / qwen35moe / qwen3next reads all five as
    required), checked; a missing or wrong one is named."""
    d = DeltaNetDims(**read_ssm_keys(gf, arch, (("d_conv", "conv_kernel"), ("d_inner", "inner_size"),
                                                ("d_state", "state_size"), ("n_v_heads", "time_step_rank"),
                                                ("n_k_heads", "group_count")), "linear-attention"))
    if d.d_inner % d.n_v_heads or d.n_v_heads % d.n_k_heads:
        raise MinferError(f"{gf.path}: {arch}.ssm.inner_size={d.d_inner}, time_step_rank={d.n_v_heads}, "
                          f"group_count={d.n_k_heads}: the value heads must divide the inner size and the key "
                          "heads the value heads")
    if d.v_dim != d.d_state:      # delta-net-base.cpp: GGML_ASSERT(S_k == S_v)
        raise MinferError(f"{gf.path}: {arch}.ssm.state_size={d.d_state} differs from the value head size "
                          f"inner_size / time_step_rank = {d.v_dim} (llama.cpp asserts they are equal)")
    if d.d_conv < 2:
        raise MinferError(f"{gf.path}: metadata key '{arch}.ssm.conv_kernel' = {d.d_conv}: expected at least 2")
    return d


def load_deltanet(gf, i: int, d: DeltaNetDims, d_model: int, device, dtype, fused_ba: bool = False) -> DeltaNetWeights:
    """blk.i's linear-attention tensors, each shape checked by name (qwen35.cpp load_arch_tensors);
    fused_ba: beta and alpha in one ssm_ba matrix (qwen3next.cpp ssm_beta_alpha: HF in_proj_ba as is)."""
    p = f"blk.{i}."
    if p + "ssm_in.weight" in gf.tensors and p + "attn_qkv.weight" not in gf.tensors:
        raise MinferError(f"{gf.path}: tensor '{p}ssm_in.weight': the older Qwen3-Next layout (one interleaved "
                          "qkvz projection) is not supported; files from the current converter have attn_qkv and "
                          "attn_gate")
    conv = gf.tensor(p + "ssm_conv1d.weight")
    if tuple(conv.shape) != (d.conv_dim, d.d_conv):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_conv1d.weight' has shape {tuple(conv.shape)}, expected "
                          f"({d.conv_dim}, {d.d_conv}) (2 * group_count * state_size + inner_size, conv_kernel)")
    if p + "ssm_conv1d.bias" in gf.tensors:
        raise MinferError(f"{gf.path}: tensor '{p}ssm_conv1d.bias': the Qwen3.5 family's conv has no bias")
    A = load_vector(gf, p + "ssm_a", device, d.n_v_heads)
    if not bool((A < 0).all()):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_a' has values >= 0: expected -exp(A_log) < 0, which "
                          "llama.cpp's converter stores (a file holding A_log itself is not supported)")

    def w(name, rows):
        return load_qweight(gf, p + name + ".weight", device, (rows, d_model), dtype=dtype)

    return DeltaNetWeights(
        attn_qkv=w("attn_qkv", d.conv_dim), attn_gate=w("attn_gate", d.d_inner),
        ssm_beta=None if fused_ba else w("ssm_beta", d.n_v_heads),
        ssm_alpha=None if fused_ba else w("ssm_alpha", d.n_v_heads),
        ssm_ba=w("ssm_ba", 2 * d.n_v_heads) if fused_ba else None,
        conv_w=load_dense(gf, p + "ssm_conv1d.weight").reshape(d.conv_dim, d.d_conv).t().contiguous().to(device),
        dt_bias=load_vector(gf, p + "ssm_dt.bias", device, d.n_v_heads), A=A,
        norm=load_vector(gf, p + "ssm_norm.weight", device, d.v_dim),
        ssm_out=load_qweight(gf, p + "ssm_out.weight", device, (d_model, d.d_inner), dtype=dtype))


def split_ba(ba: torch.Tensor, Hk: int, Hv: int) -> tuple:
    """(T, 2 Hv) of ssm_ba -> beta's and alpha's inputs (T, Hv) each: per key head its Hv/Hk beta values then
    its Hv/Hk alpha values (HF Qwen3NextGatedDeltaNet.fix_query_key_value_ordering; qwen3next.cpp's views
    of mixed_ba)."""
    T, r = ba.shape[0], Hv // Hk
    ba = ba.view(T, Hk, 2 * r)
    return ba[..., :r].reshape(T, Hv), ba[..., r:].reshape(T, Hv)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2_EPS)


def scan_sequential(q, k, v, g, beta, ring: torch.Tensor, positions: torch.Tensor,
                    masked: bool = True) -> torch.Tensor:
    """The gated delta rule one position at a time (HF torch_recurrent_gated_delta_rule): q, k (T, H, Dk)
    (normed, q scaled, one per value head), v (T, H, Dv), g, beta (T, H), float32 -> o (T, H, Dv); the
    state ring updated. masked=False: the state before position 0 read from the ring as it is (the
    batch engine's zeroed slot; mamba2._initial_state)."""
    s = _initial_state(ring, positions, masked)                               # (H, Dk, Dv)
    out = []
    for t in range(q.shape[0]):
        d = torch.exp(g[t])                   # (H,): a head's decay; (H, Dk): per key channel (KDA, models/kda.py)
        s = s * (d.view(-1, 1, 1) if d.dim() == 1 else d.unsqueeze(-1))     # row c decays by exp(g[c])
        kv = torch.einsum("hkv,hk->hv", s, k[t])                              # S^T k
        delta = (v[t] - kv) * beta[t].unsqueeze(-1)
        s = s + k[t].unsqueeze(-1) * delta.unsqueeze(1)                       # S += k delta^T
        out.append(torch.einsum("hkv,hk->hv", s, q[t]))                       # S^T q
    _store_state(ring, s, positions)
    return torch.stack(out)


def scan_chunked(q, k, v, g, beta, ring: torch.Tensor, positions: torch.Tensor, chunk: int = CHUNK,
                 masked: bool = True) -> torch.Tensor:
    """The same recurrence `chunk` positions at a time. With c_t = g_1 + ... + g_t inside a chunk and
    S_0 the carried state, the values written u_s = beta_s (v_s - (decayed S before s)^T k_s) solve
        (I + A) U = beta V - (beta exp(c) K) S_0,   A_sr = beta_s exp(c_s - c_r) (k_s . k_r), r < s
    (unit lower-triangular: torch.linalg.solve_triangular), then
        o_t = exp(c_t) S_0^T q_t + sum_{s<=t} exp(c_t - c_s) (q_t . k_s) u_s
        S_L = exp(c_L) S_0 + sum_s exp(c_L - c_s) k_s u_s^T
    (HF torch_chunk_gated_delta_rule's form; exp of non-positive numbers only: g <= 0). Shapes and
    masked as scan_sequential's."""
    s = _initial_state(ring, positions, masked)                               # (H, Dk, Dv)
    outs = []
    for c0 in range(0, q.shape[0], chunk):
        qc, kc, vc = (t[c0:c0 + chunk].transpose(0, 1) for t in (q, k, v))      # (H, L, .)
        gc, bc = g[c0:c0 + chunk].t(), beta[c0:c0 + chunk].t()                 # (H, L)
        L = qc.shape[1]
        cum = gc.cumsum(-1)                                                     # (H, L)
        diff = cum.unsqueeze(-1) - cum.unsqueeze(-2)                            # (H, t, s): c_t - c_s
        low = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        decay = torch.exp(diff.masked_fill(~low, float("-inf")))                # 0 above the diagonal
        strict = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(-1)
        A = (bc.unsqueeze(-1) * decay * (kc @ kc.transpose(-1, -2))).masked_fill(~strict, 0.0)   # r < s only
        eye = torch.eye(L, dtype=q.dtype, device=q.device)
        rhs = bc.unsqueeze(-1) * vc - (bc * torch.exp(cum)).unsqueeze(-1) * (kc @ s)   # (H, L, Dv)
        u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        o = torch.exp(cum).unsqueeze(-1) * (qc @ s) + (decay * (qc @ kc.transpose(-1, -2))) @ u
        s = torch.exp(cum[:, -1:]).unsqueeze(-1) * s + (kc * torch.exp(cum[:, -1:] - cum).unsqueeze(-1)).transpose(
            -1, -2) @ u
        outs.append(o.transpose(0, 1))
    _store_state(ring, s, positions)
    return torch.cat(outs)


def deltanet_mixer(h: torch.Tensor, w: DeltaNetWeights, d: DeltaNetDims, state, positions: torch.Tensor,
                   eps: float, tiled: bool, ctx) -> torch.Tensor:
    """The layer's linear attention of the normed input h (T, D) at the consecutive `positions` -> (T, D)
    in h's dtype; state: (conv ring, state ring) from the cache, updated in place, or the batch engine's
    slots of several sequences (runtime/paged_state.py BatchState: conv_scan_batch); tiled: value head j
    reads key head j % Hk (qwen35's reordered heads), else j // (Hv/Hk) (module doc). On CUDA the decode
    rows (T = 1 of one sequence; a BatchState's first n_decode) by ops/cuda/deltanet_step.py's kernel,
    the other rows by the torch ops."""
    T = h.shape[0]
    Hk, Hv, Dv = d.n_k_heads, d.n_v_heads, d.v_dim
    qkv, z = (ops.linear(h, m, None, ctx) for m in (w.attn_qkv, w.attn_gate))
    if w.ssm_ba is None:
        b, a = (ops.linear(h, m, None, ctx) for m in (w.ssm_beta, w.ssm_alpha))
    else:
        b, a = ops.linear(h, w.ssm_ba, None, ctx), None
    single = isinstance(state, tuple)
    C = ops._backend(h)
    nd = 0                     # the rows of one token each that the CUDA kernel steps (rows [0, nd))
    if C is not ops.reference and (ctx is None or ctx.switches.recurrent_step_kernels):
        nd = (1 if T == 1 else 0) if single else state.n_decode      # the CUDA backend (or the interpreted one)
    ys = []
    if nd:
        conv, ssm, slots = (state[0], state[1], None) if single else (state.conv, state.ssm, state.decode_slots)
        ys.append(C.deltanet_step(qkv[:nd], z[:nd], b[:nd], None if a is None else a[:nd], positions[:nd], conv,
                                  w.conv_w, ssm, w.dt_bias, w.A, w.norm, n_k_heads=Hk, tiled=tiled, eps=eps,
                                  slots=slots, fused_ba=a is None, out_dtype=h.dtype))
    if nd < T:
        if C is not ops.reference:
            ops.paths.count("deltanet.conv.torch")
            ops.paths.count("deltanet.scan.torch")
        qkv, z, b = qkv.float(), z.float(), b.float()
        b, a = split_ba(b, Hk, Hv) if a is None else (b, a.float())
        beta = torch.sigmoid(b)                                                # (T, Hv)
        g = F.softplus(a + w.dt_bias) * w.A                                    # (T, Hv) <= 0
        if single:
            o = conv_scan(qkv, g, beta, w, d, state, positions, tiled)         # (T, Hv, Dv)
        else:                                                                  # rows [nd, T)
            o = conv_scan_batch(qkv, g, beta, w, d, state, positions, tiled, decode=nd == 0)
        o = gated_head_norm(o, z[nd:].view(T - nd, Hv, Dv), w.norm, eps)
        ys.append(o.reshape(T - nd, Hv * Dv).to(h.dtype))
    return ops.linear(ys[0] if len(ys) == 1 else torch.cat(ys), w.ssm_out, None, ctx)


def _heads(qkv: torch.Tensor, d: DeltaNetDims, tiled: bool) -> tuple:
    """The conv's output (T, conv_dim) -> q (normed, scaled), k (normed) (T, Hv, Dk), one per value
    head (tiled: value head j reads key head j % Hk, else j // (Hv/Hk)), and v (T, Hv, Dv)."""
    T = qkv.shape[0]
    Hk, Hv, Dk = d.n_k_heads, d.n_v_heads, d.d_state
    q, k, v = qkv.split([d.key_dim, d.key_dim, d.d_inner], dim=-1)
    q, k = l2norm(q.reshape(T, Hk, Dk)) * Dk ** -0.5, l2norm(k.reshape(T, Hk, Dk))
    if Hv != Hk:
        r = Hv // Hk
        q, k = (q.repeat(1, r, 1), k.repeat(1, r, 1)) if tiled else \
               (q.repeat_interleave(r, dim=1), k.repeat_interleave(r, dim=1))
    return q, k, v.reshape(T, Hv, d.v_dim)


def conv_scan(qkv, g, beta, w: DeltaNetWeights, d: DeltaNetDims, state: tuple, positions: torch.Tensor,
              tiled: bool, masked: bool = True) -> torch.Tensor:
    """One sequence's conv and delta rule at the consecutive `positions`: qkv (T, conv_dim), g, beta
    (T, Hv) float32, state its (conv ring, state ring), updated -> o (T, Hv, Dv)."""
    conv_ring, s_ring = state
    kw = {} if masked else {"masked": False}          # the single-sequence calls as they were
    q, k, v = _heads(causal_conv(qkv, w, conv_ring, positions, **kw), d, tiled)
    scan = scan_sequential if qkv.shape[0] == 1 else scan_chunked
    return scan(q, k, v, g, beta, s_ring, positions, **kw)


def conv_scan_batch(qkv, g, beta, w: DeltaNetWeights, d: DeltaNetDims, state, positions: torch.Tensor,
                    tiled: bool, decode: bool = True) -> torch.Tensor:
    """conv_scan over the batch engine's ragged step (runtime/paged_state.py BatchState): state.conv
    (S, K, conv_dim) and state.ssm (S, 2, Hv, Dk, Dv) hold one ring each per state slot. The decode
    rows (tokens [0, n_decode), one per sequence, slots state.decode_slots on the device) in one set
    of batched ops (_decode_rows), so a CUDA graph replays them; each prefill chunk (q0, n, slot) by
    conv_scan on its slot's rings. Nothing is masked at position 0: a slot is zeroed when a sequence
    takes it. -> o (T, Hv, Dv); decode=False: the decode rows left out (stepped by the CUDA kernel) -> o
    of rows [n_decode, T)."""
    os = []
    nd = state.n_decode
    if nd and decode:
        os.append(_decode_rows(qkv[:nd], g[:nd], beta[:nd], w, d, state.conv, state.ssm, state.decode_slots,
                               positions[:nd], tiled))
    for q0, n, slot in state.chunks:
        os.append(conv_scan(qkv[q0:q0 + n], g[q0:q0 + n], beta[q0:q0 + n], w, d, (state.conv[slot], state.ssm[slot]),
                            positions[q0:q0 + n], tiled, masked=False))
    return os[0] if len(os) == 1 else torch.cat(os)


def _decode_rows(qkv, g, beta, w: DeltaNetWeights, d: DeltaNetDims, conv, ssm, slots, positions,
                 tiled: bool) -> torch.Tensor:
    """One token per row b at positions[b] of the sequence in slots[b]: the conv reads the slot's ring
    rows of positions p-K+1 .. p-1 and writes row p % K; the delta rule reads the state after p - 1
    (ring slot (p - 1) % 2) and writes the state after p at p % 2 (the single-sequence layout, so a
    repeated step reads what it read before). Device indices only (no host value: a CUDA graph's
    decode step). qkv (B, conv_dim), g, beta (B, Hv) -> o (B, Hv, Dv)."""
    K = conv.shape[1]
    prev_idx = (positions.unsqueeze(1) + torch.arange(1 - K, 0, device=positions.device)).remainder(K)
    prev = conv[slots.unsqueeze(1), prev_idx]                                 # (B, K-1, W)
    conv[slots, positions.remainder(K)] = qkv                                 # read before written
    seq = torch.cat([prev, qkv.unsqueeze(1)], 1)                               # (B, K, W)
    q, k, v = _heads(F.silu((seq * w.conv_w).sum(1)), d, tiled)               # tap K-1 on the current row
    R = ssm.shape[1]
    s = ssm[slots, (positions - 1).remainder(R)] * torch.exp(g).unsqueeze(-1).unsqueeze(-1)   # (B, Hv, Dk, Dv)
    delta = (v - torch.einsum("bhkv,bhk->bhv", s, k)) * beta.unsqueeze(-1)    # beta (v - S^T k)
    s = s + k.unsqueeze(-1) * delta.unsqueeze(2)                               # S += k delta^T
    ssm[slots, positions.remainder(R)] = s
    return torch.einsum("bhkv,bhk->bhv", s, q)                                 # S^T q


def gated_head_norm(o: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm(o) * silu(z) per head: o, z (T, Hv, Dv) float32 (the norm before the gate: HF
    Qwen3_5RMSNormGated, qwen35.cpp build_norm_gated)."""
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight * F.silu(z)
