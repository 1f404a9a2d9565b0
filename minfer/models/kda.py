"""Kimi Delta Attention (KDA): the linear-attention layers of Kimi-Linear (models/kimi_linear.py, the GGUF arch
`kimi-linear`). The gated delta rule of deltanet.py with a decay PER KEY CHANNEL instead of one per head:

    q, k, v = W_q h, W_k h, W_v h                    attn_q, attn_k, attn_v (H*Dh, D) each
    q, k, v = silu(conv_q(q)), silu(conv_k(k)), silu(conv_v(v))
                                                     ssm_conv1d_{q,k,v}.weight (H*Dh, K): causal, depthwise,
                                                     no bias, tap K-1 on the current row; rows before 0 are 0
    g = A[h] * softplus(W_fb W_fa h + dt_bias)       ssm_f_a (Dh, D), ssm_f_b (H*Dh, Dh), ssm_dt.bias (H*Dh,),
                                                     ssm_a (H,) = -exp(A_log) < 0: g (T, H, Dh) <= 0
    beta = sigmoid(W_beta h)                         ssm_beta (H, D)
    q = l2norm(q) / sqrt(Dh); k = l2norm(k)          per head
    per head, S (Dh, Dh), S_{-1} = 0:
        S = diag(exp(g_p)) S                         (row c of S, key channel c, decays by exp(g_p[c]))
        S = S + k (beta_p (v - S^T k))^T
        o_p = S^T q
    out = W_o (w * RMSNorm(o) * sigmoid(W_gb W_ga h))   per head of Dh; ssm_norm (Dh,), ssm_g_a (Dh, D),
                                                     ssm_g_b (H*Dh, Dh), attn_output (D, H*Dh)

with H = attention.head_count, Dh = kda.head_dim, K = ssm.conv_kernel.

Sources: llama.cpp src/models/kimi-linear.cpp (the is_recr branch: causal_conv1d per q/k/v + ggml_silu, g1 =
softplus(f_b(f_a(x)) + dt_b) * A, beta = sigmoid, build_gdn_l2_norm of q and k, build_delta_net with the 4-D g1,
build_norm(o, ssm_o_norm) * sigmoid(g_b(g_a(x)))); the converter conversion/kimi_linear.py (A_log stored as
-exp(A_log), dt_bias renamed ssm_dt.bias, the conv weights reshaped to ggml [K, 1, H*Dh, 1]); HF
modeling_kimi_linear.py KimiLinearDeltaAttention, KimiLinearForgetGate, recurrent_kimi_delta_attention (the
recurrence above, `last_recurrent_state * g_i` with g_i (H, Dk, 1)), chunk_kimi_delta_attention (its WY form),
KimiLinearRMSNormGated (norm, times the weight, times sigmoid(gate)). The l2 norm: HF x / sqrt(sum x^2 + 1e-6)
(deltanet.l2norm's form); llama.cpp x / max(|x|, rms eps): they differ only for |x|^2 near 1e-6; minfer takes HF's.

The state a sequence keeps (the cache's recurrent_state(layer)), float32, deltanet.py's layout: a conv ring
(K, 3*H*Dh) of the q|k|v rows (position p at slot p % K; mamba2.causal_conv) and a ring of two states
(2, H, Dh, Dh), the state after position p at slot p % 2 (a repeated step reads what it read before). The
batch engine's state slots (runtime/paged_state.py BatchState: the same rings per slot, zeroed when a sequence
takes one) are taken as deltanet.py takes them: the decode rows gathered by slot and stepped in one set of batched
ops (_decode_rows), each prefill chunk by conv_scan on its slot's rings (kimi_linear.py: why its paged_kv is off).

Every device runs the torch ops here: the prefill by the chunked form (scan_chunked, CHUNK positions at a time),
a decode row by scan_sequential. On CUDA both are counted (`kda.conv.torch`, `kda.scan.torch`): deltanet.py's
Triton step kernel (ops/cuda/deltanet_step.py) decays each head's state by ONE scalar and cannot take KDA's
per-channel decay.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.errors import MinferError
from minfer.models import deltanet
from minfer.models.deltanet import l2norm
from minfer.models.mamba2 import _initial_state, _store_state, causal_conv, read_ssm_keys
from minfer.weights import QWeight, load_qweight, load_vector

CHUNK = 64      # positions per chunk of the prefill's scan (HF chunk_kimi_delta_attention: chunk_size 64)


@dataclass(frozen=True)
class KdaDims:
    n_heads: int     # H   attention.head_count
    head_dim: int    # Dh  kda.head_dim (keys and values alike)
    d_conv: int      # K   ssm.conv_kernel

    @property
    def inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return 3 * self.inner

    def state_shapes(self) -> tuple:
        """One layer's per-sequence state: the conv ring (K, 3*H*Dh), the state ring (2, H, Dh, Dh)."""
        return ((self.d_conv, self.conv_dim), (2, self.n_heads, self.head_dim, self.head_dim))


