"""The shipped Gluon GEMV table (minfer/ops/cuda/gemv_q8g_h200.json) with one shape's config replaced, written to
a file for MINFER_GEMV_Q8G_TABLE (an A/B side: tools/device_s18.sh cfgab).

    python tools/cfg_table.py "Q6_K 152064x3584" 32,2,1,4,1,0,0,0,0,1,1 /tmp/t.json

The key must be one the table has or a "<type> <N>x<K>" of Q4_K / Q6_K; the config's fields are the table's
([BN, BB, SPLIT, warps, prefetch, register cap, late, warps along K, second first, tiles, x ahead, programs an
SM]), 4 to 12 integers."""
from __future__ import annotations

import json
import re
import sys


def main(argv=None) -> int:
    from minfer.ops.cuda import gemv_q8_gluon as GL

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    key, cfg, out = args
    if not re.fullmatch(r"Q[46]_K \d+x\d+", key):
        print(f"cfg_table: key {key!r} is not '<Q4_K|Q6_K> <N>x<K>'", file=sys.stderr)
        return 2
    try:
        vals = [int(v) for v in cfg.split(",")]
    except ValueError:
        print(f"cfg_table: config {cfg!r} is not comma-separated integers", file=sys.stderr)
        return 2
    if not 4 <= len(vals) <= 12:
        print(f"cfg_table: config {cfg!r} has {len(vals)} fields, expected 4 to 12", file=sys.stderr)
        return 2
    with open(GL._TABLE) as f:
        table = json.load(f)
    was = table["configs"].get(key)
    table["configs"][key] = vals
    table["source"] = f"{GL._TABLE} with {key} = {vals} (was {was}; tools/cfg_table.py)"
    with open(out, "w") as f:
        json.dump(table, f, indent=1)
    print(f"{key}: {was} -> {vals} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
