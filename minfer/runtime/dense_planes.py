"""Dense copies of a model's matrices for the batch engine: `QWeight.batch_dense` planes in the
activations' dtype, read by minfer/ops/cuda/qmatmul.py (cuBLAS), one plane per weight group.

Why and when: see attach_dense_planes. Made by runtime/batch_engine.py (BatchEngine and
from_engine); they belong to the model, so every engine over it multiplies through them.
"""

from __future__ import annotations

import torch

from minfer.ops import paths

DENSE_PLANE_FRACTION = 0.5            # dense planes are made by default when they take at most this of free memory


def detach_dense_planes(model) -> None:
    for w in model.qweights():
        for attr in ("batch_dense", "batch_dense_group", "batch_w4", "batch_w4_group"):
            if getattr(w, attr, None) is not None:
                setattr(w, attr, None)


def w4_plane_bytes(model) -> int:
    """Bytes of the w4 planes attached to the model's weights (attach_w4_planes)."""
    n = 0
    for w in model.qweights():
        g = getattr(w, "batch_w4_group", None)
        n += (g[1].nbytes() if g is not None else 0) + (w.batch_w4.nbytes() if getattr(w, "batch_w4", None) else 0)
    return n


def w4_unsupported(device) -> str | None:
    """Why the w4 GEMM cannot run on this device (None: it can). Its decode uses sm_90 PTX
    (sub/mul.bf16x2) and its default MMA is Hopper's wgmma, which sm_100+ GPUs lack."""
    if device.type != "cuda":
        return None                                             # (CPU tests: the planes only)
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) != (9, 0):
        return f"the GPU is sm_{cap[0]}{cap[1]}; the kernel is written for sm_90 (H100/H200)"
    return None


def attach_w4_planes(model, switches=None) -> int:
    """Give the large Q4_K/Q6_K matrices (qgemm_w4_mma.use_w4: gate/up as one group, down, the lm
    head) fragment planes for the Gluon GEMM of batched rows (`w.batch_w4`, a group's first
    weight `batch_w4_group = (ws, planes)`), made from their GEMV planes; they sit beside the
    dense planes, which rows past qgemm_w4_max_m still use. Returns the bytes (0: switched off,
    no Gluon, or no such matrix)."""
    path = "qmatmul.w4"
    if switches is not None and not getattr(switches, "qgemm_w4", True):
        paths.switched_off(path, "MINFER_QGEMM_W4")
        return 0
    try:
        from minfer.ops.cuda import qgemm_w4_mma
    except ImportError as e:                                    # a Triton without Gluon
        paths.fallback(path, f"Triton has no Gluon ({e})")
        return 0
    why = w4_unsupported(model.device)
    if why:
        paths.fallback(path, why)
        return 0
    from minfer.ops.cuda.gemv_repack_layout import planes_of
    from minfer.ops.cuda.qgemm_w4 import make_w4

    in_group = set()
    for g in (tuple(g) for g in (model.decode_groups() if hasattr(model, "decode_groups") else ())):
        grp = getattr(g[0], "repacked_group", None)
        if grp is None or grp[0] != g:
            continue
        in_group.update(id(w) for w in g)
        rw = grp[1]
        if getattr(g[0], "batch_w4_group", None) is None and qgemm_w4_mma.use_w4(rw.qtype, rw.n, rw.k):
            g[0].batch_w4_group = (g, make_w4(rw))
    for w in model.qweights():
        rw = planes_of(w)
        if id(w) in in_group or rw is None:
            continue
        if getattr(w, "batch_w4", None) is None and qgemm_w4_mma.use_w4(rw.qtype, rw.n, rw.k):
            w.batch_w4 = make_w4(rw)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
        torch.cuda.empty_cache()            # the builder's temporaries: the KV sizing reads free memory
    return w4_plane_bytes(model)


