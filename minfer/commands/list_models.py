"""`minfer list`: the catalog of real models and which ones are pulled."""

from __future__ import annotations

import argparse

HELP = "list the catalog models and whether each is pulled"
DESCRIPTION = """\
List the models that `minfer pull NAME` can fetch (and that any -m option accepts by
name), with architecture, quantization, size, and whether the file is already in
$MINFER_HOME/models (default ~/.cache/minfer). A name not yet pulled is pulled the
first time a command asks for it.

examples:
  minfer list
  minfer list --json | python -c "import json, sys; print([m['name'] for m in json.load(sys.stdin)])"
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def main(args: argparse.Namespace) -> int:
    import json

    from minfer.catalog import CATALOG, is_pulled, model_path
    from minfer.commands.inspect import format_table, human_bytes

    rows = []
    for m in CATALOG.values():
        rows.append({"name": m.name, "arch": m.arch, "quant": m.quant, "size": m.size,
                     "pulled": is_pulled(m.name), "path": str(model_path(m.name)),
                     "description": m.description})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = [["name", "arch", "quant", "size", "pulled", "path"]]
    table += [[r["name"], r["arch"], r["quant"], human_bytes(r["size"]),
               "yes" if r["pulled"] else "no", r["path"] if r["pulled"] else "-"] for r in rows]
    print("\n".join(format_table(table, {3})))
    return 0
