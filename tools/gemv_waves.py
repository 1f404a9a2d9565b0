"""How many waves each Gluon q8 GEMV config of the 7B runs in on an H200, from its sm_90 build
(no GPU needed: Triton compiles for sm_90 on the CPU; run without TRITON_INTERPRET).

Why (perf-log X1-X2): the decode GEMVs are bound by issue per SM, so a launch whose programs do
not all fit at once pays a second round of its slowest programs (q/k/v and o lost ~2 us a layer
each that way), and one whose programs all start at once must signal the next kernel late. This
prints, per config: registers and stack (spill) a thread, programs, programs an SM (registers,
warps, the 32-program limit), waves on 132 SMs.
    python tools/gemv_waves.py                      the shipped table's 7B shapes
    python tools/gemv_waves.py "Q4_K 3584x3584=16,16,1,4,0,0,1" ...   candidate configs too"""
import json
import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon._runtime import GluonASTSource

from minfer.ops.cuda import gemv_q8
from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda.gemv_repack import splits

SMS, REGS_SM, WARPS_SM, PROGS_SM = 132, 65536, 64, 32
NAMES = ["p0", "p1", "p2", "p3", "r0", "r1", "r2", "r3", "xq", "xf", "resid", "bias", "out", "part", "cnt",
         "N", "NA", "TA", "NB", "blocks_per_split", "SPLIT", "nx", "ny", "ng", "s_out", "eps", "nss", "ydt", "ssp", "tlb",
         "th", "tq", "tf"]
PLANES = {12: ["*i32", "*i16", "*i32", "*i32"], 14: ["*i32", "*i16", "*i16", "*fp16"]}
MIXED = {"Q4_K 4608x3584"}           # the 7B's q/k/v: its v is Q6_K in some layers (a second segment), a
                                     # separate build from the all-Q4_K layers': both are listed


def cuobjdump() -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def usage(kernel) -> tuple:
    """(registers, stack bytes) of a compiled kernel's cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    try:
        out = subprocess.run([cuobjdump(), "-res-usage", f.name], capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    line = next(x for x in out.splitlines() if "REG:" in x)
    fields = dict(kv.split(":") for kv in line.split() if ":" in kv)
    return int(fields["REG"]), int(fields["STACK"])


def build(key: str, cfg: tuple, mixed: bool):
    qt = 12 if key.startswith("Q4_K") else 14
    n, k = (int(v) for v in key.split()[1].split("x"))
    bn, bb, split, nw = cfg[:4]
    pf, regs, _ = gemv_q8.extras(cfg)
    _, split = splits(k // 256, split, bb)
    second = PLANES[14] if mixed else PLANES[qt]
    types = PLANES[qt] + second + ["*i32", "*fp32", "*fp32", "*fp32", "*bf16", "*fp32", "*i32"] + ["i32"] * 6 + \
        ["*fp32", "*bf16", "*fp32", "*fp32", "fp32", "i32", "*bf16", "*fp32", "*i64", "*bf16", "*i32", "*fp32",
        "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32", "i64", "i32", "i32"]
    cex = dict(QT=qt, QTB=14 if mixed else qt, MIXED=mixed, BN=bn, BB=bb, NW=nw, IS_SPLIT=split > 1,
               HAS_BIAS=mixed, HAS_RESID=False, PDL=1, PF=GL._pf(pf), PRE=True, NORM=0, KP2=1, NCHP=1, RSS=False,
               WK=gemv_q8.kwarps(cfg), SF=mixed and gemv_q8.second_first(cfg), XP=gemv_q8.x_ahead(cfg),
               TM=bn if len(cfg) > 9 and cfg[9] else 0)
    sig = dict(zip(NAMES, types)) | {c: "constexpr" for c in cex}
    src = GluonASTSource(GL._gemv_q8g_kernel, sig, cex, {(i,): [["tt.divisibility", 16]] for i in range(15)})
    kern = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": nw, **({"maxnreg": regs} if regs else {})})
    return kern, triton.cdiv(n, bn) * split, nw


def per_sm(regs: int, warps: int, smem: int) -> int:
    """Programs of `warps` warps at `regs` registers a thread that fit one SM (registers are given
    out per warp in 256s; shared memory: 228 KB an SM, 1 KB of it reserved for each program)."""
    per_warp = -(-regs * 32 // 256) * 256
    fit = min(REGS_SM // (per_warp * warps), WARPS_SM // warps, PROGS_SM)
    return min(fit, (228 * 1024) // (smem + 1024)) if smem else fit


def main():
    with open(GL._TABLE) as f:
        table = {k: tuple(v) for k, v in json.load(f)["configs"].items()}
    rows = [(k, v, "table") for k, v in table.items()]
    for arg in sys.argv[1:]:
        key, cfg = arg.split("=")
        vals = [int(v) for v in cfg.split(",")]
        rows.append((key, tuple(vals), "candidate"))
    print("| shape | config | from | registers | stack | programs | an SM | waves |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for key, cfg, src in rows:
        for mixed in ((False, True) if key in MIXED else (False,)):
            kern, progs, nw = build(key, cfg, mixed)
            regs, stack = usage(kern)
            fit = per_sm(regs, nw, kern.metadata.shared)
            name = key + (" + Q6_K v" if mixed else "")
            print(f"| {name} | {list(cfg)} | {src} | {regs} | {stack} | {progs} | {fit} | {progs / (fit * SMS):.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
