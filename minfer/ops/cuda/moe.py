"""Mixture-of-experts FFN on CUDA (qwen3moe): router, top-k, and the experts' SwiGLU, with no
Python loop over experts and no host value (a decode step stays CUDA-graph capturable).

Expert weights are one QWeight per stacked tensor: raw blocks (E*N, row_bytes), expert e's rows
at [e*N, (e+1)*N) (minfer/models/qwen3moe.py load_experts). The reference is
minfer.ops.reference.moe_ffn (expert by expert, float32).

- Few rows (T*k <= gather_max) over experts repacked at load (gemv_repack_layout.repack_model),
  Switches.gemv_q8: the rows in int8 (one row: the form its producer attached; more: quantized
  here), the selected experts' rows multiplied where they lie
  by the int8 GEMV (gemv_q8_experts.gemv_q8_experts: one launch per stacked weight, the expert ids read
  on the device), SwiGLU + per-row int8 in one launch, the down projection per slot, then the
  weighted sum: only the active experts' bytes are read.                    path moe.gather.q8
- Few rows (T*k <= gather_max) over raw blocks: expert gather. The T*k selected experts' rows are
  decoded from their raw blocks by the dequant kernel's row-index gather (the indices stay on
  the device), into (T*k, N, K) in the activation dtype, then one batched matmul per weight.
  Only the active experts' blocks are read; the decoded copy costs about 2 bytes a weight
  written and read again (3.6x the Q4_K bytes). A fused gather-GEMV on the raw blocks would
  read only the blocks: not written yet.                                   path moe.gather
- Many rows (prefill): grouped. The (token, slot) pairs are sorted by expert; every expert of
  the layer is decoded once into a scratch (E, N, K) and torch._grouped_mm multiplies each
  expert's contiguous run of rows by its matrix (cuBLAS grouped GEMM, bf16, sm90+; offsets
  on the device).                                                          path moe.grouped
  Where torch._grouped_mm is missing or refuses (older torch, fp32 activations, other GPUs),
  a padded batched matmul over the experts takes its place (each expert's rows padded to the
  largest count, on the device: no host sync either).              fallback moe.grouped (bmm)

Options (gpt-oss; ops.moe_ffn): a router bias and gating "topk_softmax" (the k largest logits,
softmax over those k: reference.route, torch ops on the device), per-expert biases on gate / up
(added in the activation launch, moe_act.py, the expert of each row read on the device) and down
(a torch gather-add), and act "swiglu_oai" (the clamped SwiGLU, moe_act.py). The defaults keep
the qwen3moe launches as they were; with any option each path runs its GEMMs as before and the
activation in moe_act's kernel (path moe.act.triton); the int8 gather quantizes the activation
rows in a launch of its own instead of the fused SwiGLU + int8 one.

Options (gemma4's 26B-A4B; ops.moe_ffn): act "geglu" (gelu_tanh(gate) * up in moe_act's kernel),
router_in (the router's own input: reference.route reads it instead of h), down_scale (E,) (each
expert's output scale, folded into its routing weight on the device), and the fused gate_up
experts (up_exps None, gate_exps (E*2Fe, D)): each path multiplies the 2Fe rows of an expert in
one product (one int8 GEMV, one gather + bmm, one grouped GEMM) and the activation reads the two
halves as strided views (build_moe_ffn's gate_up_exps).

Option (nemotron_h_moe): act "relu2", ungated experts (gate_exps None): each path multiplies only the up
rows (one int8 GEMV, one gather + bmm, one grouped GEMM) and moe_act's kernel squares relu(up) (build_moe_ffn's
LLM_FFN_RELU_SQR without a gate).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minfer.errors import MinferError
from minfer.ops import paths, reference
from minfer.ops.cuda import dequant, gemv_q8, gemv_q8_experts, gemv_repack, moe_act
from minfer.ops.cuda.gemv_repack_layout import planes_of

GATHER_MAX = 16     # T*k rows at most for the expert gather (a decode step: T=1, k<=8 -> 8)


def _decode_rows(w, rows: torch.Tensor, k: int, dtype) -> torch.Tensor:
    """Rows `rows` (R,) int64 device of the stacked expert QWeight w -> (R, K) in dtype. A
    repacked weight (planes) is decoded whole: callers pass every row then (the grouped path)."""
    out = torch.empty((rows.shape[0], k), dtype=dtype, device=rows.device)
    rw = planes_of(w)
    if rw is not None:
        if rows.shape[0] != rw.n:
            raise MinferError(f"tensor '{w.name}': a repacked expert tensor is decoded whole, not {rows.shape[0]} "
                              f"of its {rw.n} rows")
        return gemv_repack.dequantize_into(rw, out, interpret=dequant.interpret())
    return dequant.dequantize_into(w.raw, w.qtype, rows.shape[0], k, out, idx=rows, interpret=dequant.interpret())


def _decode_q8(h, w, idx, gate_exps, up_exps, down_exps, Fe, ctx, opts=None):
    """Few rows: the T*k selected experts by the int8 GEMV over their repacked rows -> (T, D).
    One row uses the int8 form its producer attached (h.q8); more rows are quantized here and
    each (token, slot) pair gets its token's row."""
    ws = ctx.workspace.gemv_counters() if ctx is not None and ctx.workspace is not None else None
    interp = dequant.interpret()
    T, D = h.shape
    k = idx.shape[1]
    sel = idx.reshape(-1)                                              # (T*k,) expert of each slot
    q8 = getattr(h, "q8", None) if T == 1 else None
    per_slot = q8 is None
    if per_slot:
        xq, xf = gemv_q8.quantize_rows(h, interpret=interp)
        tok = torch.arange(T, device=h.device).repeat_interleave(k)    # slot -> its token's row
        q8 = (xq.index_select(0, tok).contiguous(), xf.index_select(0, tok).contiguous())
    gx = gemv_q8_experts.gemv_q8_experts
    if gate_exps is None:                                              # ungated (relu2): up only
        g = u = gx(q8, planes_of(up_exps), sel, Fe, per_slot_x=per_slot, out_dtype=h.dtype, ws=ws, interpret=interp)
    elif up_exps is None:                                              # fused gate_up: one GEMV of 2Fe rows
        gu = gx(q8, planes_of(gate_exps), sel, 2 * Fe, per_slot_x=per_slot, out_dtype=h.dtype, ws=ws,
                interpret=interp)
        g, u = gu[:, :Fe], gu[:, Fe:]
    else:
        g = gx(q8, planes_of(gate_exps), sel, Fe, per_slot_x=per_slot, out_dtype=h.dtype, ws=ws, interpret=interp)
        u = gx(q8, planes_of(up_exps), sel, Fe, per_slot_x=per_slot, out_dtype=h.dtype, ws=ws, interpret=interp)
    if opts is None:
        _, qa = gemv_q8.swiglu_q8_rows(g, u, interpret=interp)
    else:
        qa = gemv_q8.quantize_rows(_act(g, u, sel, opts), interpret=interp)
    y = gx(qa, planes_of(down_exps), sel, D, per_slot_x=True, out_dtype=torch.float32, ws=ws, interpret=interp)
    return (_down_bias(y, sel, opts).view(T, k, D) * w[..., None]).sum(1).to(h.dtype)


