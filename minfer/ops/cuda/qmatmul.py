"""linear() on CUDA: choose between the decode GEMV and dequantize-to-scratch + cuBLAS.

- M <= MINFER_GEMV_MAX_M (default 32: on the H200, run 1, the GEMV beat dequant+cuBLAS
  up to M=32 on the qkv and gate shapes): gemv.gemv reads the raw blocks once (memory-bound).
- larger M (prefill): the layer's blocks are decoded into a reused scratch of the
  activation dtype by dequant.dequantize_into (memory-bound, ~N*K*2 bytes written) and
  torch.matmul (cuBLAS) does the math; ANCHORS.md measured this at 49k tok/s of linear
  work for the 7B at M=3354 -- the baseline issue 7 starts from.
- A weight whose dtype already equals the activations' (BF16 file tensor, bf16 activations)
  is used in place by cuBLAS: no copy.
The scratch holds at most MINFER_SCRATCH_MB (default 256 MiB); larger weights (the 7B's
lm head, 152064 x 3584) are decoded and multiplied in row chunks that fit.

Switches (read at each call): MINFER_GEMV=0 sends small M through dequant + cuBLAS too;
MINFER_GEMV_MAX_M sets the crossover.

Issue 7 (prefill), each behind its own switch, counted in minfer.ops.paths:
- linear_many (MINFER_FUSE_GROUPS=0 -> per-weight linear): the weights of one call (q,k,v or
  gate,up) are dequantized into consecutive rows of one scratch ([sum N_i, K]) and multiplied
  by one GEMM (`qmatmul.group<n>.prefill`), or, MINFER_GROUP_GEMM=split, by one GEMM per
  slice of that scratch (contiguous outputs). Default `auto`: one GEMM for groups of 3+ (the
  model views q/k/v as (T, H, Dh) and rope / the KV cache's index_copy_ take the strides of
  a column slice), split for pairs (gate/up go to swiglu, which copies non-contiguous inputs:
  2 x T x F x 2 bytes, more than the launch saved).
- prefetch (MINFER_PREFETCH=0 -> the old single-scratch path for single weights, synchronous
  groups): two scratch buffers, the next group dequantized on a side stream during this
  group's GEMM (prefetch.py; `prefetch.hit` / `prefetch.miss`).
- biases are converted to the activation dtype once and cached (not one .to() per call), and
  go into cuBLAS as addmm (F.linear with a 2-D input), not as a separate add.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from minfer.errors import MinferError
from minfer.ops import paths
from minfer.ops.cuda import dequant, gemv, prefetch

_scratch: dict = {}            # (device, dtype) -> 1-D tensor, reused by every layer
_largest_weight = [0]          # elements of the largest prepared layer weight (scratch size, load report)


def _interpret() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def scratch_limit_elems(dtype) -> int:
    mb = paths.env_int("MINFER_SCRATCH_MB", 256)
    return max(1 << 20, mb * (1 << 20) // torch.empty((), dtype=dtype).element_size())


def note_weight(n_elems: int, name: str | None = None) -> None:
    """prepare_weight records each weight's size so the scratch can be reported at load.

    The output and token-embedding matrices do not size the single scratch: in a prefill the
    lm head multiplies the last row only (the GEMV), and the embedding is a row gather. When
    all logits are asked for (perplexity), the lm head grows the scratch on demand, up to
    MINFER_SCRATCH_MB, and goes through it in row chunks."""
    if name is None or not name.startswith(("output.", "token_embd.")):
        _largest_weight[0] = max(_largest_weight[0], n_elems)
    if name is not None:
        prefetch.note_weight(name, n_elems)


def planned_scratch_bytes(dtype=torch.bfloat16) -> int:
    """Bytes the prefill scratch will take for the weights prepared so far (with the switches
    as they are now: two group buffers when prefetch or groups are on, else one scratch)."""
    esize = torch.empty((), dtype=dtype).element_size()
    if _runner_on():
        return 2 * prefetch.planned_group_elems(dtype) * esize
    return min(_largest_weight[0], scratch_limit_elems(dtype)) * esize


def scratch_plan(dtype=torch.bfloat16) -> str:
    """The scratch plan in words, for memory_report."""
    esize = torch.empty((), dtype=dtype).element_size()
    if _runner_on():
        g = prefetch.planned_group_elems(dtype) * esize
        single = min(_largest_weight[0], scratch_limit_elems(dtype)) * esize
        return (f"prefill scratch 2 x {g / 2**20:.0f} MiB (bf16, largest weight group; "
                f"prefetch {'on' if paths.enabled('MINFER_PREFETCH') else 'off'}, "
                f"groups {'on' if paths.enabled('MINFER_FUSE_GROUPS') else 'off'}, "
                f"gate/up {'together' if prefetch.ffn_grouped() else 'apart'}) "
                f"+ {single / 2**20:.0f} MiB when a prompt of <= 1024 tokens is first graphed")
    return f"prefill scratch {planned_scratch_bytes(dtype) / 2**20:.0f} MiB (bf16)"


def scratch_bytes() -> int:
    """Bytes of scratch allocated now (all dtypes, all devices)."""
    return sum(t.numel() * t.element_size() for t in _scratch.values()) + prefetch.scratch_bytes()


def _runner_on() -> bool:
    return paths.enabled("MINFER_PREFETCH") or paths.enabled("MINFER_FUSE_GROUPS")


_bias_cache: dict = {}     # (ids of the biases, dtype) -> (the source tensors, converted/concatenated)


def _group_bias(biases, ws, dtype, device):
    """The group's biases concatenated in `dtype` ((sum N_i,), zeros where a weight has none),
    or None when no weight has one. Cached: the model's bias tensors never change, and the
    cache keeps the sources alive so an id cannot be reused while its entry exists."""
    if all(b is None for b in biases):
        return None
    key = (tuple(id(b) for b in biases), dtype)
    hit = _bias_cache.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], biases)):
        return hit[1]
    parts = [torch.zeros(w.shape[0], dtype=dtype, device=device) if b is None else b.to(device, dtype)
             for w, b in zip(ws, biases)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts)
    if len(_bias_cache) > 4096:
        _bias_cache.clear()
    _bias_cache[key] = (tuple(biases), out)
    return out


def _get_scratch(n_elems: int, dtype, device) -> torch.Tensor:
    key = (str(device), dtype)
    buf = _scratch.get(key)
    if buf is None or buf.numel() < n_elems:
        want = max(n_elems, min(_largest_weight[0], scratch_limit_elems(dtype)))
        _scratch.pop(key, None)
        buf = torch.empty(want, dtype=dtype, device=device)
        _scratch[key] = buf
    return buf


def _float_view(w):
    """The weight as a dense (N, K) tensor viewing the raw bytes, for F32/F16/BF16 files."""
    dt = {dequant.F32: torch.float32, dequant.F16: torch.float16, dequant.BF16: torch.bfloat16}[w.qtype]
    return w.raw.view(dt).view(w.shape[0], w.shape[1])


def check_supported(w) -> None:
    if w.qtype not in dequant.LAYOUT:
        from minfer.quants import type_name
        raise MinferError(f"tensor '{w.name}': ggml type {type_name(w.qtype)} has no CUDA kernel in minfer "
                          f"(supported on cuda: {', '.join(v[0] for v in dequant.LAYOUT.values())}); "
                          f"use --device cpu")


def _dequant_fn(interp):
    def f(w, out):                       # out: (n, k) rows of a scratch buffer
        dequant.dequantize_into(w.raw, w.qtype, w.shape[0], w.shape[1], out, interpret=interp)
    return f


def _chunked(x, w, bias, scratch_1d):
    """Dequantize (in row chunks that fit `scratch_1d`) and multiply with cuBLAS. (T, N)."""
    n, k = w.shape
    dtype = x.dtype
    interp = _interpret()
    rows = max(1, min(n, scratch_1d.numel() // k))
    if rows < n:
        # a whole number of 64-row groups per chunk keeps cuBLAS on its good tile sizes
        rows = max(64, rows // 64 * 64) if n >= 64 else n
    if rows >= n:
        wd = scratch_1d[: n * k].view(n, k)
        dequant.dequantize_into(w.raw, w.qtype, n, k, wd, interpret=interp)
        return F.linear(x, wd, bias)
    out = torch.empty((x.shape[0], n), dtype=dtype, device=x.device)
    for r0 in range(0, n, rows):
        r1 = min(n, r0 + rows)
        wd = scratch_1d[: (r1 - r0) * k].view(r1 - r0, k)
        dequant.dequantize_into(w.raw[r0:r1], w.qtype, r1 - r0, k, wd, interpret=interp)
        torch.matmul(x, wd.t(), out=out[:, r0:r1])
    if bias is not None:
        out += bias
    return out


def _prefill(x, w, bias, tname):
    """The single-scratch path (both issue-7 switches off, or a float weight used in place)."""
    n, k = w.shape
    dtype = x.dtype
    if w.qtype in dequant.FLOAT_TYPES and _float_view(w).dtype == dtype:
        paths.count(f"qmatmul.{tname}.cublas_direct")
        return F.linear(x, _float_view(w), _group_bias((bias,), (w,), dtype, x.device))
    paths.count(f"qmatmul.{tname}.prefill")
    limit = scratch_limit_elems(dtype)
    rows = max(1, min(n, limit // k))
    if rows < n:
        rows = max(64, rows // 64 * 64) if n >= 64 else n
    scratch = _get_scratch(rows * k, dtype, x.device)
    return _chunked(x, w, _group_bias((bias,), (w,), dtype, x.device), scratch[: rows * k])


def _group_mode(n_weights: int) -> str:
    mode = os.environ.get("MINFER_GROUP_GEMM", "auto").strip().lower()
    if mode not in ("one", "split"):
        mode = "one" if n_weights >= 3 else "split"
    return mode


def run_group(x, ws, biases, path: str):
    """Prefill through the double-buffered group scratch: x (T, K) -> [(T, N_i)].

    One weight alone is a group of one. The group's rows go into one buffer (prefetched on the
    side stream when predicted); a group larger than a buffer is done weight by weight in
    row chunks through one buffer used as a plain scratch."""
    r = prefetch.runner(x.device, x.dtype)
    k = ws[0].shape[1]
    total = sum(w.shape[0] for w in ws) * k
    limit = prefetch.buffer_limit_elems(x.dtype)
    pf = paths.enabled("MINFER_PREFETCH")
    if not pf:
        paths.switched_off("prefetch", "MINFER_PREFETCH")
    deq = _dequant_fn(_interpret())
    dtype = x.dtype

    def fits(g):
        return sum(w.shape[0] for w in g) * g[0].shape[1] <= limit

    paths.count(path)
    if total > limit:
        b, buf = r.plain_scratch(ws, pf, 1 << 20)    # whatever the buffers hold (>= 1 Mi values)
        outs = [_chunked(x, w, _group_bias((bi,), (w,), dtype, x.device), buf) for w, bi in zip(ws, biases)]
        _release(r, b, deq, fits, pf)
        return outs
    b = r.acquire(ws, total, deq, pf)
    buf = r.bufs[b]
    if len(ws) == 1 or _group_mode(len(ws)) == "one":
        wd = buf[:total].view(total // k, k)
        out = F.linear(x, wd, _group_bias(biases, ws, dtype, x.device))     # addmm when biased
        outs = [out] if len(ws) == 1 else list(torch.split(out, [w.shape[0] for w in ws], dim=1))
    else:
        outs, r0 = [], 0
        for w, bi in zip(ws, biases):
            n = w.shape[0]
            outs.append(F.linear(x, buf[r0 * k:(r0 + n) * k].view(n, k), _group_bias((bi,), (w,), dtype, x.device)))
            r0 += n
    _release(r, b, deq, fits, pf)
    return outs


def _release(r, b, deq, fits, pf):
    if pf:
        r.release(b, deq, fits)          # marks b free for the side stream, prefetches the next group
    else:
        r.release_no_prefetch(b)


def _decode_path(m: int) -> bool:
    return m <= paths.env_int("MINFER_GEMV_MAX_M", 32)


def _check(x, w):
    check_supported(w)
    if x.shape[-1] != w.shape[1]:
        raise MinferError(f"tensor '{w.name}': input has {x.shape[-1]} features, the weight expects {w.shape[1]}")


def linear(x: torch.Tensor, w, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x (T, K) @ W (N, K)^T + bias (N,) -> (T, N) in x's dtype."""
    _check(x, w)
    n, k = w.shape
    if x.stride(-1) != 1:
        x = x.contiguous()
    tname = dequant.type_name(w.qtype)
    m = x.shape[0]
    if _decode_path(m):
        path = f"qmatmul.{tname}.decode"
        if paths.enabled("MINFER_GEMV"):
            paths.count(path)
            return gemv.gemv(x, w.raw, w.qtype, n, k, bias=bias, interpret=_interpret())
        paths.switched_off(path, "MINFER_GEMV")
    direct = w.qtype in dequant.FLOAT_TYPES and _float_view(w).dtype == x.dtype
    if _runner_on() and not direct:
        return run_group(x, (w,), (bias,), f"qmatmul.{tname}.prefill")[0]
    return _prefill(x, w, bias, tname)


def linear_many(x: torch.Tensor, ws, biases) -> list:
    """The same x (T, K) through several weights of one K (q/k/v, gate/up) -> [(T, N_i)].

    Decode M: the GEMV per weight. Prefill M: one scratch, one GEMM (see the module doc)."""
    ws, biases = tuple(ws), tuple(biases)
    for w in ws:
        _check(x, w)
    if x.stride(-1) != 1:
        x = x.contiguous()
    if len(ws) == 1 or (_decode_path(x.shape[0]) and paths.enabled("MINFER_GEMV")):
        return [linear(x, w, b) for w, b in zip(ws, biases)]
    path = f"qmatmul.group{len(ws)}.prefill"
    if not paths.enabled("MINFER_FUSE_GROUPS"):
        paths.switched_off(path, "MINFER_FUSE_GROUPS")
        return [linear(x, w, b) for w, b in zip(ws, biases)]
    if not prefetch.ffn_grouped() and all(prefetch.is_ffn_in(w) for w in ws):
        paths.count("qmatmul.ffn_apart")              # the default: gate and up each alone
        return [linear(x, w, b) for w, b in zip(ws, biases)]
    return run_group(x, ws, biases, path)
