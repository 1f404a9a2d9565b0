#!/usr/bin/env bash
# Device calls of the 2026-12-03 ninth and tenth sessions (issue 12).
#   run(command="cd .clean && bash tools/device_s10.sh routes sweepab tests", carry=[".whl", ".clean"])
#   routes: tools/route_check.py -- each ROUTE_VARIANTS variant's Gluon launches by shape and its
#           launch-path counters (a variant that leaves the Gluon kernel shows a missing shape)
#   sol: tools/down_sol.py -- load-only kernels with the down GEMV's loads (row-major and tile-major
#        planes), an empty grid, and the real GEMV's configs, in one harness (SOL_ARGS)
#   table: tools/gemv_table.py -- issue 12's per-shape kernel table (each 7B shape on the shipped
#          decode GEMV as a kernel, no PDL and PDL-chained; checked against float64 first; TABLE_ARGS,
#          e.g. --only-tried --try o=32,16,1,8,0,128)
#   draw: tools/draw_prof.py -- generate()'s token choice on the GPU per sampling mode (kernels, time;
#         DRAW_ARGS, e.g. --variants)
#   paths: tools/greedy_paths.py -- where greedy generate()'s device, host and CPU paths part, and the
#          margins there (PATHS_ARGS)
#   then the steps of tools/device_s9.sh (sweepab) -> s8 -> s7 -> s6 -> s4 (tests bench)
set -u
STEPS=${*:-routes}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    routes)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${ROUTE_TIMEOUT:-150} python3 tools/route_check.py /tmp/q7.gguf ${ROUTE_DEPTHS:-108} -- ${ROUTE_VARIANTS:-} \
        >"$OUT/routes.log" 2>&1
      tail -${ROUTE_LINES:-40} "$OUT/routes.log";;
    sol)
      timeout ${SOL_TIMEOUT:-240} python3 tools/down_sol.py ${SOL_ARGS:-} >"$OUT/sol.log" 2>&1
      tail -${SOL_LINES:-30} "$OUT/sol.log";;
    table)
      timeout ${TABLE_TIMEOUT:-240} python3 tools/gemv_table.py --json "$OUT/table.json" ${TABLE_ARGS:-} >"$OUT/table.log" 2>&1
      tail -${TABLE_LINES:-30} "$OUT/table.log";;
    draw)
      timeout ${DRAW_TIMEOUT:-120} python3 tools/draw_prof.py ${DRAW_ARGS:-} >"$OUT/draw.log" 2>&1
      tail -${DRAW_LINES:-50} "$OUT/draw.log";;
    paths)
      timeout ${PATHS_TIMEOUT:-200} python3 tools/greedy_paths.py ${PATHS_ARGS:-} >"$OUT/paths.log" 2>&1
      tail -${PATHS_LINES:-40} "$OUT/paths.log";;
    *) rest="$rest $step";;
  esac
  case $step in routes|sol|table|draw|paths) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s9.sh $rest
exit 0
