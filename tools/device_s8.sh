#!/usr/bin/env bash
# Device calls of the 2026-12-01 fourth session (issue 12).
#   hostcalls: tools/host_calls.py (each host-side call of a graphed token, timed on this CPU)
#   then the steps of tools/device_s7.sh (l2sweep gsweep hostgap envab) -> s6 (treeab ab gen) -> s4
set -u
STEPS=${*:-tests hostcalls}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    hostcalls)
      timeout 120 python3 tools/host_calls.py >"$OUT/hostcalls.log" 2>&1
      cat "$OUT/hostcalls.log";;
    *) rest="$rest $step";;
  esac
  [ -z "${step##hostcalls}" ] && echo "[$step: $(( $(date +%s) - t0 )) s]"
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s7.sh $rest
exit 0