@dataclass
class KdaWeights:
    attn_q: QWeight                # (H*Dh, D)
    attn_k: QWeight
    attn_v: QWeight
    conv_w: torch.Tensor           # (K, 3*H*Dh) float32: q's channels, k's, v's; tap k on position p - K + 1 + k
    f_a: QWeight                   # (Dh, D)
    f_b: QWeight                   # (H*Dh, Dh)
    dt_bias: torch.Tensor          # (H*Dh,)
    A: torch.Tensor                # (H,) < 0
    beta: QWeight                  # (H, D)
    g_a: QWeight                   # (Dh, D)
    g_b: QWeight                   # (H*Dh, Dh)
    norm: torch.Tensor             # (Dh,)
    out: QWeight                   # (D, H*Dh)
    conv_b = None                  # no conv bias (mamba2.causal_conv reads it)

    def matrices(self) -> list[QWeight]:
        return [self.attn_q, self.attn_k, self.attn_v, self.f_a, self.f_b, self.beta, self.g_a, self.g_b, self.out]


def read_dims(gf, arch: str, n_heads: int) -> KdaDims:
    """ssm.conv_kernel and kda.head_dim (llama.cpp kimi-linear.cpp load_arch_hparams reads both as required)."""
    d_conv = read_ssm_keys(gf, arch, (("d_conv", "conv_kernel"),), "KDA")["d_conv"]
    key = f"{arch}.kda.head_dim"
    if key not in gf.metadata:
        raise MinferError(f"{gf.path}: metadata key '{key}' is missing (needed to build the {arch} model's KDA layers)")
    Dh = gf.metadata[key]
    if not isinstance(Dh, int) or isinstance(Dh, bool) or Dh <= 0:
        raise MinferError(f"{gf.path}: metadata key '{key}' = {Dh!r}: expected a positive integer")
    if d_conv < 2:
        raise MinferError(f"{gf.path}: metadata key '{arch}.ssm.conv_kernel' = {d_conv}: expected at least 2")
    return KdaDims(n_heads=n_heads, head_dim=Dh, d_conv=d_conv)


def load_kda(gf, i: int, d: KdaDims, d_model: int, device, dtype) -> KdaWeights:
    """blk.i's KDA tensors, each shape checked by name (kimi-linear.cpp load_arch_tensors, the is_recr branch)."""
    p, H, Dh, K, N = f"blk.{i}.", d.n_heads, d.head_dim, d.d_conv, d.inner

    def w(name, shape):
        return load_qweight(gf, p + name + ".weight", device, shape, dtype=dtype)

    if p + "attn_qkv.weight" in gf.tensors:
        raise MinferError(f"{gf.path}: tensor '{p}attn_qkv.weight': a fused q/k/v projection on a KDA layer is not "
                          "supported (llama.cpp's converter writes attn_q, attn_k, attn_v)")
    convs = []
    for x in "qkv":
        name = f"{p}ssm_conv1d_{x}.weight"
        info = gf.tensor(name)                     # ggml [K, 1, H*Dh, 1] (or [K, 1, H*Dh]): K fastest
        if info.n_elements != N * K or tuple(s for s in info.shape if s != 1) != (N, K):
            raise MinferError(f"{gf.path}: tensor '{name}' has shape {tuple(info.shape)}, expected {N} channels of "
                              f"{K} taps (ggml [{K}, 1, {N}, 1]: kda.head_dim * head_count, ssm.conv_kernel)")
        convs.append(load_vector(gf, name, device, N * K).view(N, K))
    if any(f"{p}ssm_conv1d_{x}.bias" in gf.tensors for x in "qkv"):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_conv1d_q.bias' (or k/v): KDA's short convs have no bias")
    A = load_vector(gf, p + "ssm_a", device, H)
    if not bool((A < 0).all()):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_a' has values >= 0: expected -exp(A_log) < 0, which "
                          "llama.cpp's converter stores (conversion/kimi_linear.py)")
    return KdaWeights(attn_q=w("attn_q", (N, d_model)), attn_k=w("attn_k", (N, d_model)),
                      attn_v=w("attn_v", (N, d_model)), conv_w=torch.cat(convs).t().contiguous(),
                      f_a=w("ssm_f_a", (Dh, d_model)), f_b=w("ssm_f_b", (N, Dh)),
                      dt_bias=load_vector(gf, p + "ssm_dt.bias", device, N), A=A,
                      beta=w("ssm_beta", (H, d_model)), g_a=w("ssm_g_a", (Dh, d_model)), g_b=w("ssm_g_b", (N, Dh)),
                      norm=load_vector(gf, p + "ssm_norm.weight", device, Dh),
                      out=w("attn_output", (d_model, N)))


