"""The CPU reference of every op: plain torch, float32, written for clarity first.

Every CUDA kernel is checked against these functions. Formulas follow ggml's CPU ops
(ggml-cpu/ops.cpp: rms_norm, rope (NORM and NEOX modes), soft_max, swiglu).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ dense (N, K)^T + bias -> (T, N). The CPU QWeight carries its dense matrix."""
    dense = w.dense
    if dense is None:  # a weight kept quantized (e.g. an untied embedding): decode it whole
        dense = w.dequantize_rows(torch.arange(w.shape[0]))
    if dense.dtype != x.dtype:
        return F.linear(x.to(dense.dtype), dense, None if bias is None else bias.to(dense.dtype)).to(x.dtype)
    return F.linear(x, dense, bias)


def embedding(ids: torch.Tensor, w) -> torch.Tensor:
    """ids (T,) -> (T, D) float32 rows of the embedding table."""
    if w.dense is not None:
        return w.dense[ids].float()
    return w.dequantize_rows(ids)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """(T, D): x * rsqrt(mean(x^2) + eps) * weight (ggml_rms_norm followed by ggml_mul)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype):
    """Residual add, then the next RMSNorm: s = x + y (T, D) in the promoted dtype, and
    rms_norm(s) * weight in out_dtype (the next matmul's input). Returns (s, h)."""
    s = x + y
    return s, rms_norm(s, weight, eps).to(out_dtype)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype=None) -> torch.Tensor:
    """(N, D): (x - mean(x)) * rsqrt(var(x) + eps) * weight over the last dim, no bias (ggml_norm
    followed by ggml_mul: llama.cpp build_norm LLM_NORM with a NULL bias; HF CohereLayerNorm), in
    float32, returned in out_dtype (None: x's dtype). weight (D,), or (G, D) with N a multiple of G:
    row r takes weight[r % G] (Command-R+'s q/k norms: rows (T * H) of heads, one weight per head)."""
    xf = x.float()
    c = xf - xf.mean(-1, keepdim=True)
    y = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps)
    if weight.dim() == 2:
        n, d = y.shape
        y = (y.view(n // weight.shape[0], weight.shape[0], d) * weight.float()).view(n, d)
    else:
        y = y * weight.float()
    return y.to(out_dtype or x.dtype)


@functools.lru_cache(maxsize=16)
def inv_freq(cfg) -> torch.Tensor:
    """(n_rot/2,) float64: freq_scale * theta^(-2i/n_rot) / freq_factor_i (ggml rope's theta_scale
    powers, ext_factor 0). The one definition of the rope frequencies: the CUDA kernel reads these
    too. cfg: minfer.config.RopeConfig (hashable). A memo of a constant."""
    i = torch.arange(cfg.n_rot // 2, dtype=torch.float64)
    inv = cfg.freq_scale * cfg.theta ** (-2.0 * i / cfg.n_rot)
    if cfg.freq_factors is not None:
        inv = inv / torch.tensor(cfg.freq_factors, dtype=torch.float64)
    return inv


def rope_cos_sin(positions: torch.Tensor, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of the rotation angles, each (T, n_rot/2) float32."""
    if positions.numel() == 1 and positions.device.type == "cpu":   # a decode step: q and k of every layer
        return _cos_sin_at(int(positions.reshape(())), cfg)
    ang = positions.to(torch.float64)[:, None] * inv_freq(cfg)[None, :]
    return ang.cos().float(), ang.sin().float()


@functools.lru_cache(maxsize=256)
def _cos_sin_at(pos: int, cfg) -> tuple[torch.Tensor, torch.Tensor]:
    """rope_cos_sin of one position, the same arithmetic, computed once per decode step instead of
    twice per layer (48 times on the 0.5B; each ~6 small ops). A memo of a constant: callers only
    read the tensors."""
    ang = torch.tensor([float(pos)], dtype=torch.float64)[:, None] * inv_freq(cfg)[None, :]
    return ang.cos().float(), ang.sin().float()


def rope(x: torch.Tensor, positions: torch.Tensor, cfg) -> torch.Tensor:
    """Rotary embedding of x (T, H, Dh) at positions (T,) -> (T, H, Dh).

    'normal' (ggml NORM, llama): pairs (x[2i], x[2i+1]) rotate by angle_i.
    'neox'   (ggml NEOX, qwen2): pairs (x[i], x[i + n_rot/2]) rotate by angle_i.
    """
    cos, sin = rope_cos_sin(positions, cfg)
    cos, sin = cos[:, None, :], sin[:, None, :]  # (T, 1, n_rot/2)
    T, H, D = x.shape
    xr = x[..., : cfg.n_rot].float()
    if cfg.style == "normal":
        pairs = xr.reshape(T, H, cfg.n_rot // 2, 2)
        a, b = pairs[..., 0], pairs[..., 1]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).reshape(T, H, cfg.n_rot)
    elif cfg.style == "neox":
        a, b = xr[..., : cfg.n_rot // 2], xr[..., cfg.n_rot // 2:]
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        raise ValueError(f"unknown rope style {cfg.style!r}")
    out = out.to(x.dtype)
    if cfg.n_rot < D:
        out = torch.cat((out, x[..., cfg.n_rot:]), dim=-1)
    return out


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """(T, F): silu(gate) * up."""
    return F.silu(gate) * up


def attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start_pos: int,
              window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
              scale: float | None = None, chunk: int = 0, alibi: torch.Tensor | None = None) -> torch.Tensor:
    """Causal attention of q (T, H, Dh) at positions start_pos..start_pos+T-1 over the cached
    keys/values of positions [0, start_pos + T): caches (S, Hkv, Dh), S >= start_pos + T.
    window > 0 (sliding-window layers, gemma3): a query at p sees keys p - window < j <= p.
    softcap > 0 (gemma2): the scaled scores s become softcap * tanh(s / softcap) before the
    mask and softmax (llama.cpp build_attn_mha attn_soft_cap; HF gemma2 eager_attention_forward).
    sinks (H,) (gpt-oss): one more logit per query head in each softmax's denominator, with no
    value: p_j = exp(s_j) / (exp(sink_h) + sum_i exp(s_i)) (ggml_soft_max_add_sinks; HF gpt_oss
    eager_attention_forward concatenates the sink to the scaled scores and drops its column).
    chunk > 0 (llama4's chunked layers): a query at p sees keys p // chunk * chunk <= j <= p
    (llama.cpp is_masked_swa, LLAMA_SWA_TYPE_CHUNKED).
    alibi (H,) float32 (bloom, mpt): each head's ALiBi slope m_h; the scaled score of the query at p
    and the key at j gets - m_h |p - j| added (alibi_bias; llama.cpp's kq_mask -|p0 - p1| times
    ggml_soft_max_ext's slope; HF adds m_h j, the same softmax).

    scale: the scores' factor, default 1/sqrt(Dh) (deepseek2: 1/sqrt(qk_nope + qk_rope) with YaRN's
    mscale^2, not 1/sqrt of its latent key width: llama.cpp build_attn's kq_scale).
    v_cache may be narrower than the keys (S, Hkv, Dv) (deepseek2's latent values: the first Dv
    dims of each key row).

    Grouped-query: query head h reads KV head h // (H / Hkv), as ggml's broadcast does.
    Returns (T, H, Dv).
    """
    T, H, D = q.shape
    S = start_pos + T
    scale = 1.0 / D ** 0.5 if scale is None else float(scale)
    if T == 1 and isinstance(start_pos, int) and alibi is None:
        return decode_attention(q, k_cache, v_cache, S, window, softcap, sinks, scale, chunk)
    k = k_cache[:S].transpose(0, 1)  # (Hkv, S, Dh)
    v = v_cache[:S].transpose(0, 1)
    qh = q.transpose(0, 1)           # (H, T, Dh)
    mask = None
    if T > 1 or window > 0 or chunk > 0:
        # query i (absolute position start_pos + i) sees keys j <= start_pos + i (and in the window / chunk)
        mask = window_mask(start_pos + torch.arange(T), S, window, chunk)   # (T, S)
    if softcap > 0 or sinks is not None or alibi is not None:   # SDPA has no score hook: the scores written out
        bias = None if alibi is None else alibi_bias(alibi, start_pos + torch.arange(T, device=q.device), S)
        return softcapped_attention(qh, k, v, mask, softcap, sinks, scale, bias).transpose(0, 1)
    out = F.scaled_dot_product_attention(qh, k.to(qh.dtype), v.to(qh.dtype), attn_mask=mask,
                                         scale=scale, enable_gqa=k.shape[0] != H)
    return out.transpose(0, 1)  # (T, H, Dh)


def softcapped_attention(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, softcap: float,
                         sinks: torch.Tensor | None = None, scale: float | None = None,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """qh (H, T, Dh) over k (Hkv, S, Dh), v (Hkv, S, Dv) with (T, S) bool mask (None: all visible) ->
    (H, T, Dv): softmax(cap * tanh(q k^T * scale / cap) + bias, masked) v, GQA as ggml broadcasts
    (softcap 0: no cap; scale default 1/sqrt(Dh)); sinks (H,): each head's extra denominator logit
    (attention()); bias (H, T, S): added to the (capped) scores (ALiBi: alibi_bias)."""
    H, T, D = qh.shape
    Hkv = k.shape[0]
    scale = 1.0 / D ** 0.5 if scale is None else scale
    qg = qh.reshape(Hkv, (H // Hkv) * T, D)                        # query heads grouped by KV head
    s = torch.bmm(qg, k.to(qh.dtype).transpose(1, 2)) * scale      # (Hkv, G*T, S)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.view(H, T, -1)
    if bias is not None:
        s = s + bias.to(s.dtype)
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    p = _softmax(s, None if sinks is None else sinks.view(H, 1, 1)).view(Hkv, (H // Hkv) * T, -1)
    return torch.bmm(p, v.to(qh.dtype)).view(H, T, v.shape[-1])


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, S: int,
                     window: int = 0, softcap: float = 0.0, sinks: torch.Tensor | None = None,
                     scale: float | None = None, chunk: int = 0) -> torch.Tensor:
    """One query (1, H, Dh) at position S-1 over keys [0, S) (or the last `window`, or from its chunk's
    start (S - 1) // chunk * chunk): two bmm's.
    The same math as the SDPA call above; on the CPU, SDPA spent ~1.5 ms (2 threads) to ~7 ms
    (1 thread, a busy machine) per call on this 14 x S problem and the bmm pair ~0.07-0.4 ms
    (issue 14; Qwen2.5-0.5B shapes, S=600). Query head h reads KV head h // (H / Hkv)."""
    _, H, D = q.shape
    lo = max(0, S - window) if window > 0 else 0
    if chunk > 0:
        lo = max(lo, (S - 1) // chunk * chunk)
    n = torch.get_num_threads()
    if n > 1 and S - lo <= ONE_THREAD_MAX_KEYS and q.device.type == "cpu":
        # a second thread costs more to wake than it saves here (passive OpenMP waiting: the
        # bmm pair took ~300 us with 2 threads, 40-85 us with 1 at S = 40-600; 1 thread was
        # still faster at 4096 keys, slower at 16384). set_num_threads is process-wide: an op of
        # another Python thread that starts meanwhile also runs on one thread (speed only).
        torch.set_num_threads(1)
        try:
            return _decode_attention(q, k_cache, v_cache, S, lo, softcap, sinks, scale)
        finally:
            torch.set_num_threads(n)
    return _decode_attention(q, k_cache, v_cache, S, lo, softcap, sinks, scale)


ONE_THREAD_MAX_KEYS = 8192   # decode attention over at most this many keys runs on one thread


def _decode_attention(q, k_cache, v_cache, S: int, lo: int, softcap: float = 0.0, sinks=None,
                      scale: float | None = None) -> torch.Tensor:
    _, H, D = q.shape
    scale = 1.0 / D ** 0.5 if scale is None else scale
    k = k_cache[lo:S].transpose(0, 1).to(q.dtype)        # (Hkv, L, Dh)
    v = v_cache[lo:S].transpose(0, 1).to(q.dtype)
    Hkv = k.shape[0]
    qg = q.reshape(Hkv, H // Hkv, D)                     # query heads grouped by their KV head
    s = torch.bmm(qg, k.transpose(1, 2)) * scale                                      # (Hkv, G, L)
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    p = _softmax(s, None if sinks is None else sinks.view(Hkv, H // Hkv, 1))
    return torch.bmm(p, v).reshape(1, H, v.shape[-1])


def _softmax(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last dim of the scores s (..., L); with sinks (broadcast to (..., 1)) one
    more logit per row in the denominator that takes no probability (attention()'s sinks)."""
    if sinks is None:
        return torch.softmax(s, dim=-1)
    z = torch.cat((s, sinks.to(s.dtype).expand(*s.shape[:-1], 1)), dim=-1)
    return torch.softmax(z, dim=-1)[..., :-1]


def alibi_slopes(n_head: int, max_bias: float) -> torch.Tensor:
    """(n_head,) float32: ALiBi's per-head slopes as ggml computes them (ggml-cpu ggml_compute_forward_soft_max:
    n_head_log2 = 2^floor(log2(n_head)), m0 = 2^(-max_bias / n_head_log2), m1 = 2^(-max_bias / 2 / n_head_log2);
    head h < n_head_log2 takes m0^(h + 1), the rest m1^(2 (h - n_head_log2) + 1)). With max_bias 8 these are HF
    bloom's build_alibi_tensor slopes, the extra heads of a head count that is not a power of two included."""
    n_log2 = 1 << (int(n_head).bit_length() - 1)
    m0 = 2.0 ** (-max_bias / n_log2)
    m1 = 2.0 ** (-(max_bias / 2.0) / n_log2)
    return torch.tensor([m0 ** (h + 1) if h < n_log2 else m1 ** (2 * (h - n_log2) + 1) for h in range(n_head)],
                        dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_pos: torch.Tensor, n_keys: int) -> torch.Tensor:
    """(H, T, n_keys) float32: - slopes[h] * |p - j| for the query at position p (q_pos (T,)) and key j
    (llama.cpp llama_kv_cache set_input_kq_mask with use_alibi: -|p0 - p1|, scaled by the head's slope in
    ggml_soft_max_ext)."""
    j = torch.arange(n_keys, device=q_pos.device)
    d = (q_pos[:, None] - j[None, :]).abs().float()                       # (T, S)
    return -slopes.float().to(q_pos.device)[:, None, None] * d[None]


def geglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """(T, F): gelu(gate) * up, GELU's tanh approximation (HF gelu_pytorch_tanh, ggml_gelu)."""
    return F.gelu(gate, approximate="tanh") * up


def window_mask(q_pos: torch.Tensor, n_keys: int, window: int, chunk: int = 0) -> torch.Tensor:
    """(T, n_keys) bool: key j visible to the query at position p when j <= p and, with a
    window W > 0, p - j < W (llama.cpp llama_hparams::is_masked_swa, LLAMA_SWA_TYPE_STANDARD), with
    a chunk C > 0, j // C == p // C (LLAMA_SWA_TYPE_CHUNKED)."""
    j = torch.arange(n_keys, device=q_pos.device)[None, :]
    p = q_pos[:, None]
    mask = j <= p
    if window > 0:
        mask = mask & (p - j < window)
    if chunk > 0:
        mask = mask & (j >= torch.div(p, chunk, rounding_mode="floor") * chunk)
    return mask


def moe_ffn(h: torch.Tensor, router: torch.Tensor, gate_exps, up_exps, down_exps, k: int,
            norm_weights: bool, *, router_bias=None, gating: str = "softmax", gate_bias=None, up_bias=None,
            down_bias=None, act: str = "silu", alpha: float = 1.702, limit: float = 7.0,
            select_bias=None, n_group: int = 1, topk_group: int = 1, weights_scale: float = 1.0,
            router_in=None, down_scale=None) -> torch.Tensor:
    """Mixture of gated experts of the normed input h (T, D) -> (T, D) (llama.cpp build_moe_ffn;
    HF Qwen3MoeSparseMoeBlock, GptOssMLP, Gemma4TextExperts).

    router (E, D) float32; gate_exps/up_exps: QWeights (E*Fe, D), down_exps (E*D, Fe), expert e's
    rows at [e*N, (e+1)*N). Router logits l = router h (+ router_bias (E,)). gating "softmax"
    (qwen3moe): p = softmax(l) over all E experts, the k largest kept, their weights divided by
    their sum when norm_weights. gating "topk_softmax" (gpt-oss): the k largest logits kept, their
    weights the softmax over those k only (norm_weights has nothing left to do). gating "sigmoid"
    (deepseek2 V3, glm4moe): p = sigmoid(l); the experts are chosen on p + select_bias (E,) (the
    file's exp_probs_b) but weighted by p. n_group > 1: the experts form n_group equal groups, each
    scored by the sum of its two largest selection values; only the topk_group best groups stay
    eligible. Weights are then divided by their sum (at least 2^-14) when norm_weights and multiplied by
    weights_scale (llama.cpp build_moe_ffn's order).
    out = sum_k w_k (down_e a + down_bias[e]), a = act(gate_e h + gate_bias[e], up_e h + up_bias[e]),
    biases (E, N) float32 or None; act "silu": silu(g) * u; "swiglu_oai" (gpt-oss):
    g' = min(g, limit), u' = clamp(u, -limit, limit), a = g' sigmoid(alpha g') (u' + 1);
    "geglu" (gemma4): gelu_tanh(g) * u (build_moe_ffn's LLM_FFN_GELU with a gate: ggml_geglu_split);
    "relu2" (nemotron_h_moe): ungated experts, gate_exps None, a = relu(up_e h + up_bias[e])^2
    (build_moe_ffn's LLM_FFN_RELU_SQR without a gate: ggml_relu then ggml_sqr; HF NemotronHExperts).
    gemma4's options: router_in (T, D) the router's own input (the logits are router router_in,
    the experts still read h; gemma4.cpp feeds the router a scaled RMS norm of the residual),
    down_scale (E,) each expert's output times down_scale[e] (build_moe_ffn's down_exps_s, applied
    here to the routing weight: the same product), and up_exps None: gate_exps is the fused
    (E*2Fe, D) gate_up tensor, expert e's Fe gate rows then its Fe up rows (build_moe_ffn's
    gate_up_exps: one product, then the two halves).
    The reference goes expert by expert over the tokens routed to it."""
    T, D = h.shape
    E = router.shape[0]
    w, idx = route(h if router_in is None else router_in, router, k, norm_weights, router_bias, gating, select_bias,
                   n_group, topk_group, weights_scale)
    if down_scale is not None:
        w = w * down_scale.float()[idx]
    ungated = check_gate(gate_exps, act)
    fused = up_exps is None
    first = up_exps if ungated else gate_exps
    Fe = first.shape[0] // E // (2 if fused else 1)
    out = torch.zeros(T, D, dtype=torch.float32, device=h.device)
    packed = first.packed is not None and h.device.type == "cpu"
    threads = _expert_threads(first) if packed else contextlib.nullcontext()
    with threads:
        for e in idx.unique().tolist():
            tok, slot = (idx == e).nonzero(as_tuple=True)                 # tokens routed to e
            x = h[tok]
            if ungated:
                g = u = _expert_mm(up_exps, e, Fe, x)
            elif fused:
                gu = _expert_mm(gate_exps, e, 2 * Fe, x)
                g, u = gu[:, :Fe], gu[:, Fe:]
            else:
                g, u = _expert_mm(gate_exps, e, Fe, x), _expert_mm(up_exps, e, Fe, x)
            a = moe_act(g, u, gate_bias, up_bias, e, act, alpha, limit)
            y = _expert_mm(down_exps, e, D, a).float()                    # (n, D)
            if down_bias is not None:
                y = y + down_bias[e].float()
            out.index_add_(0, tok, y * w[tok, slot, None])
    return out.to(h.dtype)


MOE_GATINGS = ("softmax", "topk_softmax", "sigmoid")
MOE_ACTS = ("silu", "swiglu_oai", "geglu", "relu2", "reglu")   # reglu: relu(g) * u (smallthinker)
UNGATED_ACTS = ("relu2",)      # experts with up and down only (gate_exps None)


def check_gate(gate_exps, act: str) -> bool:
    """True for an ungated act (gate_exps must be None then; the gated acts need one)."""
    if act not in MOE_ACTS:
        raise ValueError(f"moe_ffn: act {act!r} is not one of {MOE_ACTS}")
    ungated = act in UNGATED_ACTS
    if ungated != (gate_exps is None):
        raise ValueError(f"moe_ffn: act {act!r} " + ("takes no gate_exps (ungated experts)" if ungated
                                                      else "needs gate_exps"))
    return ungated


def route(h: torch.Tensor, router: torch.Tensor, k: int, norm_weights: bool, router_bias=None,
          gating: str = "softmax", select_bias=None, n_group: int = 1, topk_group: int = 1,
          weights_scale: float = 1.0):
    """moe_ffn's router: weights (T, k) float32 and expert ids (T, k) int64, on h's device with
    torch ops only (no host value: the CUDA backend calls it too). The rules and their order are
    llama.cpp's build_moe_ffn (src/llama-graph.cpp): gating, selection bias, group mask, top-k,
    weights read from the unbiased probabilities, normalization (sum clamped to the smallest f16
    normal, 6.103515625e-5), then the scale."""
    if gating not in MOE_GATINGS:
        raise ValueError(f"moe_ffn: gating {gating!r} is not one of {MOE_GATINGS}")
    logits = h.float() @ router.float().t()                               # (T, E)
    if router_bias is not None:
        logits = logits + router_bias.float()
    if gating == "topk_softmax":
        top, idx = torch.topk(logits, k, dim=-1)
        return torch.softmax(top, dim=-1), idx
    probs = torch.softmax(logits, dim=-1) if gating == "softmax" else torch.sigmoid(logits)
    sel = probs if select_bias is None else probs + select_bias.float()
    if n_group > 1:
        T, E = sel.shape
        groups = sel.view(T, n_group, E // n_group)
        score = groups.topk(2, dim=-1).values.sum(-1)                     # (T, G): the two best of each group
        keep = torch.zeros_like(score, dtype=torch.bool).scatter_(1, score.topk(topk_group, dim=-1).indices, True)
        sel = groups.masked_fill(~keep[..., None], float("-inf")).view(T, E)
    idx = torch.topk(sel, k, dim=-1).indices
    w = probs.gather(1, idx)
    if norm_weights:
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)
    if weights_scale not in (0.0, 1.0):                                    # llama.cpp: 0 and 1 mean none
        w = w * weights_scale
    return w, idx


def moe_act(g: torch.Tensor, u: torch.Tensor, gate_bias, up_bias, e: int, act: str, alpha: float,
            limit: float) -> torch.Tensor:
    """Expert e's activation of its gate and up outputs (n, Fe), biases added first (float32);
    "relu2" reads u only (ungated: relu(u + up_bias[e])^2)."""
    if act not in MOE_ACTS:
        raise ValueError(f"moe_ffn: act {act!r} is not one of {MOE_ACTS}")
    if act == "relu2":
        if gate_bias is not None:
            raise ValueError("moe_ffn: act 'relu2' (ungated experts) takes no gate_bias")
        u = u.float() if up_bias is None else u.float() + up_bias[e].float()
        return torch.relu(u).square()
    if gate_bias is None and up_bias is None and act == "silu":
        return F.silu(g) * u                                              # qwen3moe's, as it was
    g, u = g.float(), u.float()
    if gate_bias is not None:
        g = g + gate_bias[e].float()
    if up_bias is not None:
        u = u + up_bias[e].float()
    if act == "silu":
        return F.silu(g) * u
    if act == "geglu":
        return geglu(g, u)
    if act == "reglu":                    # build_moe_ffn LLM_FFN_RELU with a gate: ggml_reglu_split
        return torch.relu(g) * u
    return swiglu_oai(g, u, alpha, limit)


def swiglu_oai(gate: torch.Tensor, up: torch.Tensor, alpha: float = 1.702, limit: float = 7.0) -> torch.Tensor:
    """gpt-oss's clamped SwiGLU: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clamp(u, -limit,
    limit) + 1) (ggml_compute_forward_swiglu_oai_f32; HF GptOssExperts._apply_gate)."""
    g = gate.clamp(max=limit)
    return g * torch.sigmoid(alpha * g) * (up.clamp(-limit, limit) + 1)


def _expert_mm(w, e: int, n: int, x: torch.Tensor) -> torch.Tensor:
    """x (T, K) @ expert e's rows^T -> (T, n): on the CPU fast path the kernel of its packed
    form (ops/cpu_experts.py, float32 out), else the float rows of _expert in their dtype."""
    if w.packed is not None and x.device.type == "cpu":
        return w.packed.linear(e, x.float())
    r = _expert(w, e, n)
    return F.linear(x.to(r.dtype), r)


def _expert_threads(w):
    """The thread count for packed experts' kernels (cpu_quant.linear's rule: a matrix of at
    most ONE_THREAD_MAX_WEIGHTS runs on one thread), set once around the expert loop."""
    from minfer.ops import cpu_experts

    return cpu_experts.threads_for(w.packed)


def _expert(w, e: int, n: int) -> torch.Tensor:
    """Expert e's (n, K) float rows of a stacked expert QWeight: from its dense matrix, or decoded
    from the raw blocks when the loader kept none."""
    if w.dense is not None:
        return w.dense[e * n:(e + 1) * n]
    return w.dequantize_rows(torch.arange(e * n, (e + 1) * n))
