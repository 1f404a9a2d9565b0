"""Mamba-1 language models (HF MambaForCausalLM: state-spaces/mamba-*-hf; FalconMambaForCausalLM:
tiiuae/falcon-mamba-7b): the GGUF arch `mamba`.

    x_0 = E[tokens]                                        token_embd (V, D); output (V, D), or tied
    for each layer l:
        x = x + mixer(RMSNorm(x; attn_norm))
    logits = W_out RMSNorm(x; output_norm)

    mixer(h):
    [x; z] = W_in h                                        ssm_in (2*di, D)
    x_p = silu(b + sum_k w[k] * x_{p-K+1+k})               ssm_conv1d.weight (di, K), .bias (di,); x_j = 0, j < 0
    [dt; B; C] = W_x x_p                                   ssm_x (R + 2N, di): dt (R,), B, C (N,)
    (dt, B, C = rms(dt), rms(B), rms(C) when ssm.dt_b_c_rms: Falcon-Mamba, weightless)
    (dt, B, C = rms(dt) w_dt, rms(B) w_B, rms(C) w_C with the weights set: jamba's ssm_{dt,b,c}_norm, models/jamba.py)
    dt_p = softplus(W_dt dt + dt_b)                        ssm_dt.weight (di, R), .bias (di,)
    S_p = exp(dt_p A) * S_{p-1} + (dt_p x_p) B_p^T         per channel c: S (di, N), A = ssm_a (di, N) < 0
    y_p = S_p C_p + D * x_p                                ssm_d (di,)
    out = W_out (y * silu(z))                              ssm_out (D, di)

with di = ssm.inner_size, N = ssm.state_size, R = ssm.time_step_rank, K = ssm.conv_kernel. Each rule and its
source (llama.cpp src/models/mamba.cpp load_arch_hparams / load_arch_tensors / graph and
src/models/mamba-base.cpp build_mamba_layer; conversion/mamba.py MambaModel; HF models/mamba/modeling_mamba.py
MambaMixer.slow_forward, models/falcon_mamba/modeling_falcon_mamba.py):
- Every layer is the mixer alone after its RMSNorm, then the residual add (graph: build_norm(attn_norm),
  build_mamba_layer, ggml_add(cur, inpL); HF MambaBlock). Then output_norm and the head (output, or the
  embedding when the file has none: TENSOR_NOT_REQUIRED / TENSOR_DUPLICATED).
- ssm.conv_kernel, inner_size, state_size, time_step_rank required (get_key without default); the inner
  size must be 2 * D (load_arch_tensors throws "only an expansion factor of 2 is supported"); every tensor
  required, the conv bias and dt bias included (flag 0).
- The in-projection's order x then z (build_mamba_layer's views of xz); x_proj's order dt, B, C (views at
  0, dt_rank, dt_rank + d_state); HF: `hidden_states, gate = projected_states.chunk(2)`,
  `torch.split(ssm_parameters, [time_step_rank, ssm_state_size, ssm_state_size])`.
- The conv: ggml_ssm_conv over [the K-1 previous rows; this step's], tap K-1 on the current position, then
  the bias and SiLU (HF nn.Conv1d(groups=di, padding=K-1) cut to the sequence, act). The converter
  squeezes (di, 1, K) to (di, K).
- dt_b_c_rms (ssm.dt_b_c_rms, default false; the converter writes true for model_type falcon_mamba):
  weightless RMSNorms of dt, B and C before dt_proj (build_norm(.., NULL, LLM_NORM_RMS): the model's one
  epsilon layer_norm_rms_epsilon; HF FalconMambaWeightlessRMSNorm with mixer_rms_eps).
- The scan: ggml ssm_scan_f32 with head_dim 1, n_head = di: dt = softplus(dt) (threshold 20, as
  torch's), dA = exp(dt * A[c, n]), state = state * dA + B[n] * x[c] * dt, y = sum_n state * C[n];
  A = -exp(A_log) stored by the converter (checked < 0 at load). HF slow_forward: discrete_A =
  exp(A[None, :, None, :] * dt), deltaB_u = dt * B * x.
- D: y + x * D (ggml_add(y, ggml_mul(cur, ssm_d)) with cur the conv's output). The gate: y * silu(z)
  (ggml_swiglu_split(z, y); HF `scan_output * self.act(gate)`), then ssm_out. No norm in the mixer.
- One epsilon (attention.layer_norm_rms_epsilon) for the layer norms, the final norm and dt/B/C's norms.
- The converter writes attention.head_count 0 and feed_forward_length 0: read as no heads (attention_free,
  as mamba2's; metadata_check ATTENTION_FREE).
- The model around the mixer is mamba2_lm.py's (load_mixer_lm, state_cache_config, mixer_lm_forward) with
  this file's read_dims, load_mamba1 and mamba1_mixer: the two models differ in the mixer alone.

The state a sequence keeps (the cache's recurrent_state(layer), as models/mamba2.py's): a conv ring of K
rows of the in-projection's x (float32), position p at slot p % K; an SSM ring of 2 states (di, N), the
state after p at slot p % 2, read at (p0 - 1) % 2 (zero at p0 = 0). Device positions only (a CUDA graph's
decode step runs it; a repeated step reads what it read). The batch engine (runtime/paged_state.py): the
same rings per state slot, decode rows gathered / stepped / scattered by slot, prefill chunks on their
slot's rings unmasked (a slot is zeroed when a sequence takes it). recurrent: a cached prefix reused only
whole. Prefill rows are torch ops on each device (the scan chunked, CHUNK positions at a time: an
(L, L, di, N) masked decay per chunk; on CUDA counted as `ssm1.conv.torch` / `ssm1.scan.torch`). On CUDA the
decode rows take ops/cuda/ssm1_step.py's two kernels (`ssm1.conv.triton`: the conv ring and conv;
`ssm1.scan.triton`: dt's softplus, B's and C's norms, the state rings, D and the gate), with the x and dt
projections between them (Switches.recurrent_step_kernels off: the torch ops for every row, as before).
scan_sequential is the plain recurrence, the tests' reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minfer import ops
from minfer.config import ModelConfig
from minfer.errors import MinferError
from minfer.models.base import Step
from minfer.models.granitehybrid import HybridCacheConfig
from minfer.models.llama import LlamaModel
from minfer.models.mamba2 import read_ssm_keys, recurrent_state
from minfer.models.mamba2_lm import load_mixer_lm, mixer_lm_forward, state_cache_config
from minfer.weights import QWeight, load_dense, load_qweight, load_vector

CHUNK = 16      # positions per chunk of the prefill's scan: (CHUNK, CHUNK, di, N) float32 per chunk


@dataclass(frozen=True)
class Mamba1Dims:
    d_conv: int      # K  ssm.conv_kernel
    d_inner: int     # di ssm.inner_size
    d_state: int     # N  ssm.state_size
    dt_rank: int     # R  ssm.time_step_rank
    dt_b_c_rms: bool = False

    def state_shapes(self) -> tuple:
        """One layer's per-sequence state: the conv ring (K, di), the SSM ring (2, di, N)."""
        return ((self.d_conv, self.d_inner), (2, self.d_inner, self.d_state))


