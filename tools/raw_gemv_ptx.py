"""The raw-block GEMV's sm_90 build, instruction by instruction class, on a machine without a GPU (perf-log
AY3): for each type / tile / read mode, the global loads by width, the shared-memory loads and stores (layout
conversions), the barriers, ptxas's registers and spills. Pointers and the K / stride arguments are
specialized as Triton does at run time (divisible by 16), so the x loads vectorize as they will on the GPU.
    python tools/raw_gemv_ptx.py [--types Q5_0,Q8_0,Q4_0] [--bn 4,8] [--rn]"""
import argparse
import collections
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from minfer.ops.cuda import gemv as G
from minfer.ops.cuda.dequant import LAYOUT

QT = {"Q4_0": 2, "Q5_0": 6, "Q8_0": 8}
NAMES = ["raw", "x", "out", "part", "bias", "M", "N", "K", "row_bytes", "stride_xm", "stride_om", "tiles_per_split",
         "nx", "ny", "ng", "s_out", "eps", "h_rn", "cnt"]
TYPES = ["*u8", "*bf16", "*bf16", "*fp32", "*fp32"] + ["i32"] * 7 + ["*fp32", "*bf16", "*fp32", "*fp32", "fp32",
                                                                     "*bf16", "*i32"]
ALIGNED = ["raw", "x", "out", "K", "stride_xm"]          # (row_bytes is no multiple of 16 for these types)


def build(qt: int, bn: int, hw: bool, rn: bool) -> dict:
    _, qk, ts = LAYOUT[qt]
    cex = dict(QT=qt, QK=qk, TS=ts, BN=bn, BK=1024, MP=1, SPLIT=1, HAS_BIAS=False, USE_DOT=False, IEEE=False, PDL=1,
               ONE=True, HW=hw, RN=rn, BD=1024)
    sig = dict(zip(NAMES, TYPES)) | {c: "constexpr" for c in cex}
    attrs = {(NAMES.index(a),): [["tt.divisibility", 16]] for a in ALIGNED}
    k = triton.compile(ASTSource(G._gemv_kernel, sig, cex, attrs=attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": 4})
    ptx = k.asm["ptx"]
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", f.name, "-o", os.devnull], capture_output=True, text=True)
    os.unlink(f.name)
    return {"global loads": dict(collections.Counter(re.findall(r"\bld\.global[.\w]*", ptx))),
            "shared ld/st": len(re.findall(r"\b(?:ld|st)\.shared", ptx)),
            "barriers": len(re.findall(r"\bbar\.sync|\bbarrier\.sync", ptx)),
            "registers": int((re.findall(r"Used (\d+) registers", r.stderr) or ["-1"])[0]),
            "spill bytes": int((re.findall(r"(\d+) bytes spill stores", r.stderr) or ["0"])[0])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--types", default="Q5_0,Q8_0,Q4_0")
    ap.add_argument("--bn", default="4,8", help="one-pass tile rows (BK 1024)")
    ap.add_argument("--rn", action="store_true", help="with the residual norm epilogue (Switches.gemv_raw_resnorm)")
    args = ap.parse_args()
    print("| type | BN | reads | global loads | shared ld/st | barriers | registers | spill bytes |")
    print("|---|---:|---|---|---:|---:|---:|---:|")
    for name in args.types.split(","):
        for bn in (int(b) for b in args.bn.split(",")):
            for hw in (False, True):
                s = build(QT[name], bn, hw, args.rn)
                print(f"| {name} | {bn} | {'halfwords' if hw else 'bytes'} | {s['global loads']} | {s['shared ld/st']} "
                      f"| {s['barriers']} | {s['registers']} | {s['spill bytes']} |")


if __name__ == "__main__":
    main()
