"""The process's MINFER_* environment beside the engine's Switches (minfer/switches.py): switches retired from it,
the variables a benchmark record keeps, and process-level settings that are not engine behaviour."""

from __future__ import annotations

import os
from typing import Mapping

from minfer.errors import MinferError


# Switches whose A/B is decided and recorded in docs/perf-log.md (section 11): no longer read.
RETIRED = {
    "MINFER_GROUP_GEMM": "q/k/v: one GEMM over the group; other groups one GEMM per slice (section 7)",
    "MINFER_GROUP_FFN": "gate and up are dequantized apart (section 10, run J)",
    "MINFER_TRITON_NORM": "RMSNorm is always the Triton kernel on CUDA (sections 6-10)",
    "MINFER_CUDNN_BUCKET": "the cuDNN length is always rounded up to 128 (section 10, run K)",
    "MINFER_PREFILL_ATTN": "cuDNN is the default; MINFER_CUDNN_ATTENTION=0 selects flash (section 10)",
    "MINFER_CUDNN_GQA": "GQA goes to cuDNN unexpanded (section 10, runs H-I)",
    "MINFER_FLAG_DOWN": "the down waits on the PDL wait; block flags of h measured slower twice (perf-log CI1, CK1)",
}


def retired_in_env(env: Mapping[str, str] | None = None) -> list[str]:
    """'MINFER_X (retired: why)' for each retired switch set in the environment."""
    env = os.environ if env is None else env
    return [f"{k} (retired: {why})" for k, why in RETIRED.items() if env.get(k)]


def environ_snapshot(env: Mapping[str, str] | None = None) -> dict:
    """The MINFER_* variables as set (a benchmark record keeps them, behaviour or not)."""
    env = os.environ if env is None else env
    return {k: v for k, v in sorted(env.items()) if k.startswith("MINFER_")}


def process_setting(name: str, default: str | None = None) -> str | None:
    """A process-level MINFER_* setting that is not engine behaviour (MINFER_COMMIT for the
    benchmark record); behaviour goes through Switches."""
    from dataclasses import fields

    from minfer.switches import Switches

    if name in {f.metadata["env"] for f in fields(Switches)}:
        raise MinferError(f"{name} is an engine switch: read it through Switches.from_env()")
    return os.environ.get(name, default)