@dataclass
class Mamba1Weights:
    ssm_in: QWeight          # (2 di, D)
    conv_w: torch.Tensor     # (K, di) float32: tap k on position p - K + 1 + k
    conv_b: torch.Tensor     # (di,)
    ssm_x: QWeight           # (R + 2N, di)
    ssm_dt: QWeight          # (di, R)
    dt_b: torch.Tensor       # (di,)
    A: torch.Tensor          # (di, N), negative
    D: torch.Tensor          # (di,)
    ssm_out: QWeight         # (D, di)
    dt_norm: torch.Tensor | None = None   # (R,) jamba's weighted dt/B/C RMSNorms (models/jamba.py); None: none
    b_norm: torch.Tensor | None = None    # (N,)
    c_norm: torch.Tensor | None = None    # (N,)


def read_dims(gf, arch: str, d_model: int) -> Mamba1Dims:
    """The ssm.* keys (mamba.cpp load_arch_hparams), each required, and the expansion of 2."""
    v = read_ssm_keys(gf, arch, (("d_conv", "conv_kernel"), ("d_inner", "inner_size"), ("d_state", "state_size"),
                                 ("dt_rank", "time_step_rank")), "Mamba")
    rms = gf.metadata.get(f"{arch}.ssm.dt_b_c_rms", False)
    if not isinstance(rms, bool):
        raise MinferError(f"{gf.path}: metadata key '{arch}.ssm.dt_b_c_rms' = {rms!r}: expected a bool")
    d = Mamba1Dims(**v, dt_b_c_rms=rms)
    if d.d_conv < 2:
        raise MinferError(f"{gf.path}: metadata key '{arch}.ssm.conv_kernel' = {d.d_conv}: expected at least 2")
    if d.d_inner != 2 * d_model:
        raise MinferError(f"{gf.path}: {arch}.ssm.inner_size={d.d_inner} is not twice embedding_length={d_model} "
                          "(llama.cpp loads an expansion factor of 2 only)")
    return d


