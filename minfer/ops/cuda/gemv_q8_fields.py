"""The optional fields of a q8 GEMV config after (BN, BB, SPLIT, warps) (gemv_q8.py's tables and the
Gluon kernel's, gemv_q8_gluon.py), read the same way by the launches and the tools."""

from __future__ import annotations


def extras(cfg) -> tuple:
    """A config's optional fields after (BN, BB, SPLIT, warps): prefetch (default on; 2, the Gluon
    kernel only: both steps of a two-step split loaded before the PDL wait -- 0 / 1 / 2 as an int),
    the Gluon kernel's register cap (0: the compiler's choice) and late (this shape signals the next
    kernel when its programs end; gemv_q8_gluon's module doc)."""
    return (int(cfg[4]) if len(cfg) > 4 else 1, int(cfg[5]) if len(cfg) > 5 else 0,
            len(cfg) > 6 and bool(cfg[6]))


def kwarps(cfg) -> bool:
    """A Gluon config's eighth field: its warps split each step's chunks instead of its rows
    (gemv_q8_gluon._tile's WK; the plain launch only)."""
    return len(cfg) > 7 and bool(cfg[7])


def x_ahead(cfg) -> bool:
    """A Gluon config's eleventh field: the q8 row's words and scales of the next step load with
    its weights, one step ahead (gemv_q8_gluon._tile's XP; ~11 registers a thread more). (The
    tenth field is the planes' layout, read at load: plane_layout.tile_rows_for.)"""
    return len(cfg) > 10 and bool(cfg[10])


def second_first(cfg) -> bool:
    """A Gluon config's ninth field: in a launch over two weights (q/k + a v of another type), the
    second weight's row tiles take the lowest program ids (gemv_q8_gluon's SF), so its slower rows
    start in the first wave; ignored for one weight."""
    return len(cfg) > 8 and bool(cfg[8])