def _act(g, u, rows_e, opts):
    """The experts' activation of (R, Fe) gate / up rows, row r of expert rows_e[r]: silu(g) * u
    in torch with the default options (as before them), moe_act's kernel with any."""
    if opts is None:
        return F.silu(g) * u
    return moe_act.moe_act(g, u, rows_e, opts["gate_bias"], opts["up_bias"], opts["act"], opts["alpha"],
                           opts["limit"])


def _down_bias(y, rows_e, opts):
    """y (R, D) float32 plus down_bias[rows_e] (E, D) when the options have one."""
    if opts is None or opts["down_bias"] is None:
        return y
    return y + opts["down_bias"].float().index_select(0, rows_e)


def _expert_rows(experts: torch.Tensor, n: int) -> torch.Tensor:
    """experts (S,) int64 -> the (S*n,) raw row indices of their matrices, expert by expert."""
    return (experts[:, None] * n + torch.arange(n, device=experts.device)[None, :]).reshape(-1)


def route(h: torch.Tensor, router: torch.Tensor, k: int, norm_weights: bool, router_bias=None,
          gating: str = "softmax", select_bias=None, n_group: int = 1, topk_group: int = 1,
          weights_scale: float = 1.0):
    """Weights (T, k) float32 and expert ids (T, k) on the device: reference.route's torch ops
    (softmax over E then top-k, top-k logits then their softmax, or sigmoid with a selection
    bias and group mask), no host value."""
    return reference.route(h, router, k, norm_weights, router_bias, gating, select_bias, n_group, topk_group,
                           weights_scale)


