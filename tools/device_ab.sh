#!/usr/bin/env bash
# Interleaved A/Bs of the decode switches in one process each (`minfer bench --ab`), on the
# synthetic 7B: the fusions of issue 12 whose effect was only shown by sequential runs
# (perf-log "int8-activation decode", Q3), and the int8 GEMV again at the current tree.
#   run(command="bash tools/device_ab.sh [SWITCH ...]", carry=[".whl"])     (~25 s per switch)
set -u
SWITCHES=${*:-MINFER_FUSED_ROPE_KV MINFER_GEMV_Q8}
source tools/device_setup.sh >/dev/null
Q7=/tmp/q7.gguf
[ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/dev/null 2>&1
for sw in $SWITCHES; do
  timeout ${AB_TIMEOUT:-90} python3 -m minfer bench -m $Q7 -p 0 -n 128 -r ${REPS:-3} --ab "$sw=1" "$sw=0" --no-progress \
    >"$OUT/ab-$sw.log" 2>&1
  echo "== A: $sw=1   B: $sw=0"; grep "^|" "$OUT/ab-$sw.log" | tail -4
done
