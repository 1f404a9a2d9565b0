"""Switches: every fast-path off-switch and tuning value of the engine, in one frozen object.

The Engine takes a Switches at load and owns it; the ops receive it through the context the engine passes
(minfer.ops.Context). `Switches.from_env()` is the only place in minfer that reads MINFER_* behaviour variables; an
A/B (`minfer bench --ab`) or a CUDA-graph capture passes a changed copy (`dataclasses.replace`) and never touches the
process environment.

Each field's metadata holds its environment name and one line of documentation; the README's switch table
(`minfer switches --markdown`, checked by tests/test_switches.py) and the launch-path report are generated from them.

Fast paths are switched OFF by MINFER_X=0 (or false/off/no). Retired switches (their A/B was decided, docs/perf-log.md
section 11) are not read any more; setting one prints a warning through `retired_in_env()` (minfer bench and the
engine's load line mention it).

Process-level settings that are not engine behaviour are read elsewhere, each once and documented there: MINFER_HOME
(catalog.minfer_home), TRITON_INTERPRET (minfer.ops.cuda.dequant.interpret), the server's MINFER_API_KEY default and
the catalog's MINFER_PIP_ARGS. `environ_snapshot()` gives the MINFER_* variables for a benchmark record."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from typing import Mapping

from minfer.errors import MinferError


def _sw(default, env: str, doc: str, kind: str = "switch", when: str = "call", choices: tuple = ()):
    """A field: `kind` 'switch' (a fast path, on by default, MINFER_X=0 turns it off) or 'tuning' (a value); `when`: acts
    on each call or only at load; `choices`: an int's only values (checked by the parser and at construction)."""
    return field(default=default, metadata={"env": env, "doc": doc, "kind": kind, "when": when, "choices": choices})


