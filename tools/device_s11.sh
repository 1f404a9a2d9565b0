#!/usr/bin/env bash
# Device calls of the 2026-12-03 tenth session (issue 12: the Q4_K down's speed of light).
#   run(command="cd .clean && bash tools/device_s11.sh sol sweepab", carry=[".whl", ".clean"])
#   sol: tools/down_sol.py -- load-only kernels with the down GEMV's loads (row-major planes and
#        tile-major), an empty grid, and the real GEMV's configs, in one harness (SOL_ARGS)
#   then the steps of tools/device_s10.sh (routes) -> s9 (sweepab) -> s8 -> s7 -> s6 -> s4 (tests bench)
set -u
STEPS=${*:-sol}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    sol)
      timeout ${SOL_TIMEOUT:-240} python3 tools/down_sol.py ${SOL_ARGS:-} >"$OUT/sol.log" 2>&1
      tail -${SOL_LINES:-30} "$OUT/sol.log";;
    *) rest="$rest $step";;
  esac
  case $step in sol) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s10.sh $rest
exit 0
