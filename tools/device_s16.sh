#!/usr/bin/env bash
# Device calls of the 2026-12-04 sixteenth session (issue 12): the steps of tools/device_s11.sh, and
#   ab2: two in-process `minfer bench --ab` runs (AB1_A / AB1_B, AB2_A / AB2_B; PAIRS pairs, -r REPS), an
#        AB*_B of "olate" meaning the shipped Gluon table with o (Q4_K 3584x3584) signalling late
#   run(command="cd .clean && bash tools/device_s16.sh timeline ab2", carry=[".whl", ".clean"])
set -u
STEPS=${*:-ab2}
source tools/device_setup.sh >/dev/null
rest=""
olate() {   # the shipped table with o late (its seventh field), for an A/B side's MINFER_GEMV_Q8G_TABLE
  python3 - <<'PY'
import json
from minfer.ops.cuda import gemv_q8_gluon as GL
t = json.load(open(GL._TABLE))
c = list(t["configs"]["Q4_K 3584x3584"]) + [0] * 3
c[4:7] = [c[4], c[5], True]
t["configs"]["Q4_K 3584x3584"] = c[:7]
json.dump(t, open("/tmp/olate.json", "w"))
PY
}
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    ab2)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      olate
      for i in 1 2; do
        a=AB${i}_A; b=AB${i}_B
        [ -z "${!b:-}" ] && continue
        A=${!a:-MINFER_GEMV_SWIGLU=0}; B=${!b}
        A=${A//olate/MINFER_GEMV_Q8G_TABLE=/tmp/olate.json}; B=${B//olate/MINFER_GEMV_Q8G_TABLE=/tmp/olate.json}
        echo "==== A/B $i: $A | $B"
        timeout ${AB_TIMEOUT:-220} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-2} \
          --ab "$A" "$B" --pairs ${PAIRS:-6} --no-progress >"$OUT/ab$i.log" 2>&1
        grep -E "B/A|^\| (tg|test)" "$OUT/ab$i.log" | tail -4
      done;;
    *) rest="$rest $step";;
  esac
  case $step in ab2) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s11.sh $rest
exit 0
