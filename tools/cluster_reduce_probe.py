"""Can a Gluon kernel (triton 3.6) sum a split tile's partials across the CTAs of a thread-block cluster (Hopper's
distributed shared memory) instead of through global memory and a ticket? Built here without a GPU for sm_90 with
num_ctas 8 (the 7B's Q4_K down has 8 K splits): an [8, 128] tensor whose axis 0 is spread over the cluster's CTAs
(BlockedLayout cga_layout), summed over axis 0 -- (a) by gl.sum directly, (b) after gl.convert_layout to a layout
replicated in every CTA. Prints each way's outcome (perf-log BB5: both refused by the 3.6 compiler).
    python tools/cluster_reduce_probe.py"""
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource


@gluon.jit
def _probe(part, out, NW: gl.constexpr, GATHER: gl.constexpr):
    L: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [1, NW], [1, 0], cga_layout=((1, 0), (2, 0), (4, 0)))
    r = gl.expand_dims(gl.arange(0, 8, layout=gl.SliceLayout(1, L)), 1)
    c = gl.expand_dims(gl.arange(0, 32 * NW, layout=gl.SliceLayout(0, L)), 0)
    v = gl.load(part + r * (32 * NW) + c)
    if GATHER:   # every CTA gets all 8 rows first (a cross-CTA layout change), then sums in-CTA
        LR: gl.constexpr = gl.BlockedLayout([8, 1], [1, 32], [1, NW], [1, 0], cga_layout=((0, 0), (0, 0), (0, 0)))
        v = gl.convert_layout(v, LR)
    L1: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0], cga_layout=((0,), (0,), (0,)))
    s = gl.convert_layout(gl.sum(v, axis=0), L1)
    gl.store(out + gl.arange(0, 32 * NW, layout=L1), s)


def main():
    for gather in (False, True):
        src = GluonASTSource(_probe, {"part": "*fp32", "out": "*fp32", "NW": "constexpr", "GATHER": "constexpr"},
                             {"NW": 4, "GATHER": gather}, {})
        way = "convert_layout, then sum" if gather else "sum over the cluster axis"
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_ctas": 8})
        except Exception as e:  # the compiler's refusal is the finding
            print(f"{way}: refused ({type(e).__name__}; the compiler's own message is printed above)")
            continue
        ptx = k.asm["ptx"]
        print(f"{way}: built; PTX mapa {ptx.count('mapa')}, shared::cluster {ptx.count('shared::cluster')}, "
              f"barrier.cluster {ptx.count('barrier.cluster')}")


if __name__ == "__main__":
    main()