def attach_dense_planes(model, force: bool = False, free_bytes: int | None = None, switches=None) -> int:
    """Give every matrix the linear layers multiply a resident copy in the activations' dtype
    (`QWeight.batch_dense`, read by minfer/ops/cuda/qmatmul.py), decoded once from the raw blocks.

    Why: a batch of M rows through dequantize + cuBLAS decodes the whole model every step (the
    7B: 4.4 GB read, 15 GB written and read again per step), and the raw-block GEMV at M <= 32
    ran at ~0.6 TB/s on the H200 (tg 126 t/s, 2026-11-30); a bf16 plane is one cuBLAS read of
    2 bytes per weight (15.2 GB for the 7B: ~4 ms per step at ~4 TB/s, for any M up to a few
    hundred). Costs 2 bytes per weight of GPU memory; made only when that is at most
    DENSE_PLANE_FRACTION of the free memory (or `force`). The planes belong to the model: any
    engine over it (the single-user Engine too) then multiplies through them. Returns the bytes.
    The token embedding is only gathered (not multiplied) unless it is the tied lm head.
    With switches.qgemm_repack or qgemm_q8, weights that have repacked planes get none (and lose
    one made before): their batched rows go through ops/cuda/qgemm_repack.py or qgemm_q8.py,
    which read the planes."""
    from minfer.ops.cuda import dequant, qmatmul
    from minfer.ops.cuda.qmatmul import _float_view

    act = getattr(model, "act_dtype", torch.bfloat16)
    embd = getattr(model, "token_embd", None)
    ws = [w for w in model.qweights() if not (w is embd and getattr(model, "output", None) is not embd)]
    if switches is not None and (getattr(switches, "qgemm_repack", False) or getattr(switches, "qgemm_q8", False)):
        dropped = [w for w in ws if getattr(w, "repacked", None) is not None
                   and getattr(w, "batch_dense", None) is not None]
        for w in dropped:
            w.batch_dense = None
            w.batch_dense_group = None
        if dropped and model.device.type == "cuda":
            torch.cuda.empty_cache()            # so that the KV cache sizing sees the memory free
        ws = [w for w in ws if getattr(w, "repacked", None) is None]
    todo = [w for w in ws if getattr(w, "batch_dense", None) is None]
    need = sum(w.shape[0] * w.shape[1] for w in todo) * torch.empty((), dtype=act).element_size()
    free = torch.cuda.mem_get_info(model.device)[0] if free_bytes is None else free_bytes
    if not force and todo and need > DENSE_PLANE_FRACTION * free:
        paths.fallback("qmatmul.dense_plane", f"{need / 2**30:.1f} GiB of planes > {DENSE_PLANE_FRACTION:.0%} "
                       f"of the {free / 2**30:.1f} GiB free")
        return 0
    # a group the model multiplies by one input (q/k/v, gate/up: Model.decode_groups) gets ONE
    # plane, each member a row-slice view of it: the same bytes, and qmatmul.linear_many runs the
    # group as one cuBLAS GEMM (B=32 on the H200: 7 GEMMs per layer with 5 split-K reductions)
    todo_ids = {id(w) for w in todo}
    groups = [tuple(g) for g in (model.decode_groups() if hasattr(model, "decode_groups") else ())]
    if switches is not None and not getattr(switches, "dense_plane_groups", True):
        paths.switched_off("qmatmul.group.dense_plane", "MINFER_DENSE_PLANE_GROUPS")
        groups = []
    groups = [g for g in groups if len(g) > 1 and all(id(w) in todo_ids for w in g)
              and len({w.shape[1] for w in g}) == 1]
    in_group = {id(w) for g in groups for w in g}

    def decode_into(w, out):
        if w.qtype in dequant.FLOAT_TYPES:
            out.copy_(_float_view(w).to(act))
            return
        decode = getattr(qmatmul, "dequantize_weight", None)   # raw blocks or repacked planes
        if decode is not None:
            decode(w, out, interp=dequant.interpret())
        else:
            dequant.dequantize_into(w.raw, w.qtype, w.shape[0], w.shape[1], out, interpret=dequant.interpret())

    for g in groups:
        plane = torch.empty((sum(w.shape[0] for w in g), g[0].shape[1]), dtype=act, device=model.device)
        r = 0
        for w in g:
            w.batch_dense = plane[r:r + w.shape[0]]
            decode_into(w, w.batch_dense)
            r += w.shape[0]
        g[0].batch_dense_group = (g, plane)
    for w in todo:
        if id(w) in in_group:
            continue
        n, k = w.shape
        if w.qtype in dequant.FLOAT_TYPES:
            w.batch_dense = _float_view(w).to(act).contiguous()
        else:
            w.batch_dense = torch.empty((n, k), dtype=act, device=model.device)
            decode_into(w, w.batch_dense)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    dense = sum(w.batch_dense.numel() * w.batch_dense.element_size() for w in ws
                if getattr(w, "batch_dense", None) is not None)
    return dense + (attach_w4_planes(model, switches) if model.device.type == "cuda" else 0)
