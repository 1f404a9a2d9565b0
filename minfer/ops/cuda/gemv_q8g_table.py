"""The Gluon q8 GEMV's config table (gemv_q8_gluon.py): the shipped table file gemv_q8g_h200.json, another
table file named by Switches.gemv_q8g_table (_table). gemv_q8_gluon.config_for looks a shape up in
them; it and its callers read the names there (GL.CONFIGS, GL._TABLE), so a test that replaces
them on gemv_q8_gluon replaces every lookup."""

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
