"""Where the raw q/k/v GEMV's rope epilogue (gemv_raw_rope.py) and the GEMV + rope_kv kernel disagree (perf-log CC1):
tests/gpu/test_gemv_raw_rope_gpu.py's launches over seeded activations, every case; per mismatch the tensor, its
count, the head value's half (first / second of a pair), the bf16 ulp distance, and which side is nearer the float64
rotation of the reference GEMV's rounded outputs (that rotation in float64 on the host).
    python tools/rope_epilogue_diag.py [--seeds 40]"""
import argparse
import collections
import os
import sys

import torch
from gguf import GGMLQuantizationType as T

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "gpu"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
from test_kernels_gpu import make_weight  # noqa: E402

from minfer.config import RopeConfig  # noqa: E402
from minfer.ops import reference  # noqa: E402
from minfer.ops.cuda import gemv  # noqa: E402
from minfer.ops.cuda.norm_rope_act import _turns, rope_kv_write  # noqa: E402

DEV = "cuda"


def ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    ia, ib = (t.view(torch.int16).to(torch.int32) for t in (a, b))
    ia = torch.where(ia < 0, -32768 - ia, ia)
    ib = torch.where(ib < 0, -32768 - ib, ib)
    return (ia - ib).abs()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=40)
    args = ap.parse_args()
    tally = collections.Counter()
    for qt in (T.Q5_0, T.Q8_0):
        for style, hd in (("neox", 64), ("normal", 64), ("neox", 128)):
            for hw in (False, True):
                for pdl in (0, 1):
                    nq, nk, k = 14 * hd, 2 * hd, 896
                    n = nq + 2 * nk
                    w, _ = make_weight(int(qt), n, k, seed=n + int(qt))
                    cfg = RopeConfig(theta=1e6, style=style, n_rot=hd)
                    bias = torch.randn(n, device=DEV, generator=torch.Generator(DEV).manual_seed(7))
                    pos = torch.tensor([5], device=DEV)
                    kc, vc = (torch.zeros(300, 2, hd, device=DEV, dtype=torch.bfloat16) for _ in range(2))
                    rope = (pos, _turns(cfg, DEV), kc, vc, nq, nk, hd, style == "neox")
                    case = f"{qt.name} {style} {hd} hw={int(hw)} pdl={pdl}"
                    bad = 0
                    for seed in range(args.seeds):
                        g = torch.Generator(DEV).manual_seed(seed)
                        x = torch.randn(1, k, device=DEV, dtype=torch.bfloat16, generator=g)
                        p = [5, 6, 299, 17, 200][seed % 5]
                        pos.fill_(p)
                        kc.zero_()
                        vc.zero_()
                        q = gemv.gemv(x, w.raw, int(qt), n, k, bias=bias, one_pass=True, pdl=pdl, halfwords=hw,
                                      rope=rope)[:, :nq]
                        y = gemv.gemv(x, w.raw, int(qt), n, k, bias=bias, one_pass=True, halfwords=hw)
                        kc2, vc2 = torch.zeros_like(kc), torch.zeros_like(vc)
                        q2 = rope_kv_write(y[:, :nq].view(1, nq // hd, hd), y[:, nq:nq + nk].view(1, 2, hd),
                                           y[:, nq + nk:].view(1, 2, hd), pos, cfg, kc2, vc2).reshape(1, nq)
                        torch.cuda.synchronize()
                        # float64 rotation of the reference GEMV's rounded q rows (reference.inv_freq's angles)
                        yq = y[0, :nq].double().view(nq // hd, hd).cpu()
                        ang = p * reference.inv_freq(cfg).double()
                        c, s = torch.cos(ang), torch.sin(ang)
                        if style == "neox":
                            a, b = yq[:, :hd // 2], yq[:, hd // 2:]
                            exact = torch.cat([a * c - b * s, a * s + b * c], 1)
                        else:
                            a, b = yq[:, 0::2], yq[:, 1::2]
                            exact = torch.stack([a * c - b * s, a * s + b * c], 2).reshape(nq // hd, hd)
                        exact = exact.reshape(1, nq)
                        for name, t1, t2 in (("q", q, q2), ("k", kc[p], kc2[p]), ("v", vc[p], vc2[p])):
                            d = (t1 != t2).reshape(-1)
                            if not d.any():
                                continue
                            bad += 1
                            idx = d.nonzero().reshape(-1)
                            u = ulps(t1.reshape(-1)[idx], t2.reshape(-1)[idx])
                            line = f"{case} seed {seed} pos {p}: {name} {idx.numel()} differ, ulps {u.tolist()[:8]}"
                            if name == "q":
                                e = exact.reshape(-1)[idx.cpu()]
                                f1 = (t1.reshape(-1)[idx].double().cpu() - e).abs()
                                f2 = (t2.reshape(-1)[idx].double().cpu() - e).abs()
                                j = (idx % hd).tolist()[:8]
                                line += (f"; at head values {j}; fused nearer {int((f1 < f2).sum())}, reference nearer "
                                         f"{int((f2 < f1).sum())}; values fused {t1.reshape(-1)[idx][:4].tolist()} "
                                         f"reference {t2.reshape(-1)[idx][:4].tolist()}; y {y[0, idx][:4].tolist()}")
                            print(line, flush=True)
                            tally[(case, name)] += 1
                    print(f"{case}: {bad} of {args.seeds} seeds with a mismatch", flush=True)
    print("tally:", dict(tally))


if __name__ == "__main__":
    main()