@dataclass(frozen=True)
class Switches:
    def __post_init__(self):     # Switches(x=...) and replace() meet the parser's check of an int's choices
        for f in fields(self):
            if f.metadata["choices"] and getattr(self, f.name) not in f.metadata["choices"]:   # (False == 0)
                _parse(f, str(getattr(self, f.name)))

    # ---- fast paths (MINFER_X=0 turns one off; the launch-path report says "switched off by") ----
    gemv: bool = _sw(True, "MINFER_GEMV",
                     "decode GEMV over the raw blocks for M <= gemv_max_m rows (off: dequantize + cuBLAS)")
    gemv_repack: bool = _sw(True, "MINFER_GEMV_REPACK",
                            "decode GEMV over load-time repacked planes (ops/cuda/gemv_repack.py)",
                            when="load")
    gemv_q8: bool = _sw(True, "MINFER_GEMV_Q8",
                        "one-row decode: the activation row quantized to int8 per 32 values when it is "
                        "made (norm, SwiGLU) and the repacked GEMV by dp4a (ops/cuda/gemv_q8.py; off: "
                        "bf16 activations)")
    gemv_q8_gluon: bool = _sw(True, "MINFER_GEMV_Q8_GLUON",
                              "one-row decode: the q8 GEMV in Gluon, every tensor in its load layout, no "
                              "shared-memory layout changes in the K loop, for the shapes of its table (those it "
                              "won on the H200: the 7B's q/k/v, o, gate+up, down, lm head; 1.04-1.29x per shape, "
                              "+2.6% tg128 / +5.1% d3354 end to end, perf-log T2) (ops/cuda/gemv_q8_gluon.py; other "
                              "shapes and off: the Triton kernel)")
    pdl: bool = _sw(True, "MINFER_PDL",
                    "one-row decode kernels launched with programmatic dependent launch (sm90+): each "
                    "starts while the previous one finishes, the GEMV's first weight loads before its "
                    "wait (ops/cuda/pdl.py; off: plain stream order)")
    pdl_early: bool = _sw(False, "MINFER_PDL_EARLY",
                          "with PDL, the norm, rope+KV and attention kernels let the next kernel launch "
                          "before their own wait (off by default: 0.86-0.95x on the H200, perf-log; off: "
                          "every kernel signals after its wait)", kind="tuning")
    pdl_early_sites: str = _sw("combine,attn_norm", "MINFER_PDL_EARLY_SITES",
                               "with PDL, these kernels only (comma-separated: rope_kv, decode_attention, "
                               "add_rms_norm, attn_norm (the add_rms_norm before q/k/v only), rms_norm, swiglu, "
                               "combine (the decode attention's merge launch only; the rope-fused attention's merge keeps "
                               "the attention's mode)) "
                               "let the next kernel launch before their own wait, "
                               "as pdl_early does for all of them (ops/cuda/pdl.py; empty: none; default combine: H200 7B graph "
                               "-10 / -13 us at position 108 / depth 3354, perf-log AC1; attn_norm, with the q/k/v GEMV "
                               "that loads both its steps before its wait (prefetch 2), in-process bench --ab tg128 1.011, "
                               "d3354 1.005, perf-log AD2 (alone -7 / -3, AC1); rope_kv +31 us, decode_attention +120, swiglu -3, perf-log W2)",
                               kind="tuning")
    pdl_late: int = _sw(0, "MINFER_PDL_LATE",
                        "with PDL, when a Gluon q8 GEMV lets the next kernel launch: 0 after its wait, at "
                        "its start; 1 at the end of its programs for the GEMVs followed directly by a heavy "
                        "kernel (q/k/v before the decode attention with rope, gate+up with the SwiGLU "
                        "epilogue before down); 2 at the end for every one", kind="tuning")
    gemv_q8g_table: str = _sw("", "MINFER_GEMV_Q8G_TABLE",
                              "a JSON file of Gluon q8 GEMV configs ({\"configs\": {\"Q4_K NxK\": [BN, BB, SPLIT, "
                              "warps, prefetch (0, 1, or 2: a two-step split's both steps before the PDL wait; 3 or 4: that many shared-memory stages of weight words, ops/cuda/gemv_q8g_stages.py), register cap, late, "
                              "warps along K, the second weight's tiles first (a q/k + v launch)]}}, the last five optional, as `python -m "
                              "minfer.bench.gemv_q8_sweep --gluon --table F` "
                              "writes it) used instead of the shipped table (ops/cuda/gemv_q8g_h200.json); empty: "
                              "the shipped one (for an in-process A/B of two tables)", kind="tuning")
    gemv_q8g_rule: bool = _sw(True, "MINFER_GEMV_Q8G_RULE",
                              "a Q4_K / Q6_K decode shape missing from the shipped Gluon table (every model but the "
                              "7B) takes the Gluon q8 GEMV with the 7B config of the role its proportions say "
                              "(down, o, q/k/v, gate+up; ops/cuda/gemv_q8g_table.py shape_rule), and with it the "
                              "7B's fusions (H100 tg128 in-process B/A: 1.5B 1.188, Llama-3.1-8B 1.196, Qwen3-8B "
                              "1.197, every pair above 1, perf-log AW0 / AW2); off: those shapes keep the Triton q8 "
                              "kernel (a table file given by MINFER_GEMV_Q8G_TABLE is taken as it is, without the "
                              "rule)")
    gemv_tiles: bool = _sw(True, "MINFER_GEMV_TILES",
                           "repacked planes stored tile-major (a tile's rows block after block) for the shapes whose "
                           "Gluon q8 GEMV config asks for it (its tenth field: the 7B's down projections and its fused "
                           "gate+up group, laid out as one), so each "
                           "GEMV program reads one contiguous run (ops/cuda/plane_layout.py; applied at load and "
                           "again when an A/B changes it; H200 7B, with the x-ahead loads: in-process bench --ab "
                           "tg128 1.013, d3354 1.011, perf-log AF6; the gate+up group 1.031 / 1.036, AM5; off: row-major planes)")
    gemv_raw_fuse: bool = _sw(True, "MINFER_GEMV_RAW_FUSE",
                              "one-row decode: a q/k/v or gate/up group whose weights stay raw blocks (types "
                              "without repacked planes, e.g. the Q5_0 / Q8_0 of a model whose hidden size is no "
                              "multiple of 256: Qwen2.5-0.5B, SmolLM2) in one raw GEMV launch over the rows "
                              "stacked at load (ops/cuda/gemv.py fuse_raw_group; each weight a row view, the "
                              "same memory); off: one launch a weight")
    gemv_one_pass: bool = _sw(True, "MINFER_GEMV_ONE_PASS",
                              "one-row raw-block GEMV with K <= 1024 in one K tile, no K split (ops/cuda/gemv.py "
                              "one_pass_tile): one launch instead of the GEMV plus its split-K reduce; off: "
                              "4 K tiles of 256 in up to 4 splits and a reduce launch")
    gemv_raw_pdl: bool = _sw(True, "MINFER_GEMV_RAW_PDL",
                             "one-row raw-block GEMV launched with PDL (ops/cuda/pdl.py, under MINFER_PDL): it "
                             "launches during the kernel before it, the one-pass config decoding its weights "
                             "before its wait, and lets the kernel after it launch; off: a plain launch, which "
                             "breaks the decode chain's PDL at every raw GEMV")
    gemv_raw_halfwords: bool = _sw(True, "MINFER_GEMV_RAW_HALFWORDS",
                                   "raw-block GEMV over Q4_0 / Q5_0 / Q8_0 (every field of their blocks at an even "
                                   "offset): a run's 16 quant bytes read as 8 halfwords and Q5_0's 16 high bits as "
                                   "two bytes (ops/cuda/dequant.py decode_hw; the same values). On by default: the "
                                   "0.5B's Q5_0 gate/up 13.2 -> 6.7 us a layer, tg128 B/A 1.135 on an H100, every "
                                   "pair of 8 above 1 (perf-log AZ2); off: byte loads (32 a Q5_0 run)",
                                   kind="tuning")
    gemv_raw_resnorm: bool = _sw(True, "MINFER_GEMV_RAW_RESNORM",
                                 "one-row decode: a layer's o projection over raw blocks in one pass (Qwen2.5-0.5B's "
                                 "Q5_0 o) adds the residual and makes the FFN norm in its epilogue -- the program "
                                 "that stores last (an atomic ticket) norms the whole row (ops/cuda/gemv.py "
                                 "gemv_resnorm) -- one launch fewer a layer; on by default (the 0.5B's tg128 B/A "
                                 "1.063 on an H200, every pair of 8 above 1, perf-log AZ1); off: the GEMV, then the "
                                 "add + norm kernel",
                                 kind="tuning")
    gemv_q8_resnorm: bool = _sw(True, "MINFER_GEMV_Q8_RESNORM",
                                "one-row decode of a model whose hidden size is no multiple of 256 (Qwen2.5-0.5B's "
                                "896: the next norm's row has no int8 form): the down projection on the Triton q8 "
                                "GEMV adds the residual and makes the next attention norm in its epilogue, the "
                                "program storing the last row tile norming the whole row (ops/cuda/gemv_q8.py, "
                                "resnorm_tail.py) -- one launch fewer a layer; on by default (the 0.5B's tg128 B/A "
                                "1.050 on an H100, every pair of 8 above 1, perf-log AZ7); off: the GEMV, then the "
                                "add + norm kernel",
                                kind="tuning")
    split_gather: int = _sw(1, "MINFER_SPLIT_GATHER",
                            "one-row decode, the Gluon q8 GEMV with a K split (the 7B's downs: 8 and 5 splits): the "
                            "program finishing a row tile loads every split's partial sums as one tensor, each "
                            "thread all splits of one row, and adds them in split order (the same value) -- one L2 "
                            "load round instead of the loop's 4 (ptxas unrolls it by 4 with a peel and remainders; "
                            "tools/split_tail_sass.py, gemv_q8g_loads._split_gather, perf-log BA3). 1 (default): "
                            "every split shape (the 7B's tg128 B/A 1.007 on an H100, every pair of 6 above 1, its "
                            "decode bit-equal, perf-log BA4); 2: only builds without a register cap (the Q6_K down; "
                            "the Q4_K down's 72-register build spills 32 bytes with it); 0: the loop",
                            kind="tuning", choices=(0, 1, 2))
    gemv_raw_tile4: bool = _sw(True, "MINFER_GEMV_RAW_TILE4",
                               "one-row raw-block GEMV in one pass (K <= 1024): 4-row tiles up to 65,536 rows (the "
                               "0.5B's and SmolLM2's Q5_0 gate+up; the lm heads keep 8) instead of 4 rows only below "
                               "2,112 (ops/cuda/gemv.py one_pass_tile; perf-log BA1, CC4): the 0.5B's decode B/A 1.014 "
                               "+- 0.010 on an H100 (perf-log BB4); off: the rule's 8-row tiles from 2,112 rows",
                               kind="tuning")
    gemv_raw_rope: bool = _sw(True, "MINFER_GEMV_RAW_ROPE",
                              "one-row decode of a layer whose q/k/v weights are one stacked raw-block group "
                              "(Qwen2.5-0.5B's Q5_0 q/k/v, gemv.fuse_raw_group): the one-pass raw GEMV stores q "
                              "rotated and writes rope(k) and v into the KV cache in its epilogue "
                              "(ops/cuda/gemv_raw_rope.py; counted gemv.raw_rope) -- no rope_kv launch (1.2-1.4 "
                              "us a layer on an H100, perf-log AZ9); needs MINFER_QKV_ROPE on. On by default: the "
                              "0.5B's tg128 B/A 1.004 on an H100, pairs 2-8 of 8 above 1 (1.005-1.011; perf-log "
                              "BA0); off: the GEMV, then the rope_kv kernel",
                              kind="tuning")
    gemv_raw_norm: bool = _sw(False, "MINFER_GEMV_RAW_NORM",
                              "one-row decode on a model whose q/k/v and gate/up groups are all raw-block "
                              "one-pass GEMVs (hidden <= 1024 in Q5_0 / Q8_0 ...: Qwen2.5-0.5B, SmolLM2): the "
                              "residual add + RMSNorm before each group made by the group's own GEMV programs "
                              "(ops/cuda/gemv.py _norm_runs; program 0 stores the residual and the normed row), "
                              "one launch fewer before q/k/v and before gate/up; off (the default: the 0.5B's tg128 "
                              "0.926x on an H100, every program re-summing the row before its first product, "
                              "perf-log AW0): the add + norm kernel, then the GEMV. Where the GEMV before makes "
                              "the norm in its epilogue (MINFER_GEMV_RAW_RESNORM, MINFER_GEMV_Q8_RESNORM, on by "
                              "default), that takes it first", kind="tuning")
    gemv_glu_prologue: int = _sw(1, "MINFER_GEMV_GLU_PROLOGUE",
                                 "one-row decode of a SwiGLU MLP whose gate/up GEMV has no SwiGLU epilogue: the down "
                                 "projection's programs make silu(gate) * up and its int8 form from the gate/up rows "
                                 "themselves, one launch fewer a layer. 1 (the default): where the down runs on the "
                                 "Triton q8 GEMV (Qwen2.5-0.5B's Q4_K / Q6_K downs after its raw Q5_0 gate/up, "
                                 "ops/cuda/q8_rows.py _glu_q8_words; H100 A/B 1.047 +- 0.037, 11 of 12 pairs above 1, "
                                 "perf-log AY1); a down on the Gluon kernel keeps the swiglu launch; 2: the Gluon "
                                 "kernel's downs too, where a program's K range is at most 32 q8 chunks (the shape "
                                 "rule's 1.5B / 3B downs; the 7B's are refused by name, gemv_q8.GLU_MAX_CHUNKS): "
                                 "bit-identical on the H100 but slower (1.5B A/B 0.970, perf-log AY0); 0: swiglu_q8, "
                                 "then the GEMV", kind="tuning")
    gemv_swiglu: int = _sw(0, "MINFER_GEMV_SWIGLU",
                           "one-row decode: SwiGLU (and its int8 form) in the epilogue of the fused gate+up "
                           "q8 GEMV, one launch instead of two (ops/cuda/gemv_q8.py gemv_q8_swiglu, on the "
                           "Gluon kernel where its table has the shape). 1: the second program of a gate / up "
                           "tile pair to finish does it (an atomic ticket; H200 7B graph -33 us at depth 100 and "
                           "3354, perf-log AK6); 2: each program holds the gate and the up rows of its h values "
                           "and does it without a ticket (gemv_q8g_norm._glu_local; H100 7B graph -34 / -32 us at depth "
                           "100 / 3354, perf-log AU0); "
                           "0 (default): the GEMV, then swiglu_q8", kind="tuning")
    o_signal: int = _sw(1, "MINFER_O_SIGNAL",
                        "one-row decode, norm_into_gemv 4, with PDL: when the o projection (whose epilogue "
                        "makes gate+up's q8 row) lets gate+up launch. 1 (default): when its programs end "
                        "(signalled at its wait, gate+up's programs pile onto the SMs o leaves free: perf-log "
                        "AI2); 2: after its dot products, before its epilogue, so gate+up's programs are "
                        "placed while o's drain (ops/cuda/gemv_q8_gluon._pdl_mode 4; H200 7B: -7 / +10 us at depth "
                        "100 / 3354, gate+up released earlier but no shorter: perf-log AM0)", kind="tuning")
    norm_rstd_late: bool = _sw(True, "MINFER_NORM_RSTD_LATE",
                               "one-row decode, norm_into_gemv 4 / 5: the GEMV that scales its row sums by rstd "
                               "sums the tile sums of squares after its K loop (their load issued after the PDL "
                               "wait, its round trip under the loop) instead of before the loop, where the sum's "
                               "barrier held the x loads behind it; the same bits (ops/cuda/gemv_q8g_norm._ss_load; "
                               "H200 7B: q/k/v 3.10 -> 2.91 us from its release, graph +4 / +4 us at depth 100 / "
                               "3354, perf-log AL3; off: before the loop)")
    rq_smem: bool = _sw(True, "MINFER_RQ_SMEM",
                        "one-row decode, norm_into_gemv 4 / 5: the residual GEMV's q8 epilogue (the next row "
                        "without rstd) takes the tile's values from registers through shared memory and the "
                        "norm weight loaded early (before the PDL wait, or with a K split's partials) instead of "
                        "storing, a barrier and reading both from global memory; the same bits (ops/cuda/"
                        "gemv_q8g_norm._rss_q8_regs; H200 7B: graph +8 / +4 us at depth 100 / 3354, with "
                        "norm_rstd_late +12 / +7 and in-process bench --ab B/A tg128 1.0024 +- 0.0099, d3354 "
                        "1.0087 +- 0.0050 (6 pairs), perf-log AL2-AL3; off: the read-back)")
    pdl_preload: bool = _sw(True, "MINFER_PDL_PRELOAD",
                            "with PDL, a kernel loads what no kernel before it writes -- the RMSNorm's weight "
                            "(the norm + int8 kernel), the bias rows (the Gluon q8 GEMV) -- before its PDL wait, "
                            "not after it (off: after the wait)")
    norm_one_pass: bool = _sw(True, "MINFER_NORM_ONE_PASS",
                              "one-row decode: the RMSNorm + int8 kernel sums the row's squares in one load "
                              "round (the whole row in flight, up to 8192 values) instead of a loop of "
                              "1024-value rounds, each waiting for the last (ops/cuda/gemv_q8.py; off: the loop)")
    fuse_groups: bool = _sw(True, "MINFER_FUSE_GROUPS",
                            "prefill: a declared weight group (q/k/v) in one scratch, one GEMM "
                            "(off: one weight at a time)")
    prefetch: bool = _sw(True, "MINFER_PREFETCH",
                         "prefill: the next weight group dequantized on a side stream during this GEMM")
    fused_add_norm: bool = _sw(True, "MINFER_FUSED_ADD_NORM",
                               "residual add + RMSNorm + cast in one kernel (off: three kernels)")
    fused_rope_kv: bool = _sw(True, "MINFER_FUSED_ROPE_KV",
                              "rope of q and k plus the KV cache append in one kernel (contiguous cache; "
                              "off: two rope kernels and two cache writes)")
    cudnn_attention: bool = _sw(True, "MINFER_CUDNN_ATTENTION",
                                "prefill attention from position 0 by SDPA's cuDNN kernel, length "
                                "bucketed (off: SDPA's flash kernel)")
    decode_attention: bool = _sw(True, "MINFER_DECODE_ATTN",
                                 "decode attention by the Triton split-K kernel (off: SDPA)")
    decode_attn_rope: bool = _sw(False, "MINFER_DECODE_ATTN_ROPE",
                                 "one-token decode: rope of q and k and the KV cache append done by the decode "
                                 "attention kernel itself (the new key and value from registers; its first cached "
                                 "tile loaded before the PDL wait), one launch fewer per layer (ops/cuda/"
                                 "decode_attn_rope.py rope_decode_attention; off by default: B/A 0.983 tg128 and "
                                 "0.971 d3354 on the H200, perf-log U5; off: the rope_kv kernel, then "
                                 "attention)", kind="tuning")
    decode_attn_prewait: bool = _sw(False, "MINFER_DECODE_ATTN_PREWAIT",
                                    "with decode_attn_rope and PDL, the attention kernel loads its first tile of "
                                    "cached keys/values and the rope angles before its PDL wait (off: it waits "
                                    "first, one pipelined loop over its tiles)", kind="tuning")
    qkv_rope: int = _sw(2, "MINFER_QKV_ROPE",
                        "one-token decode: rope of q and k and the KV cache append done in the epilogue of the "
                        "q/k/v Gluon GEMV (its row tiles hold rotation pairs; ops/cuda/gemv_q8_gluon_rope.py), no "
                        "rope_kv launch; takes precedence over decode_attn_rope. 2 (default): that GEMV signals the "
                        "attention when its programs end, so the attention's programs land on SMs it has left "
                        "(H200 graph, skip_oracle: short graph +19 us at depth 100 over the short graph, whole-cache "
                        "graph +20 / +30 us at depth 100 / 3354, perf-log AJ1-AJ2); 1: it signals after its wait "
                        "(short graph -50 us: the attention's programs pile onto the first SMs q/k/v frees; whole "
                        "graph +23..+25); 0: the rope_kv kernel after the GEMV", kind="tuning")
    paged_attn_merge: bool = _sw(True, "MINFER_PAGED_ATTN_MERGE",
                                 "batched decode attention split over keys: the last program of each "
                                 "(row, KV head) merges the splits (off: a second merge kernel)", when="load")
    cuda_graph: bool = _sw(True, "MINFER_CUDA_GRAPH", "decode steps replay a captured CUDA graph")
    decode_short_graph: bool = _sw(True, "MINFER_DECODE_SHORT_GRAPH",
                                   "single-sequence CUDA decode: the positions below two key tiles of the "
                                   "decode attention (128 on a 128-wide head) replay a second graph captured "
                                   "over the cache's first rows, whose attention is one key split and writes its "
                                   "output and int8 form itself: no merge launch per layer "
                                   "(runtime/cuda_graphs.py; off: one graph for every position)")
    device_sampling: bool = _sw(True, "MINFER_DEVICE_SAMPLING",
                                "CUDA generate(): the next token chosen on the GPU by the batch engine's draw "
                                "(runtime/device_draw.py) and only it read back, the next graphed step launched "
                                "before it is (off: the logits copied to the host and sampled there; a logits "
                                "processor always is)")
    fused_draw: bool = _sw(True, "MINFER_FUSED_DRAW",
                           "CUDA generate()'s device draw in two launches, three for a sampled one over a large vocabulary "
                           "(ops/cuda/draw.py: greedy, or top-k "
                           "sampling with top_k 1..128, no top_logprobs; counted sampling.device.fused) instead of "
                           "the batch engine's 27-126 torch kernels and copies (off: those; the same tokens; generate() "
                           "on the H200 7B: greedy 1.04x, default sampling 1.16-1.21x, perf-log AG4)",
                           kind="tuning")
    pinned_io: bool = _sw(True, "MINFER_PINNED_IO",
                          "single-sequence CUDA decode: the token and position go to the graph in one copy "
                          "from pinned memory and the logits come back into pinned memory (off: two fill "
                          "kernels and a copy to pageable memory per step)")
    graph_host_reuse: bool = _sw(True, "MINFER_GRAPH_HOST_REUSE",
                                 "single-sequence CUDA decode with pinned I/O: the logits land in the previous "
                                 "step's pinned tensor when the caller has let go of it (a new one otherwise), and "
                                 "the input copy records no event when the host synchronizes after the step "
                                 "(runtime/cuda_graphs.py; off: a new pinned tensor and an event every step)")
    graph_io: bool = _sw(True, "MINFER_GRAPH_IO",
                         "single-sequence CUDA decode read on the host (Engine.forward, with pinned I/O and "
                         "host reuse): the pinned input copy and the logits copy are nodes of the captured "
                         "graph, so a token costs the host one replay call and one synchronize (runtime/"
                         "cuda_graphs.py io graphs; off: the two copies launched around the replay)")
    batch_async: bool = _sw(True, "MINFER_BATCH_ASYNC",
                            "CUDA batch engine: a decode step whose rows all continue is launched from the "
                            "previous step's tokens on the device before that step's results are read, so "
                            "the host's per-step work (events, text, scheduling) overlaps the GPU's")
    recurrent_step_kernels: bool = _sw(True, "MINFER_RECURRENT_STEP_KERNELS",
                                       "CUDA decode rows of the Mamba-2 and gated DeltaNet mixers (granitehybrid, "
                                       "nemotron_h(_moe), falcon-h1, mamba2, qwen35(moe), qwen3next): one Triton "
                                       "launch a layer (ops/cuda/ssm_step.py, deltanet_step.py: ssm.step.triton, "
                                       "deltanet.step.triton); of the Mamba-1 mixer (mamba, jamba): two "
                                       "(ops/cuda/ssm1_step.py: ssm1.conv.triton, ssm1.scan.triton); off: the torch "
                                       "ops of the prefill path (ssm.conv.torch / deltanet.conv.torch / "
                                       "ssm1.conv.torch ...), as before 2026-12-05")
    prefill_graph: bool = _sw(True, "MINFER_PREFILL_GRAPH",
                              "prompts of gemv_max_m+1 .. prefill_graph_max tokens from position 0 "
                              "replay a CUDA graph of their padded length")
    cpu_quant: bool = _sw(True, "MINFER_CPU_QUANT",
                          "CPU: matrices requantized at load, the feed-forward and vocabulary ones to "
                          "int4 in groups of 32, the others to per-row int8, read by torch's "
                          "weight-only kernels (ops/cpu_quant.py; off: the float32 reference)",
                          when="load")
    # ---- tuning values ----
    gemv_max_m: int = _sw(32, "MINFER_GEMV_MAX_M", "largest M (rows) that takes the decode GEMV",
                          kind="tuning")
    dense_gemv_max_m: int = _sw(1, "MINFER_DENSE_GEMV_MAX_M",
                                "with the batch engine's dense bf16 planes: largest M that stays on the "
                                "repacked GEMV (above: cuBLAS over the plane). H200, --parallel 2/4/8 with "
                                "qgemm_w4 from 2 rows: 1 against 8 measured 1.08x/1.08x/1.10x (perf-log)",
                                kind="tuning")
    qgemm_repack: bool = _sw(False, "MINFER_QGEMM_REPACK",
                             "batched decode rows dense_gemv_max_m < M <= qgemm_max_m: GEMM over the repacked "
                             "Q4_K/Q6_K planes (ops/cuda/qgemm_repack.py), and the batch engine builds no dense "
                             "bf16 planes for those weights (off until measured on the GPU: dense planes + cuBLAS)",
                             kind="tuning", when="load")
    qgemm_q8: bool = _sw(False, "MINFER_QGEMM_Q8",
                         "batched decode rows dense_gemv_max_m < M <= qgemm_max_m: the rows quantized to int8 per "
                         "32 values and an int8 tensor-core GEMM over the repacked Q4_K/Q6_K planes "
                         "(ops/cuda/qgemm_q8.py; takes precedence over qgemm_repack), and the batch engine builds "
                         "no dense bf16 planes for those weights (off: end to end 0.39x the dense planes at B=32 on the H200, perf-log L4)",
                         kind="tuning", when="load")
    qgemm_w4: bool = _sw(True, "MINFER_QGEMM_W4",
                         "batched decode rows qgemm_w4_min_m <= M <= qgemm_w4_max_m on the large Q4_K/Q6_K "
                         "matrices (gate/up, down, lm head: ops/cuda/qgemm_w4_mma.use_w4): a Gluon GEMM over "
                         "5/7-bit planes made at engine start (3.2 GiB more on the 7B) instead of cuBLAS "
                         "over the dense bf16 planes (H200, M=32: 1.10-1.27x per shape, perf-log)",
                         when="load")
    qgemm_w4_ring: bool = _sw(True, "MINFER_QGEMM_W4_RING",
                              "qgemm_w4: the shapes measured faster with a cp.async ring of words, scales "
                              "and x in shared memory (gate/up at 17..32 rows, the lm head at <= 16) take it "
                              "(off: every shape keeps the register prefetch loop)", kind="tuning")
    qgemm_w4_min_m: int = _sw(2, "MINFER_QGEMM_W4_MIN_M",
                              "smallest M (rows, at least 2) that takes qgemm_w4 on the weights with its planes "
                              "(below: the decode GEMV; H200, --parallel 2/4/8 with dense_gemv_max_m 1: from 2 "
                              "against from 9 rows 1.09x/1.13x/1.22x, perf-log)", kind="tuning")
    qgemm_w4_max_m: int = _sw(32, "MINFER_QGEMM_W4_MAX_M",
                              "largest M (rows) that takes qgemm_w4 (above: cuBLAS over the dense planes; "
                              "the Gluon GEMM decodes the weights again per 32 rows: 0.86x at M=64)",
                              kind="tuning")
    dense_plane_groups: bool = _sw(True, "MINFER_DENSE_PLANE_GROUPS",
                                   "the batch engine's dense bf16 planes: one plane per weight group (q/k/v, "
                                   "gate/up; members are row views) multiplied as one cuBLAS GEMM",
                                   when="load")
    paged_attn_programs: int = _sw(264, "MINFER_PAGED_ATTN_PROGRAMS",
                                   "batched decode attention: the key splits per row are chosen so that "
                                   "rows x KV heads x splits reach about this many programs (264: 2 per SM "
                                   "of an H200; ops/cuda/paged_attention.split_count)", kind="tuning")
    decode_attn_preload: bool = _sw(True, "MINFER_DECODE_ATTN_PRELOAD",
                                    "one-token decode attention: the key count (the step's position) and each "
                                    "program's key range read before the PDL wait, so the cached tiles' loads "
                                    "follow the wait without a dependent load first (ops/cuda/attention.py; H200: "
                                    "B/A 1.007 tg128 / 1.006 d3354 in one process, graph -5 / -10 us, perf-log W1; "
                                    "off: the count is read after the wait)")
    norm_into_gemv: int = _sw(4, "MINFER_NORM_INTO_GEMV",
                              "one-row decode: the residual add + RMSNorm + q8 before q/k/v done by the q/k/v "
                              "Gluon GEMV's own programs, one launch fewer per layer (ops/cuda/gemv_q8_gluon.py "
                              "NORM). 1: each program sums the squares of the whole row (H200 graph +77 us at d16, "
                              "+50 at d3354: 576 programs read the row, perf-log W3); 2: the down GEMV's epilogue "
                              "adds the residual and sums its squares per row tile, q/k/v reads those sums and its "
                              "own chunks (H200 graph +21 us at d16, +8 at d3354: slower, perf-log X0); 3: that "
                              "epilogue, and the down GEMV's program finishing its last row tile makes the whole "
                              "normed row and its q8 form (gemv_q8g_norm._norm_tail), q/k/v reads them as from "
                              "the norm kernel (H200 graph +128 / +132 us at d16 / d3354: one program's tail "
                              "costs more than the launch, perf-log AA3); 4: that epilogue also makes its tiles' "
                              "q8 words of s * weight without rstd (one q8 chunk a 32-row tile), for the down "
                              "before q/k/v and the o projection before gate/up, and the next GEMV scales its "
                              "row sums by rstd from the tiles' sums (rstd is one factor of every chunk's "
                              "scale): no norm launch between the GEMVs, nothing serial (perf-log AI1; H200 "
                              "graph -450 us as launched: gate+up's programs pile onto the SMs o leaves free, "
                              "AI3; so with PDL the o projection then signals gate+up at its programs' end, "
                              "ops/cuda/linear_norm.linear_add_rms_norm); 4 is the default (H200, with norm_rstd_late "
                              "and rq_smem, against 5: graph +2 / +10 us at depth 100 / 3354, in-process bench "
                              "--ab B/A tg128 1.0061 +- 0.0125, d3354 1.0141 +- 0.0129, 6 pairs, perf-log AL3); 5: "
                              "4 for the norm before q/k/v only (the FFN norm kernel kept; the default from "
                              "2026-12-03: graph +10 / +13 us against 0, perf-log AI4); "
                              "0: the norm kernel, then the GEMV",
                              kind="tuning")
    decode_attn_kvpre: bool = _sw(False, "MINFER_DECODE_ATTN_KVPRE",
                                  "one-token decode attention: each program's first tile of cached keys/values "
                                  "(rows written by earlier steps) loaded before the PDL wait too, this step's row "
                                  "after it; implies decode_attn_preload (ops/cuda/attention.py KVPRE; off by "
                                  "default: B/A 0.983 tg128 / 0.987 d3354, graph +34 / +20 us on the H200, "
                                  "perf-log W1)", kind="tuning")
    decode_attn_programs: int = _sw(264, "MINFER_DECODE_ATTN_PROGRAMS",
                                    "single-sequence decode attention: KV heads x key splits reach about this "
                                    "many programs at the cache's full length, at least 2 key tiles each "
                                    "(264: 2 per SM of an H200; the kernel divides each step's actual keys "
                                    "over them)", kind="tuning")
    decode_attn_ahead: bool = _sw(False, "MINFER_DECODE_ATTN_AHEAD",
                                  "single-sequence decode attention: each program loads its next key tile "
                                  "into registers before the math of this one (the plain loop is already pipelined "
                                  "through shared memory, perf-log Z8); the key-split kernel then runs 8 warps (ops/cuda/"
                                  "attention.py AHEAD; off by default: H200 graph +3 / +10 / +16 us on the short "
                                  "graph at positions 24 / 72 / 108, +26 us at d3354; bench --ab B/A 0.993 tg128, "
                                  "1.003 d3354, perf-log Z4)", kind="tuning")
    decode_attn_tiles: int = _sw(2, "MINFER_DECODE_ATTN_TILES",
                                 "single-sequence decode attention over more than two key tiles: the fewest "
                                 "tiles a key split covers at the cache's full length (with decode_attn_programs, "
                                 "this sets the splits; ops/cuda/attention.py _n_split; 1 measured neutral on the "
                                 "H200: graph -2 us at d3354, bench --ab 1.009 +- 0.014, perf-log Z6)", kind="tuning")
    decode_attn_grid_merge: bool = _sw(False, "MINFER_DECODE_ATTN_GRID_MERGE",
                                       "single-sequence decode attention over several key splits: the "
                                       "attention's own programs merge the splits after a barrier inside the grid "
                                       "(at most one program an SM), no combine launch a layer (ops/cuda/"
                                       "decode_merge.py; off by default: H200 7B graph +52 / +54 us at depth 1000 "
                                       "/ 3354, perf-log AA1; off: the combine launch)", kind="tuning")
    decode_attn_vsplit: int = _sw(4, "MINFER_DECODE_ATTN_VSPLIT",
                                  "single-sequence decode attention with one key split (the short graph's): "
                                  "each KV head's program spread over this many programs (1, 2 or 4), each "
                                  "reading all of K and a slice of V's dims and writing that slice of the output, "
                                  "at decode_attn_warps warps (ops/cuda/attention.py VS; H200, 7B short graph "
                                  "against 1 at 8 warps: 4 -35 / -40 / -42 us at positions 24 / 72 / 108, 2 "
                                  "-26 / -32 / -28, perf-log AA5)", kind="tuning")
    decode_attn_split_vs: int = _sw(1, "MINFER_DECODE_ATTN_SPLIT_VS",
                                    "single-sequence decode attention over several key splits: each split's "
                                    "program spread over this many programs (1, 2 or 4) by V's dims, as "
                                    "decode_attn_vsplit does for one split (ops/cuda/attention.py VS; 1 by "
                                    "default: H200 7B graph at d3354 +23 us with 2, +74 with 4; bench --ab 2 / 1 "
                                    "1.0008 +- 0.0051 at d3354, perf-log AA8)", kind="tuning")
    decode_attn_pipe: bool = _sw(False, "MINFER_DECODE_ATTN_PIPE",
                                 "one-token decode attention: every key tile's cached rows (all but this step's "
                                 "row) loaded by a loop whose first iteration takes the PDL wait, so the "
                                 "compiler's pipelined cp.async copies of the first tiles go out before the wait, "
                                 "during the rope + KV kernel; this step's key and value are read after it and "
                                 "folded in last (float32 rounding apart from the plain loop); implies "
                                 "decode_attn_preload, not with kvpre or ahead (ops/cuda/attention.py PIPE; off by "
                                 "default: H200 7B graph +10 us at d3354, +2 / +8 at position 108 (whole-cache / "
                                 "short graph); bench --ab B/A 0.987 +- 0.010 tg128, 1.004 +- 0.026 d3354, perf-log "
                                 "AB1; off: the wait, then one loop over the tiles)", kind="tuning")
    decode_combine_chunk: int = _sw(32, "MINFER_DECODE_COMBINE_CHUNK",
                                    "single-sequence decode attention over several key splits: the values "
                                    "each program of the combine launch merges (32, 64 or 128; the 7B: 112, 56 "
                                    "or 28 programs), so fewer SMs hold combine programs when the o GEMV's "
                                    "programs (one an SM) are placed (ops/cuda/decode_merge.py merge; 32 by "
                                    "default: H200 7B graph +11 / +12 us with 64 and +7 / +7 with 128 at "
                                    "position 108 / depth 3354, perf-log AB3)", kind="tuning")
    decode_attn_warps: int = _sw(4, "MINFER_DECODE_ATTN_WARPS",
                                 "single-sequence decode attention: warps per program of the key-split kernel, "
                                 "twice that for the one-split kernel of short caches without V slices "
                                 "(decode_attn_vsplit 1; ops/cuda/attention.py "
                                 "_decode_attn_kernel; H200, 7B graph: 8 / 2 instead of 4 +8..+14 / +22..+25 us, "
                                 "the one-split kernel at 8 instead of 4 -9 / -5 us at positions 16 / 64, "
                                 "perf-log Z2)", kind="tuning")
    qgemm_max_m: int = _sw(256, "MINFER_QGEMM_MAX_M", "largest M (rows) that takes the repacked-plane GEMM "
                           "when qgemm_repack is on (above: dequantize + cuBLAS)", kind="tuning")
    pdl_prefetch: int = _sw(1, "MINFER_PDL_PREFETCH",
                            "with PDL, weight tiles each decode GEMV program loads before waiting for the "
                            "previous kernel (1 or 2; 2 only for tiles of <= 64 rows x blocks; 2 measured "
                            "0.90x on the H200, perf-log)", kind="tuning")
    l2_prefetch_mb: int = _sw(0, "MINFER_L2_PREFETCH_MB",
                              "one-row decode: bytes (MiB) of the weights that follow which each small q8 GEMV "
                              "(q/k/v, o: under l2_small_mb) fetches into L2 before its wait, the next small "
                              "weight whole and then the head rows of the next large one (ops/cuda/l2_prefetch.py; "
                              "0: none)", kind="tuning")
    l2_small_mb: int = _sw(24, "MINFER_L2_SMALL_MB",
                           "a decode GEMV whose planes are under this many MiB counts as small (latency-bound) "
                           "for l2_prefetch_mb and l2_big_next", kind="tuning")
    l2_big_next: bool = _sw(False, "MINFER_L2_BIG_NEXT",
                            "one-row decode: a large q8 GEMV (down, the lm head) fetches the next GEMV's planes "
                            "into L2 when that one is small (the next layer's q/k/v; ops/cuda/l2_prefetch.py)",
                            kind="tuning")
    l2_heads: int = _sw(0, "MINFER_L2_HEADS",
                        "one-row decode, the Gluon q8 GEMV: a launch whose next q8 GEMV in the step is tile-major "
                        "and at least 4x its bytes (the 7B: o, then gate+up) fetches the first this-many K blocks "
                        "of every row tile of that GEMV's planes into L2 before its PDL wait, during the "
                        "attention (ops/cuda/l2_prefetch.L2Plan.heads; tools/l2_head_probe.py: "
                        "gate+up alone 19.4 -> 18.0 us with 4 of 14 blocks in L2, perf-log AN3; 0: none; H200 7B graph, "
                        "before the wait: 2 / 4 / 6 blocks -26 / -45 / -67 us at depth 100, the attention "
                        "2.9 us a layer slower beside the prefetches, in-process bench --ab of 4 B/A 0.990 tg128, "
                        "0.961 d3354, perf-log AN4)",
                        kind="tuning")
    l2_heads_late: bool = _sw(False, "MINFER_L2_HEADS_LATE",
                              "with l2_heads: the prefetches issued after the launch's dot products (o's window "
                              "past its own loads and the attention) instead of before its PDL wait (H200 7B graph: "
                              "2 / 4 blocks -22 / -40 us at depth 100, perf-log AN5)",
                              kind="tuning")
    scratch_mb: int = _sw(256, "MINFER_SCRATCH_MB",
                          "cap of the single dequant scratch (MiB); larger weights go in row chunks",
                          kind="tuning")
    group_scratch_mb: int = _sw(288, "MINFER_GROUP_SCRATCH_MB",
                                "cap of each of the two prefetch/group buffers (MiB)", kind="tuning")
    prefill_graph_max: int = _sw(1024, "MINFER_PREFILL_GRAPH_MAX",
                                 "longest prompt (tokens) prefilled through a CUDA graph", kind="tuning")
    prefill_graphs: int = _sw(2, "MINFER_PREFILL_GRAPHS",
                              "prefill graphs kept (least recently used dropped)", kind="tuning")
    prefill_chunk: int = _sw(0, "MINFER_PREFILL_CHUNK",
                             "prompt tokens per forward pass (0: 512 on the CPU, 4096 on CUDA)",
                             kind="tuning")
    act_dtype: str = _sw("bfloat16", "MINFER_ACT_DTYPE",
                         "CUDA matmul inputs and KV cache: bfloat16, float16 or float32",
                         kind="tuning", when="load")
    threads: int = _sw(0, "MINFER_THREADS", "torch CPU threads (0: torch's default)",
                       kind="tuning", when="load")
    debug_paths: bool = _sw(False, "MINFER_DEBUG_PATHS",
                            "print the launch-path counts at exit (stderr)", kind="tuning",
                            when="process")

    # ------------------------------------------------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Switches":
        """The switches as set in `env` (default: os.environ); unset or empty -> the default.
        A value that does not parse is a MinferError naming the variable."""
        env = os.environ if env is None else env
        kw = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if raw is None or raw.strip() == "":
                continue
            kw[f.name] = _parse(f, raw.strip())
        return cls(**kw)

    def with_env(self, changes: Mapping[str, str | None]) -> "Switches":
        """A copy with MINFER_X=value settings applied (a value of None restores the default):
        what `minfer bench --ab 'MINFER_GEMV=0' ...` passes to the engine."""
        by_env = {f.metadata["env"]: f for f in fields(self)}
        kw = {}
        for name, raw in changes.items():
            f = by_env.get(name)
            if f is None:
                raise MinferError(f"{name} is not a minfer switch (known: {', '.join(sorted(by_env))})")
            kw[f.name] = f.default if raw is None or raw.strip() == "" else _parse(f, raw.strip())
        return replace(self, **kw)

    def off(self) -> dict:
        """{field: env} of the fast paths switched off here (for the load line)."""
        return {f.name: f.metadata["env"] for f in fields(self)
                if f.metadata["kind"] == "switch" and getattr(self, f.name) is False}


