"""Diagnose PDL chain mismatches on the GPU: eager and graph, per output, per kernel toggled."""
import os, sys
import numpy as np
import torch
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
from kernel_data import random_weight
from minfer.ops.cuda import gemv_q8 as Q
from minfer.ops.cuda import gemv_repack as G
from minfer.ops.cuda.gemv_repack import GemvWorkspace

rng = np.random.default_rng(5)
d, f = 1024, 2048
up = G.repack(torch.from_numpy(random_weight(12, 2 * f, d, rng)).cuda(), 12, 2 * f, d)
down = G.repack(torch.from_numpy(random_weight(14, d, f, rng)).cuda(), 14, d, f)
nw = torch.randn(d, device="cuda")
x = torch.randn(1, d, device="cuda")
y = torch.randn(1, d, device="cuda").bfloat16()


def step(p, ws):
    s, h, q8 = Q.add_rms_norm_q8(x, y, nw, 1e-6, torch.bfloat16, pdl=p[0])
    gu = Q.gemv_q8(q8, up, out_dtype=torch.bfloat16, config=(32, 2, 4, 4, True), ws=ws, pdl=p[1])
    a, q8b = Q.swiglu_q8(gu[:, :f].contiguous(), gu[:, f:].contiguous(), pdl=p[2])
    o = Q.gemv_q8(q8b, down, out_dtype=torch.bfloat16, config=(32, 2, 8, 4, True), ws=ws, pdl=p[3])
    s2, h2, _ = Q.add_rms_norm_q8(s, o, nw, 1e-6, torch.bfloat16, pdl=p[4])
    return [h, q8[0], gu, a, o, s2, h2]

names = "h xq gu a o s2 h2".split()
configs = [(True,) * 5, (True, False, False, False, False), (False, True, False, False, False),
           (False, False, True, False, False), (False, False, False, True, False), (False,) * 5]
for p in configs:
    ws = GemvWorkspace("cuda")
    x.zero_(); y.zero_()
    step(p, ws)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step(p, ws)
    bad = []
    for it in range(5):
        x.normal_(); y.normal_()
        if it % 2:
            torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        ref = step((False,) * 5, GemvWorkspace("cuda"))
        torch.cuda.synchronize()
        bad.append([n for n, a, b in zip(names, outs, ref) if not torch.equal(a, b)])
    print("graph", p, bad, flush=True)