def moe_ffn(h: torch.Tensor, router: torch.Tensor, gate_exps, up_exps, down_exps, k: int,
            norm_weights: bool, ctx=None, *, router_bias=None, gating: str = "softmax", gate_bias=None,
            up_bias=None, down_bias=None, act: str = "silu", alpha: float = 1.702,
            limit: float = 7.0, select_bias=None, n_group: int = 1, topk_group: int = 1,
            weights_scale: float = 1.0, router_in=None, down_scale=None) -> torch.Tensor:
    """h (T, D) normed activations -> (T, D) in h's dtype; see minfer.ops.reference.moe_ffn
    (the options: ops.moe_ffn)."""
    T, D = h.shape
    E = router.shape[0]
    ungated = reference.check_gate(gate_exps, act)
    fused = up_exps is None
    Fe = (up_exps if ungated else gate_exps).shape[0] // E // (2 if fused else 1)
    if act not in moe_act.ACTS:
        raise ValueError(f"moe_ffn: act {act!r} is not one of {tuple(moe_act.ACTS)}")
    opts = None
    if gate_bias is not None or up_bias is not None or down_bias is not None or act != "silu" or fused:
        opts = dict(gate_bias=gate_bias, up_bias=up_bias, down_bias=down_bias, act=act, alpha=alpha, limit=limit)
    w, idx = route(h if router_in is None else router_in, router, k, norm_weights, router_bias, gating, select_bias,
                   n_group, topk_group, weights_scale)
    if down_scale is not None:
        w = w * down_scale.float()[idx]
    adt = h.dtype
    mats = (up_exps, down_exps) if ungated else (gate_exps, down_exps) if fused else (gate_exps, up_exps, down_exps)
    planes = all(planes_of(t) is not None for t in mats)
    # (float32 activations keep the exact grouped path, as the dense layers keep their bf16-free GEMV)
    if planes and T * k <= GATHER_MAX and Fe % 256 == 0 and D % 256 == 0 and h.dtype != torch.float32:
        if ctx is not None and not ctx.switches.gemv_q8:
            paths.switched_off("moe.gather.q8", "MINFER_GEMV_Q8")      # the grouped path below
        else:
            paths.count("moe.gather.q8")
            return _decode_q8(h, w, idx, gate_exps, up_exps, down_exps, Fe, ctx, opts)
    if T * k <= GATHER_MAX and not planes:
        paths.count("moe.gather")
        sel = idx.reshape(-1)                                              # (T*k,)
        x = h.repeat_interleave(k, dim=0).unsqueeze(-1)                   # (T*k, D, 1)
        if ungated:
            u = torch.bmm(_decode_rows(up_exps, _expert_rows(sel, Fe), D, adt).view(T * k, Fe, D), x).squeeze(-1)
            a = _act(None, u, sel, opts)                                   # (T*k, Fe)
        elif fused:
            gu = _decode_rows(gate_exps, _expert_rows(sel, 2 * Fe), D, adt).view(T * k, 2 * Fe, D)
            gu = torch.bmm(gu, x).squeeze(-1)                              # (T*k, 2Fe)
            a = _act(gu[:, :Fe], gu[:, Fe:], sel, opts)
        else:
            g = _decode_rows(gate_exps, _expert_rows(sel, Fe), D, adt).view(T * k, Fe, D)
            u = _decode_rows(up_exps, _expert_rows(sel, Fe), D, adt).view(T * k, Fe, D)
            a = _act(torch.bmm(g, x).squeeze(-1), torch.bmm(u, x).squeeze(-1), sel, opts)   # (T*k, Fe)
        d = _decode_rows(down_exps, _expert_rows(sel, D), Fe, adt).view(T * k, D, Fe)
        y = torch.bmm(d, a.unsqueeze(-1)).squeeze(-1).float()              # (T*k, D)
        return (_down_bias(y, sel, opts).view(T, k, D) * w[..., None]).sum(1).to(adt)
    # grouped: (token, slot) pairs sorted by expert
    flat = idx.reshape(-1)                                                 # (T*k,)
    order = torch.argsort(flat, stable=True)
    tok = order // k                                                       # token of each sorted pair
    # per-expert row counts by scatter_add (bincount reads its length back to the host, which a
    # CUDA-graph capture of the prefill cannot take)
    counts = torch.zeros(E, dtype=torch.int64, device=h.device).scatter_add_(0, flat, torch.ones_like(flat))
    xs = h.index_select(0, tok)                                            # (T*k, D)
    all_e = torch.arange(E, device=h.device)
    e_of = flat[order]                                                     # expert of each sorted pair
    if ungated:
        u = _decode_rows(up_exps, _expert_rows(all_e, Fe), D, adt).view(E, Fe, D)
        a = _act(None, _grouped(xs, u, counts, e_of), e_of, opts)         # (T*k, Fe)
    elif fused:
        gu = _decode_rows(gate_exps, _expert_rows(all_e, 2 * Fe), D, adt).view(E, 2 * Fe, D)
        gu = _grouped(xs, gu, counts, e_of)                                # (T*k, 2Fe)
        a = _act(gu[:, :Fe], gu[:, Fe:], e_of, opts)
    else:
        g = _decode_rows(gate_exps, _expert_rows(all_e, Fe), D, adt).view(E, Fe, D)
        u = _decode_rows(up_exps, _expert_rows(all_e, Fe), D, adt).view(E, Fe, D)
        a = _act(_grouped(xs, g, counts, e_of), _grouped(xs, u, counts, e_of), e_of, opts)   # (T*k, Fe)
    d = _decode_rows(down_exps, _expert_rows(all_e, D), Fe, adt).view(E, D, Fe)
    y = _down_bias(_grouped(a, d, counts, e_of).float(), e_of, opts)      # (T*k, D)
    y = y * w.reshape(-1)[order, None]
    out = torch.zeros(T, D, dtype=torch.float32, device=h.device)
    out.index_add_(0, tok, y)
    return out.to(adt)


