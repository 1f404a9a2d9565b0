"""The repacked Q4_K / Q6_K layout of the decode GEMV (gemv_repack.py): repack, CPU decode, validator.

Each weight is rewritten once at load into planes made for the GEMV, keeping every bit (the
planes REPLACE the raw blocks on the GPU):

  Q4_K (per 256-value block, 148 B instead of 144):
    qs  int32 (N, NB*32)  chunk c = values 32c..32c+31 of the row (one Q4_K sub-block, one
                          scale): 4 words w = 0..3, nibble p = 0..7 of word w holds value
                          32c + 4p + w. A thread loads one chunk as ONE 16-byte load.
    scm int16 (N, NB*8)   sub-block scale | min << 8 (the 6-bit sc and m of get_scale_min_k4,
                          unpacked: 4 bytes more per block than the 12 packed ones)
    dm  f16   (N, NB*2)   d, dmin
  Q6_K (210 B, as raw):
    ql  int32 (N, NB*32)  the low 4 bits, laid out as Q4_K's qs
    qh  int16 (N, NB*32)  chunk c: halfword w, bits 2p..2p+1 = high 2 bits of value 32c+4p+w
    sc  int8  (N, NB*16)  the 16 scales (scale 2c for p < 4, 2c+1 for p >= 4)
    d   f16   (N, NB)

      row n:  | chunk 0 (16 B) | chunk 1 | ... | chunk 8*NB-1 |     (qs / ql)
      chunk:  word0 word1 word2 word3         word w, nibble p -> value 4p + w
              x[4p..4p+3] pairs with nibble p of words 0..3

Exactness: d*sc (f16 x 6-bit, 17 bits) and dmin*m are exact in fp32, so d/dmin stay f16 and
sc/m stay integers (an fp16 d*sc would not be exact); `check_repacked` proves the planes
dequantize bit for bit to minfer.quants' float32 values (= gguf's).
"""


from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minfer.errors import MinferError

Q4_K, Q6_K = 12, 14                      # ggml type ids (ggml.h enum ggml_type)
REPACKED_TYPES = {Q4_K: "Q4_K", Q6_K: "Q6_K"}
PLANE_NAMES = {Q4_K: ("qs", "scm", "dm"), Q6_K: ("ql", "qh", "sc", "d")}
BLOCK_BYTES = {Q4_K: 144, Q6_K: 210}     # raw bytes per 256 values (ggml-common.h)
REPACKED_BLOCK_BYTES = {Q4_K: 148, Q6_K: 210}


def is_repacked_type(qtype: int) -> bool:
    """True for the types this module repacks (Q4_K, Q6_K); every other type keeps the raw GEMV."""
    return qtype in REPACKED_TYPES


@dataclass
class Repacked:
    """A weight's repacked planes (see the module doc), on the weight's device."""
    qtype: int
    n: int
    k: int
    planes: tuple
    tile_rows: int = 0          # 0: row-major planes; T: tile-major in tiles of T rows (to_tiles)

    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes)

    def rows(self, r0: int, r1: int) -> "Repacked":
        """Rows r0..r1 (views of every plane), e.g. the lm head in scratch-sized chunks; in a
        tile-major layout r0 and r1 must fall on tile boundaries."""
        t = self.tile_rows
        if t and (r0 % t or (r1 % t and r1 != self.n)):
            raise MinferError(f"gemv_repack: rows {r0}..{r1} of tile-major planes ({t}-row tiles) cut a tile")
        return Repacked(self.qtype, r1 - r0, self.k, tuple(p[r0:r1] for p in self.planes), t)


