"""The Gluon q8 GEMV's config table (gemv_q8_gluon.py): the shipped table file gemv_q8g_h200.json, another
table file named by Switches.gemv_q8g_table (_table), and the shape rule (shape_rule) that gives a shape
missing from the shipped table its role's config. gemv_q8_gluon.config_for looks a shape up in
them; it and its callers read the names there (GL.CONFIGS, GL._TABLE), so a test that replaces
them on gemv_q8_gluon replaces every lookup.

The shipped table holds the 7B's seven shapes, each swept and re-tuned in the graphed step on the
H200. Every other Q4_K / Q6_K model's decode took the Triton q8 kernel, and with it none of the
Gluon kernel's fusions (the norm into the GEMV, rope and the KV append in the q/k/v epilogue, the
residual q8 epilogue, the SwiGLU epilogue). shape_rule gives such a shape the 7B config of the role
its proportions say it has, with the K split and step sized for its K (perf-log AV0):
- K >= 1.5 N, a down projection (K the FFN width; also an o or v narrower than K): the 7B down's
  tiles (32 rows x 2 blocks, 4 warps, tile-major planes, x ahead) with the K split that keeps the
  7B's program count (1,008 for Q4_K: 112 tiles x 9 splits; 560 for Q6_K), at most K / 2 blocks;
- N <= K < 1.5 N, an o projection: 32-row tiles of 16 blocks, 8 warps, no split (the 7B's o);
- K < N <= 3 K, a q/k/v group: 8-row tiles, warps along K, both steps before the PDL wait where K
  takes at most two 8-block steps (K <= 4096), else 16-block steps with one in flight;
- N > 3 K, gate+up (or one of them, or an lm head): 32-row tile-major tiles of one block, x ahead.
Shapes with N or K under 1,024 or N not a multiple of 32 keep the Triton kernel (the tests' tiny
models; the raw-type models' small shapes). Switches.gemv_q8g_rule (on by default since its GPU tests,
tests/gpu/test_gemv_q8g_rule_gpu.py, and H100 A/Bs of 1.19-1.20x on the 1.5B, Llama-3.1-8B and Qwen3-8B
geometries: perf-log AW0 / AW2) turns the rule on (table_arg)."""

from __future__ import annotations

import json
import os

# "<type> <N>x<K>" -> (BN, BB, SPLIT, warps[, prefetch[, register cap[, late[, warps along K]]]]) (late: with PDL the
# next kernel launches when this one's programs end, as Switches.pdl_late does for all), from
# `python -m minfer.bench.gemv_q8_sweep --gluon` and tools/skip_oracle.py's in-step variants
CONFIGS: dict = {}
_TABLE = os.path.join(os.path.dirname(__file__), "gemv_q8g_h200.json")
if os.path.exists(_TABLE):
    with open(_TABLE) as _f:
        CONFIGS = {k_: tuple(v) for k_, v in json.load(_f)["configs"].items()}


_OTHER_TABLES: dict = {}
# Switches.gemv_q8g_rule on: the shipped table, and the shape rule for the shapes it lacks (table_arg; not a
# file name)
RULE = "<shipped table with the shape rule>"


def table_arg(switches) -> str:
    """The table argument of config_for under these switches: a table file (Switches.gemv_q8g_table,
    taken as it is: no rule), the shipped table with the shape rule (RULE), or without it ("")."""
    return switches.gemv_q8g_table or (RULE if switches.gemv_q8g_rule else "")


def shape_rule(q4: bool, n: int, k: int) -> tuple | None:
    """The config of a shape missing from the shipped table, by the role its proportions say (module
    doc); None: the Triton kernel's shape. q4: Q4_K (else Q6_K)."""
    if n < 1024 or k < 1024 or n % 32 or k % 256:
        return None
    nb = k // 256
    if 2 * k >= 3 * n:                                  # a down projection: the 7B down's tiles, its program count
        split = max(1, min(nb // 2, round((1008 if q4 else 560) / (n // 32))))
        return (32, 2, split, 4, 1, 72 if q4 else 0, False, False, False, True, True)
    if n <= k:                                          # an o projection: the 7B's o
        return (32, 16, 1, 8, 0, 0, False)
    if n <= 3 * k:                                      # a q/k/v group: the 7B's, its step sized to K
        return (8, 8, 1, 4, 2, 0, False, True, True) if nb <= 16 else (8, 16, 1, 4, 1, 0, False, True, True)
    return (32, 1, 1, 4, 1, 0, False, False, False, True, True)         # gate+up: the 7B's tile-major group


def _table(path: str) -> dict:
    """The configs of a table file given by Switches.gemv_q8g_table (read once per path)."""
    if path not in _OTHER_TABLES:
        from minfer.errors import MinferError

        try:
            with open(path) as f:
                _OTHER_TABLES[path] = {k_: tuple(v) for k_, v in json.load(f)["configs"].items()}
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise MinferError(f"MINFER_GEMV_Q8G_TABLE={path}: not a Gluon GEMV table ({{\"configs\": "
                              f"{{\"Q4_K NxK\": [BN, BB, SPLIT, warps, prefetch]}}}}): {e}") from None
    return _OTHER_TABLES[path]
