"""RoPE reference: ggml's NORM/NEOX pairings written out element by element, and scaling."""

from __future__ import annotations

import math

import torch

from minfer.config import RopeConfig
from minfer.ops.reference import rope


def slow_rope(x, pos, theta, style, scale=1.0, factors=None):
    T, H, D = x.shape
    out = x.clone().double()
    for t in range(T):
        for i in range(D // 2):
            ang = scale * pos[t] * theta ** (-2 * i / D) / (factors[i] if factors else 1.0)
            c, s = math.cos(ang), math.sin(ang)
            a, b = (2 * i, 2 * i + 1) if style == "normal" else (i, i + D // 2)
            x0, x1 = x[t, :, a].double(), x[t, :, b].double()
            out[t, :, a] = x0 * c - x1 * s
            out[t, :, b] = x0 * s + x1 * c
    return out


def test_rope_styles_and_scaling():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, 8, generator=g)
    pos = torch.tensor([0, 1, 7, 100, 4095])
    fac = (1.0, 2.0, 4.0, 8.0)
    for style in ("normal", "neox"):
        for scale, factors in ((1.0, None), (0.25, None), (1.0, fac)):
            cfg = RopeConfig(theta=10000.0, style=style, n_rot=8, freq_scale=scale, freq_factors=factors)
            want = slow_rope(x, pos.tolist(), 10000.0, style, scale, factors)
            torch.testing.assert_close(rope(x, pos, cfg).double(), want, atol=1e-5, rtol=1e-5)