def scan_sequential(q, k, v, g, beta, ring: torch.Tensor, positions: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """The KDA recurrence one position at a time (HF recurrent_kimi_delta_attention): q, k, v, g (T, H, Dh)
    (q, k normed, q scaled; g <= 0 per key channel), beta (T, H), float32 -> o (T, H, Dh); the ring updated.
    masked=False: the state before position 0 read from the ring as it is (the batch engine's zeroed slot).
    deltanet.scan_sequential's steps, which take the decay per key channel (row c of S decays by exp(g[c]))."""
    return deltanet.scan_sequential(q, k, v, g, beta, ring, positions, masked)


def scan_chunked(q, k, v, g, beta, ring: torch.Tensor, positions: torch.Tensor, chunk: int = CHUNK,
                 masked: bool = True) -> torch.Tensor:
    """The same recurrence `chunk` positions at a time. With c_t = g_1 + ... + g_t (per key channel) inside a
    chunk, S_0 the carried state and E_ts = exp(c_t - c_s) (a vector over the key channels, s <= t), the values
    written u_s = beta_s (v_s - (decayed S before s)^T k_s) solve
        (I + A) U = beta V - beta (exp(c) * K) S_0,   A_sr = beta_s sum_c k_s[c] k_r[c] E_sr[c], r < s
    (unit lower-triangular: torch.linalg.solve_triangular), then
        o_t = (exp(c_t) * q_t) S_0 + sum_{s<=t} (sum_c q_t[c] k_s[c] E_ts[c]) u_s
        S_L = exp(c_L) * S_0 + sum_s (exp(c_L - c_s) * k_s) u_s^T
    (HF chunk_kimi_delta_attention's form: its decay_mask is E; exp of non-positive numbers only). Shapes as
    masked as scan_sequential's."""
    s = _initial_state(ring, positions, masked)                                       # (H, Dk, Dv)
    outs = []
    for c0 in range(0, q.shape[0], chunk):
        qc, kc, vc, gc = (t[c0:c0 + chunk].transpose(0, 1) for t in (q, k, v, g))   # (H, L, .)
        bc = beta[c0:c0 + chunk].t()                                            # (H, L)
        L = qc.shape[1]
        cum = gc.cumsum(1)                                                      # (H, L, Dk)
        low = torch.ones(L, L, dtype=torch.bool, device=q.device).tril()
        diff = cum.unsqueeze(2) - cum.unsqueeze(1)                              # (H, t, s, Dk): c_t - c_s
        E = torch.exp(diff.masked_fill(~low.unsqueeze(-1), float("-inf")))     # 0 for s > t
        strict = torch.ones(L, L, dtype=torch.bool, device=q.device).tril(-1)
        A = bc.unsqueeze(-1) * (kc.unsqueeze(2) * kc.unsqueeze(1) * E).sum(-1)  # (H, s, r)
        A = A.masked_fill(~strict, 0.0)
        eye = torch.eye(L, dtype=q.dtype, device=q.device)
        ec = torch.exp(cum)
        rhs = bc.unsqueeze(-1) * (vc - (ec * kc) @ s)                           # (H, L, Dv)
        u = torch.linalg.solve_triangular(eye + A, rhs, upper=False, unitriangular=True)
        qk = (qc.unsqueeze(2) * kc.unsqueeze(1) * E).sum(-1)                    # (H, t, s), 0 for s > t
        o = (ec * qc) @ s + qk @ u
        s = ec[:, -1].unsqueeze(-1) * s + (kc * torch.exp(cum[:, -1:] - cum)).transpose(1, 2) @ u
        outs.append(o.transpose(0, 1))
    _store_state(ring, s, positions)
    return torch.cat(outs)


def kda_mixer(h: torch.Tensor, w: KdaWeights, d: KdaDims, state, positions: torch.Tensor, eps: float,
              ctx) -> torch.Tensor:
    """The KDA layer of the normed input h (T, D) at the consecutive `positions` -> (T, D) in h's dtype; state:
    (conv ring, state ring) from the cache, updated in place, or the batch engine's slots of several sequences
    (runtime/paged_state.py BatchState: the decode rows in batched ops, each prefill chunk on its slot's rings)."""
    T, H, Dh = h.shape[0], d.n_heads, d.head_dim
    if ops._backend(h) is not ops.reference:
        ops.paths.count("kda.conv.torch")
        ops.paths.count("kda.scan.torch")
    qkv = torch.cat([ops.linear(h, m, None, ctx).float() for m in (w.attn_q, w.attn_k, w.attn_v)], -1)
    f = ops.linear(ops.linear(h, w.f_a, None, ctx), w.f_b, None, ctx).float()
    g = F.softplus(f + w.dt_bias).view(T, H, Dh) * w.A.view(1, H, 1)          # (T, H, Dh) <= 0
    beta = torch.sigmoid(ops.linear(h, w.beta, None, ctx).float())             # (T, H)
    gate = ops.linear(ops.linear(h, w.g_a, None, ctx), w.g_b, None, ctx).float().view(T, H, Dh)
    if isinstance(state, tuple):
        o = conv_scan(qkv, g, beta, w, d, state, positions)
    elif hasattr(state, "chunks") and hasattr(state, "decode_slots"):
        nd, os = state.n_decode, []
        if nd:
            os.append(_decode_rows(qkv[:nd], g[:nd], beta[:nd], w, d, state.conv, state.ssm, state.decode_slots,
                                   positions[:nd]))
        for q0, n, slot in state.chunks:
            os.append(conv_scan(qkv[q0:q0 + n], g[q0:q0 + n], beta[q0:q0 + n], w, d,
                                (state.conv[slot], state.ssm[slot]), positions[q0:q0 + n], masked=False))
        o = os[0] if len(os) == 1 else torch.cat(os)
    else:
        raise MinferError(f"kimi-linear: the KDA layers keep their state in a KVCache or the batch engine's state "
                          f"slots (BatchState); got {type(state).__name__}")
    o = gated_norm(o, gate, w.norm, eps)
    return ops.linear(o.reshape(T, H * Dh).to(h.dtype), w.out, None, ctx)


def _heads(x: torch.Tensor, d: KdaDims) -> tuple:
    """The convs' output (T, 3*H*Dh) -> q (normed, scaled), k (normed), v, each (T, H, Dh)."""
    T, H, Dh = x.shape[0], d.n_heads, d.head_dim
    q, k, v = (t.reshape(T, H, Dh) for t in x.split(d.inner, dim=-1))
    return l2norm(q) * Dh ** -0.5, l2norm(k), v


def conv_scan(qkv, g, beta, w: KdaWeights, d: KdaDims, state: tuple, positions: torch.Tensor,
              masked: bool = True) -> torch.Tensor:
    """One sequence's convs and KDA recurrence at the consecutive `positions`: qkv (T, 3*H*Dh), g (T, H, Dh),
    beta (T, H) float32, state its (conv ring, state ring), updated -> o (T, H, Dh)."""
    conv_ring, s_ring = state
    q, k, v = _heads(causal_conv(qkv, w, conv_ring, positions, masked=masked), d)
    scan = scan_sequential if qkv.shape[0] == 1 else scan_chunked
    return scan(q, k, v, g, beta, s_ring, positions, masked=masked)


def _decode_rows(qkv, g, beta, w: KdaWeights, d: KdaDims, conv, ssm, slots, positions) -> torch.Tensor:
    """One token per row b at positions[b] of the sequence in slots[b] (the batch engine's decode rows; deltanet.py
    _decode_rows' layout with the per-channel decay): the convs read the slot's ring rows of positions p-K+1 ..
    p-1 and write row p % K; the recurrence reads the state after p - 1 (ring slot (p - 1) % 2) and writes the
    state after p at p % 2. Device indices only (a CUDA graph's decode step). -> o (B, H, Dh)."""
    K = conv.shape[1]
    prev_idx = (positions.unsqueeze(1) + torch.arange(1 - K, 0, device=positions.device)).remainder(K)
    prev = conv[slots.unsqueeze(1), prev_idx]                                 # (B, K-1, W)
    conv[slots, positions.remainder(K)] = qkv                                 # read before written
    seq = torch.cat([prev, qkv.unsqueeze(1)], 1)                               # (B, K, W)
    q, k, v = _heads(F.silu((seq * w.conv_w).sum(1)), d)                      # tap K-1 on the current row
    R = ssm.shape[1]
    s = ssm[slots, (positions - 1).remainder(R)] * torch.exp(g).unsqueeze(-1)   # (B, H, Dk, Dv), row c by g[c]
    delta = (v - torch.einsum("bhkv,bhk->bhv", s, k)) * beta.unsqueeze(-1)    # beta (v - S^T k)
    s = s + k.unsqueeze(-1) * delta.unsqueeze(2)                               # S += k delta^T
    ssm[slots, positions.remainder(R)] = s
    return torch.einsum("bhkv,bhk->bhv", s, q)                                 # S^T q


def gated_norm(o: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * RMSNorm(o) * sigmoid(gate) per head: o, gate (T, H, Dh) float32 (HF KimiLinearRMSNormGated,
    activation "sigmoid"; kimi-linear.cpp build_norm then ggml_sigmoid(g2): not deltanet.py's silu)."""
    return o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + eps) * weight * torch.sigmoid(gate)
