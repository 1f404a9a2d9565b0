"""Every matrix of every committed architecture fixture passes the CUDA backend's load-time
check (ops.cuda.prepare_weight, run here through Triton's interpreter build of the module): the
2026-12-05 GPU run refused six MoE fixtures at load because their F16 experts are 24 columns
wide, which the kernels read (float rows in runs of 16, the last run masked per value) but the
check did not take. The interpreted forward tests build their weights on the CPU and never ran
this check."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
from kernel_data import interpreted_modules  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data" / "arch"
FIXTURES = sorted(p.stem for p in DATA.glob("*.gguf"))


@pytest.fixture(scope="module")
def cuda_ops():
    yield from interpreted_modules(["minfer.ops.cuda.dequant", "minfer.ops.cuda.gemv", "minfer.ops.cuda.qmatmul",
                                    "minfer.ops.cuda"])


@pytest.mark.parametrize("name", FIXTURES)
def test_every_fixture_weight_passes_prepare_weight(cuda_ops, name):
    from minfer.gguf_file import GGUFFile
    from minfer.models import load_model

    m = load_model(GGUFFile(DATA / f"{name}.gguf"), progress=False)
    ws = m.qweights()
    assert ws
    for w in ws:
        cuda_ops["cuda"].prepare_weight(w)          # raises MinferError naming the tensor


def test_float_weight_of_24_columns_prepared_and_multiplied(cuda_ops):
    """An F16 matrix 24 wide: accepted, and the decode GEMV / prefill rows give x @ W.T; a raw
    buffer of the wrong width is still refused with the tensor's name."""
    from minfer.errors import MinferError
    from minfer.ops.context import Context
    from minfer.switches import Switches
    from minfer.weights import QWeight

    g = torch.Generator().manual_seed(0)
    wd = torch.randn(40, 24, generator=g).half()
    w = QWeight("blk.0.ffn_down_exps.weight", 1, (40, 24), wd.view(torch.uint8).clone())
    cuda_ops["cuda"].prepare_weight(w)
    for rows in (1, 20):
        x = torch.randn(rows, 24, generator=g)
        out = cuda_ops["qmatmul"].linear(x, w, None, Context(Switches(prefetch=False, fuse_groups=False)))
        ref = x.double() @ wd.double().T
        assert float((out.double() - ref).norm() / ref.norm()) < 1e-5
    bad = QWeight("blk.0.bad.weight", 1, (40, 24), torch.zeros(40, 32, dtype=torch.uint8))
    with pytest.raises(MinferError, match="blk.0.bad.weight"):
        cuda_ops["cuda"].prepare_weight(bad)
