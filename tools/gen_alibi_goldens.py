"""tests/data/alibi_slopes_hf.json: the ALiBi slopes of transformers' own BLOOM and MPT code (the
independent reference for minfer.ops.reference.alibi_slopes, ggml's rule), for the head counts the
tests take; CI has no transformers, so the tests read this file.
    python tools/gen_alibi_goldens.py        (transformers 5.25.0, torch 2.13.0 CPU)"""
import json
from pathlib import Path

import torch
import transformers
from transformers.models.bloom.modeling_bloom import build_alibi_tensor
from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "alibi_slopes_hf.json"


def main():
    bloom = {n: build_alibi_tensor(torch.ones(1, 2), n, torch.float32)[:, 0, 1].tolist()    # slope * position 1
             for n in (1, 4, 6, 12, 16, 32, 112)}
    mpt = {n: (-build_mpt_alibi_tensor(n, 2, 8)[:, 0, 0]).tolist() for n in (1, 4, 6, 12, 32, 48)}  # slope * (1 - 2)
    OUT.write_text(json.dumps({"made_by": "python tools/gen_alibi_goldens.py", "transformers": transformers.__version__,
                               "bloom_max_bias_8": bloom, "mpt_max_bias_8": mpt}, indent=1) + "\n")


if __name__ == "__main__":
    main()