def load_mamba1(gf, i: int, d: Mamba1Dims, d_model: int, device, dtype) -> Mamba1Weights:
    """blk.i's mixer tensors, each required and shape checked by name (load_arch_tensors' shapes)."""
    p = f"blk.{i}."
    di, N, R, K = d.d_inner, d.d_state, d.dt_rank, d.d_conv
    for name in ("ssm_conv1d.weight", "ssm_conv1d.bias", "ssm_dt.bias", "ssm_a", "ssm_d"):
        if p + name not in gf.tensors:
            raise MinferError(f"{gf.path}: tensor '{p}{name}' is missing (required for {gf.architecture})")
    for name, shape in (("ssm_conv1d.weight", (di, K)), ("ssm_a", (di, N))):
        if tuple(gf.tensor(p + name).shape) != shape:
            raise MinferError(f"{gf.path}: tensor '{p}{name}' has shape {tuple(gf.tensor(p + name).shape)}, "
                              f"expected {shape}")
    A = load_dense(gf, p + "ssm_a").reshape(di, N).to(device)
    if not bool((A < 0).all()):
        raise MinferError(f"{gf.path}: tensor '{p}ssm_a' has values >= 0: expected A = -exp(A_log) < 0, which "
                          "llama.cpp's converter stores (a file holding A_log itself is not supported)")
    return Mamba1Weights(
        ssm_in=load_qweight(gf, p + "ssm_in.weight", device, (2 * di, d_model), dtype=dtype),
        conv_w=load_dense(gf, p + "ssm_conv1d.weight").reshape(di, K).t().contiguous().to(device),
        conv_b=load_vector(gf, p + "ssm_conv1d.bias", device, di),
        ssm_x=load_qweight(gf, p + "ssm_x.weight", device, (R + 2 * N, di), dtype=dtype),
        ssm_dt=load_qweight(gf, p + "ssm_dt.weight", device, (di, R), dtype=dtype),
        dt_b=load_vector(gf, p + "ssm_dt.bias", device, di), A=A,
        D=load_vector(gf, p + "ssm_d", device, di),
        ssm_out=load_qweight(gf, p + "ssm_out.weight", device, (d_model, di), dtype=dtype))


# ---- the conv ----

def conv_seq(x: torch.Tensor, w: Mamba1Weights, ring: torch.Tensor, positions: torch.Tensor,
             masked: bool = True) -> torch.Tensor:
    """silu(conv(x) + b) of one sequence's rows x (T, di) float32 at consecutive `positions`, the K-1 rows
    before them read from the ring (zeros before position 0 when masked), the last min(T, K) written."""
    T = x.shape[0]
    K, R = w.conv_w.shape[0], ring.shape[0]
    prev_pos = positions[:1] + torch.arange(1 - K, 0, device=positions.device)              # (K-1,)
    prev = ring.index_select(0, prev_pos.remainder(R))
    if masked:
        prev = prev * (prev_pos >= 0).unsqueeze(-1).to(ring.dtype)
    m = min(T, R)                                            # read before written: the slots may coincide
    ring.index_copy_(0, positions[T - m:].remainder(R), x[T - m:])
    seq = torch.cat([prev, x], 0)                                                           # (K-1+T, di)
    return F.silu((seq.unfold(0, K, 1) * w.conv_w.t()).sum(-1) + w.conv_b)


