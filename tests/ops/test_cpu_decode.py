"""The CPU reference's decode-step shortcuts give the same bits as its general path."""

from __future__ import annotations

import pytest
import torch

from minfer.config import RopeConfig
from minfer.ops import reference


@pytest.mark.parametrize("style", ["neox", "normal"])
def test_one_position_rope_angles_are_the_general_paths_bits(style):
    cfg = RopeConfig(theta=1e6, style=style, n_rot=64, freq_scale=1.0, freq_factors=None)
    many = torch.tensor([0, 1, 7, 511, 4095, 32767])
    c_all, s_all = reference.rope_cos_sin(many, cfg)            # the T > 1 path
    x = torch.randn(len(many), 4, 64, generator=torch.Generator().manual_seed(0))
    whole = reference.rope(x, many, cfg)
    for i, p in enumerate(many.tolist()):
        c, s = reference.rope_cos_sin(torch.tensor([p]), cfg)   # the memoized one-position path
        assert torch.equal(c, c_all[i:i + 1]) and torch.equal(s, s_all[i:i + 1])
        assert torch.equal(reference.rope(x[i:i + 1], torch.tensor([p]), cfg), whole[i:i + 1])
