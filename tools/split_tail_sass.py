"""The split-K tail of the 7B's Q4_K down (the Gluon q8 GEMV, [32, 2, 9, 4] -> 8 splits, the RSS + RQ 2 epilogue,
72 registers) in its sm_90 SASS, built here without a GPU: after the tile's ticket (ATOMG), the order of the
last program's loads of the splits' partial sums (L: LDG.E.STRONG) and their additions (A: FADD), branches |.
Each run of L before an A is one L2 round trip. (perf-log BA2: the runtime loop over the 8 splits issues them in 4
rounds -- one peeled, 4 unrolled, 2, 1.)
    python tools/split_tail_sass.py [maxnreg, default 72; 0: none] [gather]
gather: the Switches.split_gather build (IS_SPLIT 8: gemv_q8g_loads._split_gather), one round expected."""
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "ops"))
from kernel_data import GEMV_Q8G_TAIL  # noqa: E402

from minfer.ops.cuda import gemv_q8_gluon as GL  # noqa: E402


def main():
    regs = int(sys.argv[1]) if len(sys.argv) > 1 else 72
    gather = "gather" in sys.argv[2:]
    q6 = "q6" in sys.argv[2:]          # the Q6_K down ([32, 2, 5, 4]: 5 splits, no register cap)
    kern = GL._gemv_q8g_kernel
    names = [p.name for p in kern.params if not p.is_constexpr]
    planes = ["*i32", "*i16", "*i16", "*fp16"] if q6 else ["*i32"] * 4
    types = planes + planes + GEMV_Q8G_TAIL
    cex = dict(QT=14 if q6 else 12, QTB=14 if q6 else 12, MIXED=False, BN=32, BB=2, NW=4, IS_SPLIT=8 if gather else True, HAS_BIAS=False, HAS_RESID=False, PDL=1,
               PF=1, PRE=True, NORM=0, KP2=1, NCHP=1, RSS=True, WK=False, SF=False, TM=32, XP=True, RQ=2)
    src = GluonASTSource(kern, dict(zip(names, types)) | {c: "constexpr" for c in cex}, cex,
                         {(i,): [["tt.divisibility", 16]] for i in range(10)})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4} | ({"maxnreg": regs} if regs else {}))
    bin_ = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        sass = subprocess.run([bin_ + "/cuobjdump", "-sass", f.name], capture_output=True, text=True).stdout
        use = subprocess.run([bin_ + "/cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    print(next(x.strip() for x in use.splitlines() if "REG:" in x))
    seq, on = [], False
    for line in sass.splitlines():
        on = on or "ATOMG" in line
        if on:
            seq += ["L"] if "LDG.E.STRONG" in line else ["A"] if " FADD " in line else ["|"] if " BRA " in line else []
    print("".join(seq))
    if "sass" in sys.argv[2:]:
        open("/tmp/split_tail.sass", "w").write(sass)


if __name__ == "__main__":
    main()