def conv_rows(x: torch.Tensor, w: Mamba1Weights, conv: torch.Tensor, slots: torch.Tensor,
              positions: torch.Tensor) -> torch.Tensor:
    """One token per row b of the sequence in slots[b] at positions[b]: conv (S, K, di) the slots' rings."""
    K = conv.shape[1]
    prev_idx = (positions.unsqueeze(1) + torch.arange(1 - K, 0, device=positions.device)).remainder(K)
    prev = conv[slots.unsqueeze(1), prev_idx]                                               # (B, K-1, di)
    conv[slots, positions.remainder(K)] = x                                                 # read before written
    seq = torch.cat([prev, x.unsqueeze(1)], 1)                                              # (B, K, di)
    return F.silu((seq * w.conv_w).sum(1) + w.conv_b)


# ---- the scan ----

def _initial_state(ring: torch.Tensor, positions: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """The state after p0 - 1 (ring slot (p0 - 1) % 2), zero at p0 = 0 when masked: (di, N)."""
    p0 = positions[:1]
    s = ring.index_select(0, (p0 - 1).remainder(ring.shape[0]))[0]
    return s * (p0 > 0).to(s.dtype) if masked else s


def _store_state(ring: torch.Tensor, s: torch.Tensor, positions: torch.Tensor) -> None:
    ring.index_copy_(0, positions[-1:].remainder(ring.shape[0]), s.unsqueeze(0))


def scan_sequential(x, dt, B, C, A, ring: torch.Tensor, positions: torch.Tensor, masked: bool = True) -> torch.Tensor:
    """The recurrence one position at a time: x, dt (T, di) (dt after softplus), B, C (T, N), A (di, N)
    -> y = S C (T, di), without D; the ring updated."""
    s = _initial_state(ring, positions, masked)
    ys = []
    for t in range(x.shape[0]):
        s = s * torch.exp(dt[t].unsqueeze(-1) * A) + (dt[t] * x[t]).unsqueeze(-1) * B[t]
        ys.append(s @ C[t])
    _store_state(ring, s, positions)
    return torch.stack(ys)


def scan_chunked(x, dt, B, C, A, ring: torch.Tensor, positions: torch.Tensor, masked: bool = True,
                 chunk: int = CHUNK) -> torch.Tensor:
    """scan_sequential `chunk` positions at a time: with a_t = dt_t A (di, N) and c_t = a_1 + .. + a_t,
        S_t = exp(c_t) S_0 + sum_{s<=t} exp(c_t - c_s) (dt_s x_s) B_s^T
    (exp of non-positive numbers only: A < 0, dt > 0)."""
    s = _initial_state(ring, positions, masked)                                             # (di, N)
    ys = []
    for c0 in range(0, x.shape[0], chunk):
        xc, dtc, Bc, Cc = x[c0:c0 + chunk], dt[c0:c0 + chunk], B[c0:c0 + chunk], C[c0:c0 + chunk]
        L = xc.shape[0]
        cum = (dtc.unsqueeze(-1) * A).cumsum(0)                                             # (L, di, N)
        causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril().view(L, L, 1, 1)
        decay = torch.exp((cum.unsqueeze(1) - cum.unsqueeze(0)).masked_fill(~causal, float("-inf")))
        u = (dtc * xc).unsqueeze(-1) * Bc.unsqueeze(1)                                     # (L, di, N)
        states = torch.einsum("tsdn,sdn->tdn", decay, u) + torch.exp(cum) * s               # (L, di, N)
        ys.append(torch.einsum("tdn,tn->td", states, Cc))
        s = states[-1]
    _store_state(ring, s, positions)
    return torch.cat(ys)


def scan_rows(x, dt, B, C, A, ssm: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """One step per row b on slot slots[b]'s ring (S, 2, di, N): reads (p - 1) % 2, writes p % 2."""
    s = ssm[slots, (positions - 1).remainder(ssm.shape[1])]                                 # (B, di, N)
    s = s * torch.exp(dt.unsqueeze(-1) * A) + (dt * x).unsqueeze(-1) * B.unsqueeze(1)
    ssm[slots, positions.remainder(ssm.shape[1])] = s
    return (s * C.unsqueeze(1)).sum(-1)


def _rms(t: torch.Tensor, eps: float) -> torch.Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)


def mamba1_mixer(h: torch.Tensor, w: Mamba1Weights, d: Mamba1Dims, state, positions: torch.Tensor,
                 eps: float, ctx) -> torch.Tensor:
    """The mixer of the normed input h (T, D) at `positions` -> (T, D) in h's dtype. state: the layer's
    (conv ring, ssm ring) of one sequence (updated in place), or the batch engine's BatchState (decode
    rows [0, n_decode) on state.decode_slots, then each prefill chunk (q0, n, slot) on its slot's rings)."""
    T, di = h.shape[0], d.d_inner
    be = ops._backend(h)
    if be is not ops.reference:                  # the CUDA backend (or the tests' interpreted one)
        if ctx is None or ctx.switches.recurrent_step_kernels:
            return _mixer_cuda(h, w, d, state, positions, eps, ctx, be)
        ops.paths.count("ssm1.conv.torch")       # Switches.recurrent_step_kernels off: every row by torch ops
        ops.paths.count("ssm1.scan.torch")
    x, z = ops.linear(h, w.ssm_in, None, ctx).float().split([di, di], dim=-1)
    single = isinstance(state, tuple)
    nd = 0 if single else state.n_decode
    pieces = [(0, T, state, True)] if single else [(q0, n, (state.conv[slot], state.ssm[slot]), False)
                                                   for q0, n, slot in state.chunks]
    xc = []
    if nd:
        xc.append(conv_rows(x[:nd], w, state.conv, state.decode_slots, positions[:nd]))
    for q0, n, st, masked in pieces:
        xc.append(conv_seq(x[q0:q0 + n], w, st[0], positions[q0:q0 + n], masked))
    x = xc[0] if len(xc) == 1 else torch.cat(xc)                                            # (T, di)
    dt, B, C = _dt_b_c(ops.linear(x.to(h.dtype), w.ssm_x, None, ctx).float(), w, d, eps)
    dt = F.softplus(ops.linear(dt.to(h.dtype), w.ssm_dt, None, ctx).float() + w.dt_b)       # (T, di)
    ys = []
    if nd:
        ys.append(scan_rows(x[:nd], dt[:nd], B[:nd], C[:nd], w.A, state.ssm, state.decode_slots, positions[:nd]))
    for q0, n, st, masked in pieces:
        sl = slice(q0, q0 + n)
        ys.append(scan_chunked(x[sl], dt[sl], B[sl], C[sl], w.A, st[1], positions[sl], masked))
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    y = (y + x * w.D) * F.silu(z)
    return ops.linear(y.to(h.dtype), w.ssm_out, None, ctx)


def _dt_b_c(xdbc: torch.Tensor, w: Mamba1Weights, d: Mamba1Dims, eps: float) -> tuple:
    """The x projection's rows (T, R + 2N) float32 -> dt, B, C after their norms (module doc)."""
    dt, B, C = xdbc.split([d.dt_rank, d.d_state, d.d_state], dim=-1)
    if w.dt_norm is not None:        # jamba: weighted (mamba-base.cpp build_norm(dt, ssm_dt_norm, ...))
        return _rms(dt, eps) * w.dt_norm, _rms(B, eps) * w.b_norm, _rms(C, eps) * w.c_norm
    if d.dt_b_c_rms:
        return _rms(dt, eps), _rms(B, eps), _rms(C, eps)
    return dt, B, C


def _mixer_cuda(h, w: Mamba1Weights, d: Mamba1Dims, state, positions: torch.Tensor, eps: float, ctx, be):
    """mamba1_mixer on the CUDA backend `be`: the decode rows (a single sequence's one-token step, the batch
    engine's decode rows) through ops/cuda/ssm1_step.py's kernels, the conv (`ssm1.conv.triton`) and the
    state update with dt's softplus, B's and C's norms, D and the z gate (`ssm1.scan.triton`); prefill rows
    through the torch conv and chunked scan (`ssm1.conv.torch`, `ssm1.scan.torch`). The x and dt
    projections are GEMVs between them; dt's norm (when the file asks) stays torch."""
    T, di = h.shape[0], d.d_inner
    xz = ops.linear(h, w.ssm_in, None, ctx)                                                 # (T, 2 di)
    single = isinstance(state, tuple)
    nd = (1 if T == 1 else 0) if single else state.n_decode                                  # host values only
    conv, ssm = state if single else (state.conv, state.ssm)
    slots = None if single else state.decode_slots
    pieces = [] if nd == T else ([(0, T, state, True)] if single else
                                 [(q0, n, (state.conv[slot], state.ssm[slot]), False) for q0, n, slot in state.chunks])
    if pieces:
        ops.paths.count("ssm1.conv.torch")
        ops.paths.count("ssm1.scan.torch")
    x = be.ssm1_conv_step(xz[:nd], w.conv_w, w.conv_b, conv, positions[:nd], slots) if nd else None
    if pieces:
        xf = xz[:, :di].float()
        xp = [conv_seq(xf[q0:q0 + n], w, st[0], positions[q0:q0 + n], masked) for q0, n, st, masked in pieces]
        x = torch.cat(([x] if nd else []) + xp) if nd or len(xp) > 1 else xp[0]
    xdbc = ops.linear(x.to(h.dtype), w.ssm_x, None, ctx).float()
    folded = nd == T                                                   # decode rows only: B/C norms in the kernel
    norm = folded and (w.dt_norm is not None or d.dt_b_c_rms)
    if folded:
        dt, B, C = xdbc.split([d.dt_rank, d.d_state, d.d_state], dim=-1)
        if norm:
            dt = _rms(dt, eps) if w.dt_norm is None else _rms(dt, eps) * w.dt_norm
    else:
        dt, B, C = _dt_b_c(xdbc, w, d, eps)
    dtr = ops.linear(dt.to(h.dtype), w.ssm_dt, None, ctx)                                  # (T, di), no bias yet
    ys = []
    if nd:
        ys.append(be.ssm1_scan_step(x[:nd], dtr[:nd], w.dt_b, B[:nd], C[:nd], w.A, w.D, xz[:nd], ssm,
                                    positions[:nd], slots, h.dtype, norm_eps=eps if norm else None,
                                    b_norm=w.b_norm if norm else None, c_norm=w.c_norm if norm else None))
    for q0, n, st, masked in pieces:
        sl = slice(q0, q0 + n)
        dtp = F.softplus(dtr[sl].float() + w.dt_b)
        y = scan_chunked(x[sl], dtp, B[sl], C[sl], w.A, st[1], positions[sl], masked)
        ys.append(((y + x[sl] * w.D) * F.silu(xz[sl, di:].float())).to(h.dtype))
    y = ys[0] if len(ys) == 1 else torch.cat(ys)
    return ops.linear(y, w.ssm_out, None, ctx)


class Mamba1Model(LlamaModel):
    """blocks: None (no attention or MLP weights); norms[i] each layer's attn_norm, mamba[i] its mixer."""

    arch = "mamba"
    rope_style = "normal"          # llama_model_rope_type: LLM_ARCH_MAMBA -> NONE (unused: no rope)
    attention_free = True          # head_count / feed_forward_length 0 (ModelConfig, metadata_check)
    paged_kv = True                # the batch engine keeps its state in per-sequence slots (runtime/paged_state.py)
    recurrent = True               # the engine reuses a cached prefix only whole

    @classmethod
    def cache_config(cls, gf, cfg: ModelConfig) -> HybridCacheConfig:
        """cfg with no K/V rows and each layer's per-sequence Mamba state (the preflight's config)."""
        return state_cache_config(cfg, read_dims(gf, cfg.arch, cfg.d_model))

    @classmethod
    def from_gguf(cls, gf, cfg: ModelConfig | None = None, device="cpu", dtype=torch.float32,
                  progress: bool = True, act_dtype: torch.dtype = torch.float32) -> "Mamba1Model":
        cfg = cfg or ModelConfig.from_gguf(gf)
        return load_mixer_lm(cls, gf, cfg, read_dims(gf, cfg.arch, cfg.d_model), load_mamba1, device, dtype,
                             act_dtype)

    def qweights(self) -> list[QWeight]:
        ws = [self.token_embd] + [q for mb in self.mamba for q in (mb.ssm_in, mb.ssm_x, mb.ssm_dt, mb.ssm_out)]
        return ws + ([self.output] if self.output is not self.token_embd else [])

    def linear_groups(self) -> list[tuple]:
        return []

    def forward(self, tokens: torch.Tensor, step: Step, cache, ctx=None) -> torch.Tensor:
        """tokens (T,) int64 at step.positions -> logits (R, V) float32 (R: step.logits' rows)."""
        return mixer_lm_forward(self, tokens, step, recurrent_state(cache, self.arch, "Mamba"), mamba1_mixer, ctx)
