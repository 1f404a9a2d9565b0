"""Which repacked weights the engine keeps tile-major (issue 12), and the switch between layouts.

The decode GEMV of the 7B's down projection (3584 x 18944) reads its planes as 32 rows x 256
bytes a step, rows 9,472 bytes apart; a load-only kernel with exactly those loads takes as long
as the GEMV itself (13.6-14.5 us against 13.9), while the same bytes with each program's run
contiguous take 11.2-12.5 (tools/down_sol.py, perf-log AF1). The real GEMV gains from it only
with the q8 row loaded one step ahead too (the config's eleventh field; alone, each moves it by
0-0.4 us, together 13.9 -> 12.3 us PDL-chained; in the 7B step +8 / +14 us, perf-log AF3-AF6).
gemv_repack_layout.to_tiles keeps the same bits in that order (tile of T rows, block after
block); every kernel that reads the planes addresses both layouts (their TM constexpr), so the
layout is a storage choice, not a kernel choice.

A Gluon table config's tenth field asks for it (gemv_q8g_h200.json: the shapes where it was
measured faster); the tile height is the config's BN. A fused group (gate+up: one GEMV over the
stacked planes, each weight a row view of them) is laid out as one, by its stacked shape's config,
where the tiles do not cut a member's rows; its members' views are re-made on the new planes
(the 7B's gate+up: 21.6 -> 19.4 us a layer in the step, perf-log AM5). Switches.gemv_tiles turns
it off; the engine applies the layout at load and again when an A/B changes the switches
(Engine.set_switches), one weight or group at a time, so at most one weight's or group's planes
are held twice."""

from __future__ import annotations

from minfer.ops.cuda import gemv_q8_gluon as GL
from minfer.ops.cuda.gemv_q8g_table import table_arg
from minfer.ops.cuda.gemv_repack_layout import planes_of, to_rows, to_tiles


def tile_rows_for(qtype: int, n: int, k: int, table: str = "") -> int:
    """The tile height the Gluon table asks this shape's planes to be stored in (0: row-major)."""
    cfg = GL.config_for(qtype, n, k, table)
    return int(cfg[0]) if cfg is not None and len(cfg) > 9 and cfg[9] else 0


def _experts(w) -> bool:
    """A stacked expert weight (load_experts: (E*N, K), n_experts set): gemv_q8_experts and the
    batched experts' w4 builder read its planes row-major, whatever shape class the Gluon table's
    rule puts (E*N) x K in (Qwen3-30B-A3B's gate experts, 98304 x 2048, look like a gate+up)."""
    return bool(getattr(w, "n_experts", 0))


def _owns_planes(rw) -> bool:
    """Whether the planes are whole tensors (not row views of a fused group's planes, whose
    layout is the group's)."""
    return all(p.untyped_storage().nbytes() == p.numel() * p.element_size() and p.storage_offset() == 0
               for p in rw.planes)


def wanted(rw, switches, device, n: int = 0) -> int:
    """The tile rows these planes should have under `switches` on `device` (n: the rows of the
    launch they are read in, when more than theirs: a mixed pair's, keyed by its first type)."""
    if not switches.gemv_tiles or GL.device_unsupported(device) is not None:
        return 0
    return tile_rows_for(rw.qtype, n or rw.n, rw.k, table_arg(switches))


def apply(weights, switches, device) -> int:
    """Give each repacked weight that owns its planes, each fused group's planes (a group's first
    weight holds `repacked_group`: gemv_repack_layout.fuse_group) and each mixed pair's two plane
    sets (`repacked_segments`, one layout for both) the layout `switches` ask for; returns how many
    weights, groups and pairs changed layout (the caller drops anything that captured the old
    planes' addresses, e.g. CUDA graphs)."""
    changed = 0
    weights = list(weights)
    # the members of a mixed pair (q/k in one type + a v of another, one launch) take the pair's layout
    paired = {id(m) for w in weights for m in getattr(w, "repacked_segments", ((),))[0]}
    for w in weights:
        rw = planes_of(w)
        if rw is None or not _owns_planes(rw) or id(w) in paired or _experts(w):
            continue
        t = wanted(rw, switches, device)
        if rw.tile_rows == t:
            continue
        w.repacked = _relaid(rw, t)
        del rw
        changed += 1
    for w in weights:
        grp = getattr(w, "repacked_group", None)
        if grp is not None and grp[0][0] is w and _group(grp, switches, device):
            changed += 1
        seg = getattr(w, "repacked_segments", None)
        if seg is not None and seg[0][0] is w and _pair(seg, switches, device):
            changed += 1
    return changed


def _relaid(rw, t: int):
    """rw's planes in tile rows t (0: row-major)."""
    rows = to_rows(rw)
    return to_tiles(rows, t) if t else rows


def _views(members, planes) -> None:
    """Each member's `repacked`: its rows of the stacked planes, in order."""
    r0 = 0
    for m in members:
        n = planes_of(m).n
        m.repacked = planes.rows(r0, r0 + n)
        r0 += n


def _group(grp, switches, device) -> bool:
    """A fused group's planes (the 7B's gate+up: one GEMV over both weights' rows) in the layout
    its shape's config asks for, and each member's row view re-made on the new planes; a tile
    height that would cut a member's rows leaves the group as it is. Whether it changed."""
    ws, cat = grp
    t = wanted(cat, switches, device)
    if cat.tile_rows == t or (t and any(planes_of(m).n % t for m in ws)):
        return False
    new = _relaid(cat, t)
    ws[0].repacked_group = (ws, new)
    _views(ws, new)
    return True


def _pair(seg, switches, device) -> bool:
    """A mixed pair (gemv_repack_layout.fuse_group's repacked_segments: the leading weights of one
    type fused, the last weight of another, multiplied in one launch that needs one layout for both
    plane sets, gemv_repack_layout.common_tile_rows) in the layout of the launch's shape (its first
    type, all its rows: the key the Gluon table gives the pair), the leading members' row views
    re-made; a tile height that would cut a member's rows leaves the pair as it is. Whether it changed."""
    ws, (lead, last) = seg
    t = wanted(lead, switches, device, lead.n + last.n)
    if (lead.tile_rows == t and last.tile_rows == t) or (t and any(planes_of(m).n % t for m in ws)):
        return False
    new_lead, new_last = _relaid(lead, t), _relaid(last, t)
    ws[0].repacked_segments = (ws, (new_lead, new_last))
    _views(ws[:-1], new_lead)          # (one leading weight: its whole planes, rows(0, n))
    ws[-1].repacked = new_last
    return True
