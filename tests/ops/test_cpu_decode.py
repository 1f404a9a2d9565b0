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


@pytest.mark.parametrize("S", [1, 40, 600, reference.ONE_THREAD_MAX_KEYS + 1])
def test_decode_attention_on_one_thread_is_the_same_and_restores_the_threads(S):
    g = torch.Generator().manual_seed(1)
    kc, vc = torch.randn(S + 3, 2, 64, generator=g), torch.randn(S + 3, 2, 64, generator=g)
    q = torch.randn(1, 14, 64, generator=g)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = reference.decode_attention(q, kc, vc, S)
        assert torch.get_num_threads() == 2
        torch.set_num_threads(1)
        assert torch.equal(got, reference.decode_attention(q, kc, vc, S))
    finally:
        torch.set_num_threads(before)
    # against the general path (SDPA over the same keys, a one-row causal mask)
    k, v = kc[:S].transpose(0, 1), vc[:S].transpose(0, 1)
    ref = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v, enable_gqa=True)
    torch.testing.assert_close(got, ref.transpose(0, 1), rtol=1e-5, atol=1e-6)