def _grouped(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, expert_of_row: torch.Tensor) -> torch.Tensor:
    """Rows x (M, K) sorted by expert (counts (E,) rows each) times w[e]^T (E, N, K) -> (M, N)."""
    gm = getattr(torch, "_grouped_mm", None)
    if gm is not None and x.is_cuda and x.dtype == torch.bfloat16:
        try:
            offs = torch.cumsum(counts, 0).to(torch.int32)
            out = gm(x, w.transpose(1, 2), offs=offs)
            paths.count("moe.grouped")
            return out
        except (RuntimeError, TypeError) as e:
            paths.fallback("moe.grouped", f"torch._grouped_mm refused: {str(e).splitlines()[0][:80]}")
    else:
        paths.fallback("moe.grouped", "torch._grouped_mm needs bf16 activations on CUDA")
    # padded batched matmul: row r of expert e goes to slot (e, r - start_e); all on the device
    E, N, K = w.shape
    M = x.shape[0]
    starts = torch.cumsum(counts, 0) - counts                               # (E,)
    slot = torch.arange(M, device=x.device) - starts[expert_of_row]        # (M,)
    cap = M                                                                # a bound, no host read
    pad = x.new_zeros((E, cap, K))
    pad[expert_of_row, slot] = x
    y = torch.bmm(pad, w.transpose(1, 2))                                  # (E, cap, N)
    return y[expert_of_row, slot]