# the PDL launch sites that may signal before their wait (ops/cuda/pdl.py enabled(..., early_ok=True))
# (attn_norm and combine: roles, narrower than a site -- the add_rms_norm calls before a layer's
# q/k/v only; the decode attention's merge launch only: pdl.early)
EARLY_SITES = ("rope_kv", "decode_attention", "add_rms_norm", "attn_norm", "rms_norm", "swiglu", "combine")


def _parse(f, raw: str):
    env = f.metadata["env"]
    if f.type in ("bool", bool):
        low = raw.lower()
        if low in ("0", "false", "off", "no"):
            return False
        if low in ("1", "true", "on", "yes"):
            return True
        raise MinferError(f"{env}={raw!r}: expected 0 or 1")
    if f.type in ("int", int):
        try:
            v = int(raw)
        except ValueError:
            raise MinferError(f"{env}={raw!r}: expected an integer") from None
        if v < 0 or (f.metadata["choices"] and v not in f.metadata["choices"]):
            *a, b = f.metadata["choices"] or ("a non-negative integer",)
            raise MinferError(f"{env}={raw!r}: expected " + (f"{', '.join(map(str, a))} or {b}" if a else b))
        return v
    if f.name == "pdl_early_sites" and raw:
        bad = [x for x in raw.split(",") if x not in EARLY_SITES]
        if bad:
            raise MinferError(f"{env}={raw!r}: unknown site {bad[0]!r} (sites: {', '.join(EARLY_SITES)})")
    if f.name == "act_dtype":
        names = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")
        if raw not in names:
            raise MinferError(f"{env}={raw!r}: expected one of {', '.join(names)}")
    return raw


def markdown_table() -> str:
    """The README's switch table, generated from the field docs. 'each call': the engine's copy can change between
    calls (Engine.set_switches, `minfer bench --ab`); 'at load': needs a new engine; 'at exit': process-wide."""
    rows = ["| variable | field | default | takes effect | what it does |", "|---|---|---|---|---|"]
    for f in fields(Switches):
        d = ("on" if f.default else "off") if isinstance(f.default, bool) else f.default
        when = {"call": "each call", "load": "at load", "process": "at exit"}[f.metadata["when"]]
        rows.append(f"| `{f.metadata['env']}` | `{f.name}` | {d} | {when} | {f.metadata['doc']} |")
    return "\n".join(rows)


if __name__ == "__main__":
    # `python -m minfer.switches`: the README's switch table (tests/test_switches.py checks the README holds it)
    print(markdown_table())
