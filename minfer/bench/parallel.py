"""`minfer bench --parallel 1,8,32,128`: many sequences at once, llama-batched-bench style.

For each B in the list, B sequences of `pp` random prompt tokens (distinct: no prefix hits) go
into one BatchEngine (runtime/batch_engine.py) together, then each generates `tg` tokens:

    T_PP  time until every sequence has its first token (all prompts prefilled)
    T_TG  time for the tg decode steps that follow (each step a token for every sequence)
    S_PP = B * pp / T_PP     S_TG = B * tg / T_TG     S = B * (pp + tg) / (T_PP + T_TG)

as llama.cpp's llama-batched-bench (examples/batched-bench) reports PP, TG, B, N_KV, T_PP, S_PP,
T_TG, S_TG, T, S. End-of-sequence tokens are ignored so every sequence generates exactly tg.
As there, the phases do not overlap: the scheduler holds decode rows until every prompt is
prefilled (Scheduler.prefill_first), then the B sequences decode in the same tg steps. (A
server interleaves them: decode rows first, prompts in chunks beside them; serve_bench.py
measures that.) The decode graphs of all batch buckets are captured before the first timed run
(BatchEngine.warm_graphs), and each B runs once untimed first (the same shapes: compiles
kernels, builds attention plans), then timed. Peak memory is torch's peak allocation during
the timed run (CUDA).
"""

from __future__ import annotations

import time

import torch

from minfer.runtime.sampling import SamplingParams


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def run_once(be, batch: int, pp: int, tg: int, rng: torch.Generator) -> dict:
    """One timed batch: B prompts of pp tokens, tg decode steps each."""
    V = be.config.vocab
    prompts = [torch.randint(0, V, (pp,), generator=rng).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0)
    _sync(be.device)
    t0 = time.perf_counter()
    seqs = [be.add(p, params, tg + 1, ignore_eos=True) for p in prompts]
    t_pp = None
    while be.has_work:
        be.step()
        if t_pp is None and all(s.n_generated >= 1 for s in seqs):
            _sync(be.device)
            t_pp = time.perf_counter() - t0
    _sync(be.device)
    total = time.perf_counter() - t0
    t_pp = t_pp if t_pp is not None else total
    t_tg = total - t_pp
    n_kv = batch * (pp + tg)
    return {"pp": pp, "tg": tg, "batch": batch, "n_kv": n_kv, "t_pp": t_pp, "s_pp": batch * pp / t_pp,
            "t_tg": t_tg, "s_tg": batch * tg / t_tg if t_tg > 0 else 0.0, "t": total,
            "s": batch * (pp + tg) / total, "preemptions": be.scheduler.n_preemptions}


def default_kv_memory(per_block: int, n_max: int, pp: int, tg: int) -> int:
    """The pool without --kv-memory: every sequence's whole context, plus slack for the warm-up's,
    twice (`minfer bench --parallel` checks it against the free memory before the load)."""
    from minfer.runtime.batch_engine import BLOCK_SIZE

    return (n_max * (-(-(pp + tg + 1) // BLOCK_SIZE)) + 2) * per_block * 2


def run_parallel(engine, batches: list[int], pp: int, tg: int, kv_memory: int | None = None, seed: int = 0,
                 graphs: bool = True, progress: bool = True, dense_planes: bool | None = None) -> list[dict]:
    """The table's rows, one per batch size, on a loaded Engine's model."""
    from minfer.runtime.batch_engine import BLOCK_SIZE, BatchEngine
    from minfer.runtime.paged_kv import PagedKVCache

    dev = engine.device
    n_max = max(batches)
    if kv_memory is None:
        per_block = PagedKVCache.bytes_per_block(engine.config, BLOCK_SIZE, getattr(engine.model, "act_dtype",
                                                                                      torch.float32))
        kv_memory = default_kv_memory(per_block, n_max, pp, tg)
    be = BatchEngine.from_engine(engine, max_seqs=n_max, kv_memory=kv_memory, cuda_graphs=graphs,
                                 prefix_cache=False, dense_planes=dense_planes)
    be.scheduler.prefill_first = True
    t0 = time.perf_counter()
    n_graphs = be.warm_graphs()
    if progress and n_graphs:
        import sys

        print(f"  captured the decode graphs of {n_graphs} batch sizes in {time.perf_counter() - t0:.1f} s",
              file=sys.stderr)
    from minfer.runtime.dense_planes import w4_plane_bytes

    w4 = w4_plane_bytes(engine.model)
    if progress and be.dense_plane_bytes:
        import sys

        print(f"  batch planes: {be.dense_plane_bytes / 2**30:.2f} GiB (dense bf16 {(be.dense_plane_bytes - w4) / 2**30:.2f}"
              f" + w4 {w4 / 2**30:.2f})", file=sys.stderr)
    rng = torch.Generator().manual_seed(seed)
    rows = []
    for b in batches:
        run_once(be, b, pp, min(tg, 4), rng)             # warm-up: same prompt shapes, a few steps
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        row = run_once(be, b, pp, tg, rng)
        row["peak_mib"] = torch.cuda.max_memory_allocated(dev) / 2**20 if dev.type == "cuda" else None
        row["graph_steps"] = be.stats["graph_steps"]
        row["dense_plane_gib"] = be.dense_plane_bytes / 2**30          # all batch planes (dense bf16 + w4)
        row["w4_plane_gib"] = w4 / 2**30
        rows.append(row)
        if progress:
            import sys

            print(f"  B={b}: S_PP {row['s_pp']:.0f} t/s, S_TG {row['s_tg']:.0f} t/s", file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    head = "|    PP |    TG |    B |   N_KV |   T_PP s |  S_PP t/s |   T_TG s |  S_TG t/s |      T s |     S t/s | peak MiB |"
    out = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        peak = f"{r['peak_mib']:8.0f}" if r.get("peak_mib") is not None else "       -"
        out.append(f"| {r['pp']:5d} | {r['tg']:5d} | {r['batch']:4d} | {r['n_kv']:6d} | {r['t_pp']:8.3f} | "
                   f"{r['s_pp']:9.1f} | {r['t_tg']:8.3f} | {r['s_tg']:9.1f} | {r['t']:8.3f} | {r['s']:9.1f} | {peak} |")
    return "\n".join(out)