def to_tiles(rw: Repacked, t: int) -> Repacked:
    """The same planes in tile-major order: for each tile of t rows, block b's entries of its rows
    (row by row), then block b + 1. A plane keeps its (N, NB * E) shape and bytes (E entries a
    row and block); block b of row r is the plane's (E-entry) element ((r // t) * NB + b) * t + r % t.
    A GEMV program of t rows then reads one contiguous run per K range (tools/down_sol.py: the 7B
    down's planes read in 11.9 us tile-major against 13.6-14.5 row-major, load-only)."""
    if rw.tile_rows:
        raise MinferError("gemv_repack: the planes are already tile-major")
    if t < 1 or rw.n % t:
        raise MinferError(f"gemv_repack: {rw.n} rows do not split into {t}-row tiles")
    nb = rw.k // 256
    planes = tuple(p.view(rw.n // t, t, nb, -1).transpose(1, 2).contiguous().view(p.shape) for p in rw.planes)
    return Repacked(rw.qtype, rw.n, rw.k, planes, t)


def common_tile_rows(segs) -> int:
    """The one plane layout of weights launched together (their tile_rows; 0: row-major)."""
    t = {r.tile_rows for r in segs}
    if len(t) != 1:
        raise MinferError("gemv_repack: weights launched together need one plane layout (row-major or tile-major "
                          f"with one tile height), got tile rows {sorted(t)}")
    return t.pop()


def to_rows(rw: Repacked) -> Repacked:
    """The row-major planes of a tile-major Repacked (the inverse of to_tiles; itself if row-major)."""
    t = rw.tile_rows
    if not t:
        return rw
    nb = rw.k // 256
    planes = tuple(p.view(rw.n // t, nb, t, -1).transpose(1, 2).contiguous().view(p.shape) for p in rw.planes)
    return Repacked(rw.qtype, rw.n, rw.k, planes)


# ---------------------------------------------------------------- repack (torch, any device)

def _pack_words(q: torch.Tensor, bits: int) -> torch.Tensor:
    """q (..., 8 chunks, 32) small ints -> (..., 8, 4) int64: entry [c, w] = OR_p q[c, 4p + w] << bits*p."""
    q = q.to(torch.int64).unflatten(-1, (8, 4))                      # [..., c, p, w]
    sh = (torch.arange(8, device=q.device, dtype=torch.int64) * bits).view(8, 1)
    return (q << sh).sum(-2)


def _wrap(v: torch.Tensor, bits: int, dtype) -> torch.Tensor:
    """Unsigned `bits`-bit values (int64) -> the signed `dtype` with the same bit pattern."""
    return (v - ((v >> (bits - 1)) & 1) * (1 << bits)).to(dtype)


def _repack_rows(raw: torch.Tensor, qtype: int) -> tuple:
    """raw uint8 (R, NB*ts) -> planes for R rows."""
    r = raw.shape[0]
    b = raw.view(r, -1, BLOCK_BYTES[qtype])
    nb = b.shape[1]
    if qtype == Q4_K:
        # ggml-common.h block_q4_K: d f16 | dmin f16 | scales[12] | qs[128];
        # value 64j + 32s + l = nibble s of qs[32j + l]: sub-block 2j + s (ggml-quants.c)
        dm = b[:, :, 0:4].contiguous().view(torch.float16).reshape(r, nb * 2)
        s = b[:, :, 4:16].to(torch.int32)
        a, bb, c = s[..., 0:4], s[..., 4:8], s[..., 8:12]
        # get_scale_min_k4 (ggml-quants.c): sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7,
        # 4-7 from the nibbles of bytes 8-11 and the top 2 bits of bytes 0-3 / 4-7
        sc = torch.cat([a & 63, (c & 15) | ((a >> 6) << 4)], -1)
        mn = torch.cat([bb & 63, (c >> 4) | ((bb >> 6) << 4)], -1)
        scm = (sc | (mn << 8)).to(torch.int16).reshape(r, nb * 8)
        qs = b[:, :, 16:144].view(r, nb, 4, 1, 32)
        q = torch.cat([qs & 15, qs >> 4], 3).reshape(r, nb, 8, 32)      # [sub-block 2j+s, l]
        words = _wrap(_pack_words(q, 4), 32, torch.int32).reshape(r, nb * 32)
        return words, scm, dm
    # ggml-common.h block_q6_K: ql[128] | qh[64] | scales int8[16] | d f16;
    # value 128h + 32g + l: low 4 bits = nibble g//2 of ql[64h + 32(g%2) + l],
    # high 2 bits = bits 2g.. of qh[32h + l]  (ggml-quants.c dequantize_row_q6_K)
    ql = b[:, :, 0:128].view(r, nb, 2, 2, 32)                           # [h, g%2, l]
    # nibble g//2 of the byte: stacking it before the g%2 axis orders chunks as 4h + g
    low = torch.stack([ql & 15, ql >> 4], 3).reshape(r, nb, 8, 32)       # [4h + g, l]
    qh = b[:, :, 128:192].view(r, nb, 2, 1, 32)
    sh = torch.arange(4, device=raw.device, dtype=torch.uint8).view(1, 1, 1, 4, 1) * 2
    high = ((qh >> sh) & 3).reshape(r, nb, 8, 32)
    words = _wrap(_pack_words(low, 4), 32, torch.int32).reshape(r, nb * 32)
    halves = _wrap(_pack_words(high, 2), 16, torch.int16).reshape(r, nb * 32)
    sc = b[:, :, 192:208].contiguous().view(torch.int8).reshape(r, nb * 16)
    d = b[:, :, 208:210].contiguous().view(torch.float16).reshape(r, nb)
    return words, halves, sc, d


def repack(raw: torch.Tensor, qtype: int, n: int, k: int, rows_per_step: int = 4096) -> Repacked:
    """Raw blocks uint8 (n, k/256 * block bytes) -> Repacked, on raw's device (row chunks keep
    the int64 temporaries small: ~64 bytes per value of a chunk)."""
    if qtype not in REPACKED_TYPES:
        raise MinferError(f"gemv_repack: ggml type {qtype} is not repacked (only {sorted(REPACKED_TYPES.values())})")
    if k % 256 or tuple(raw.shape) != (n, k // 256 * BLOCK_BYTES[qtype]) or raw.dtype != torch.uint8:
        raise MinferError(f"gemv_repack: raw {REPACKED_TYPES[qtype]} blocks of shape {tuple(raw.shape)} "
                          f"{raw.dtype}, expected uint8 ({n}, {k // 256 * BLOCK_BYTES[qtype]}) with k % 256 == 0")
    parts = [_repack_rows(raw[r0:r0 + rows_per_step], qtype) for r0 in range(0, n, rows_per_step)]
    planes = tuple(torch.cat([p[i] for p in parts]) if len(parts) > 1 else parts[0][i].contiguous()
                   for i in range(len(parts[0])))
    return Repacked(qtype, n, k, planes)


# ---------------------------------------------------------------- CPU decode of the planes + validator

def dequantize_planes(rw: Repacked) -> np.ndarray:
    """float32 (n, k) from the planes alone, in ggml's operation order ((d*sc)*q - dmin*m)."""
    p = [t.cpu().numpy() for t in to_rows(rw).planes]
    n, nb = rw.n, rw.k // 256
    sh = np.arange(8, dtype=np.int64).reshape(1, 1, 8, 1)
    if rw.qtype == Q4_K:
        words, scm, dm = p
        w = words.view(np.uint32).astype(np.int64).reshape(n, nb * 8, 1, 4)
        q = ((w >> (4 * sh)) & 15).reshape(n, nb * 8, 32)                # value 4p + w of each chunk
        scm = scm.view(np.uint16).reshape(n, nb * 8, 1)
        dm = dm.astype(np.float32).reshape(n, nb, 1, 2)
        d, dmin = dm[..., 0], dm[..., 1]                                 # (n, nb, 1)
        dl = (d * (scm & 255).astype(np.float32).reshape(n, nb, 8)).reshape(n, nb * 8, 1)
        ml = (dmin * (scm >> 8).astype(np.float32).reshape(n, nb, 8)).reshape(n, nb * 8, 1)
        out = q.astype(np.float32) * dl
        out -= ml
        return out.reshape(n, rw.k)
    words, halves, sc, d = p
    w = words.view(np.uint32).astype(np.int64).reshape(n, nb * 8, 1, 4)
    h = halves.view(np.uint16).astype(np.int64).reshape(n, nb * 8, 1, 4)
    q = (((w >> (4 * sh)) & 15) | (((h >> (2 * sh)) & 3) << 4)).reshape(n, nb * 16, 16) - 32
    dl = (d.astype(np.float32).reshape(n, nb, 1) * sc.astype(np.float32).reshape(n, nb, 16)).reshape(n, nb * 16, 1)
    return (q.astype(np.float32) * dl).reshape(n, rw.k)


def check_repacked(raw, planes, qtype: int, name: str = "weight") -> None:
    """Byte-exact validator: the planes (a Repacked or its tuple) must dequantize to exactly
    the float32 bits minfer.quants gives for the raw blocks. MinferError naming the first bad
    row/column otherwise."""
    from minfer.quants import dequantize

    raw_np = raw.cpu().numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    n = raw_np.shape[0]
    k = raw_np.shape[1] // BLOCK_BYTES[qtype] * 256
    rw = planes if isinstance(planes, Repacked) else Repacked(qtype, n, k, tuple(planes))
    want_shapes = _plane_shapes(qtype, n, k)
    got_shapes = [tuple(t.shape) for t in rw.planes]
    if got_shapes != want_shapes:
        raise MinferError(f"{name}: repacked {REPACKED_TYPES[qtype]} planes have shapes {got_shapes}, expected {want_shapes}")
    ref = dequantize(raw_np.reshape(-1), qtype, (n, k)).astype(np.float32)
    got = dequantize_planes(rw)
    bad = np.nonzero(ref.view(np.uint32) != got.view(np.uint32))
    if bad[0].size:
        r, c = int(bad[0][0]), int(bad[1][0])
        raise MinferError(f"{name}: repacked {REPACKED_TYPES[qtype]} value [{r}, {c}] is {got[r, c]!r}, the raw "
                          f"blocks give {ref[r, c]!r} ({bad[0].size} values differ)")


def _plane_shapes(qtype, n, k):
    nb = k // 256
    if qtype == Q4_K:
        return [(n, nb * 32), (n, nb * 8), (n, nb * 2)]
    return [(n, nb * 32), (n, nb * 32), (n, nb * 16), (n, nb)]



def reference_gemv(x, w, bias=None, resid=None, norm_weight=None, eps: float = 1e-6, up=None):
    """The torch definition the kernel is tested against: w (N, K) dense (e.g. gguf's dequant)."""
    xin = x.double()
    if up is not None:
        xin = torch.nn.functional.silu(xin) * up.double()
    if norm_weight is not None:
        xin = xin * torch.rsqrt(xin.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.double()
    out = xin @ w.double().T
    if bias is not None:
        out = out + bias.double()
    if resid is not None:
        out = out + resid.double()
    return out


# ---------------------------------------------------------------- the engine's weights

def planes_of(w) -> Repacked | None:
    """The Repacked planes of a QWeight (None: it still holds its raw blocks)."""
    return getattr(w, "repacked", None)


def repack_weight(w, validate: bool = False) -> None:
    """Replace a Q4_K/Q6_K QWeight's raw blocks by its planes: `w.repacked` (a Repacked; like
    the batch engine's `w.batch_dense`, an attribute QWeight.nbytes does not see, so the load
    report adds it: ops/cuda memory_report) and w.raw becomes an (N, 0) tensor.
    validate: check_repacked against the raw blocks first (on the CPU: slow)."""
    n, k = w.shape
    rw = repack(w.raw, w.qtype, n, k, rows_per_step=1024)
    if validate:
        check_repacked(w.raw, rw, w.qtype, name=w.name)
    w.repacked = rw
    w.raw = w.raw.new_empty((n, 0))


def repack_model(model, validate: bool = False) -> int:
    """Repack every Q4_K/Q6_K matrix (Switches.gemv_repack, at load) but the token embedding
    (a row gather over the raw blocks, also a tied lm head). Stacked MoE experts are repacked
    too: ops.moe_ffn multiplies the selected experts' rows in place by the int8 GEMV and
    decodes the planes whole for prefill. Returns the weights repacked."""
    embd = getattr(model, "token_embd", None)
    done = 0
    for w in model.qweights():
        if not is_repacked_type(w.qtype) or planes_of(w) is not None:
            continue
        if w is embd or w.name.startswith("token_embd"):
            w.repack_skip = "the token embedding (row gathers read its raw blocks)"
        else:
            repack_weight(w, validate)
            done += 1
    groups = getattr(model, "decode_groups", None) or getattr(model, "linear_groups", lambda: [])
    for g in groups():
        fuse_group(tuple(g))
    return done


def fuse_group(ws: tuple) -> bool:
    """One plane set for a declared group (q/k/v) of repacked weights of one type and K, so the
    decode multiplies them in one GEMV (qmatmul.linear_many); each weight keeps a row view of
    it (`w.repacked`), so the memory is the same. The group's first weight holds
    `repacked_group = (ws, Repacked)`. Mixed types (a Q6_K attn_v) stay apart."""
    rws = [planes_of(w) for w in ws]
    if len(ws) < 2 or any(r is None for r in rws) or len({r.k for r in rws}) != 1:
        return False
    if len({r.qtype for r in rws}) != 1:
        # mixed types (q/k in Q4_K, v in Q6_K): a leading run of one type fused, the rest one
        # weight; the int8 decode GEMV multiplies the two segments in one launch
        # (`repacked_segments`, gemv_q8.gemv_q8 with a pair); other paths go weight by weight
        n_lead = next(i for i, r in enumerate(rws) if r.qtype != rws[0].qtype)
        if n_lead + 1 != len(ws):
            return False
        if n_lead > 1:
            fuse_group(ws[:n_lead])
            lead = ws[0].repacked_group[1]
            del ws[0].repacked_group
        else:
            lead = rws[0]
        ws[0].repacked_segments = (ws, (lead, rws[-1]))
        return True
    cat = Repacked(rws[0].qtype, sum(r.n for r in rws), rws[0].k,
                   tuple(torch.cat([r.planes[i] for r in rws]) for i in range(len(rws[0].planes))))
    r0 = 0
    for w, r in zip(ws, rws):
        w.repacked = cat.rows(r0, r0 + r.n)
        r0 += r.n
    ws[0].repacked_group = (ws, cat)
    return True
