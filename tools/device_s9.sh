#!/usr/bin/env bash
# Device calls of the 2026-12-02 seventh session (issue 12): a sweep of real variants of the graphed
# 7B step and, in the same call, the in-process A/B of its winners -- the device is scarce, so one
# call goes from the oracle to the A/B without a round trip through this machine.
#   run(command="cd .clean && bash tools/device_s9.sh sweepab bench", carry=[".whl", ".clean"])
#   sweepab: tools/skip_oracle.py at positions 108 / 3362 over SWEEP_VARIANTS, then tools/sweep_pick.py
#            (env: / cfg: variants that saved >= PICK_MIN us at 3362 and lost nowhere), then
#            `minfer bench -p 0 -n 128 -d 0,3354 -r 2 --ab` default vs those winners together, PAIRS pairs
#            (the A side: AB_A, default the shipped MINFER_PDL_EARLY_SITES=combine)
#   then the steps of tools/device_s8.sh (sigsweep oracle depthtok ...) -> s7 -> s6 -> s4 (tests bench)
set -u
STEPS=${*:-sweepab}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    sweepab)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${ORACLE_TIMEOUT:-300} python3 tools/skip_oracle.py /tmp/q7.gguf 100 3354 -- ${SWEEP_VARIANTS:-} \
        >"$OUT/sweep.log" 2>&1
      grep -E "^\||^depth|left out" "$OUT/sweep.log" | grep -v "^|---"
      B=$(cd tools && python3 sweep_pick.py "$OUT/sweep.log" --min ${PICK_MIN:-4} | tail -1)
      if [ -n "$B" ]; then
        echo "==== A/B: default vs $B"
        timeout ${AB_TIMEOUT:-200} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-2} \
          --ab "${AB_A:-MINFER_PDL_EARLY_SITES=combine}" "$B" --pairs ${PAIRS:-4} --no-progress >"$OUT/sweepab.log" 2>&1
        grep -E "B/A|pair " "$OUT/sweepab.log" | tail -12
      fi;;
    *) rest="$rest $step";;
  esac
  case $step in sweepab) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s8.sh $rest
exit 0
