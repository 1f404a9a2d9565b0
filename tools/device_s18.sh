#!/usr/bin/env bash
# Device calls of the 2026-12-04 eighteenth session's successor (issue 12): the steps of tools/device_s16.sh, and
#   cfgab: an in-process `minfer bench --ab` of the shipped Gluon table against the same table with one shape's
#          config replaced (CFGAB_KEY, e.g. "Q6_K 152064x3584"; CFGAB_CFG, comma-separated ints in the table's
#          field order), PAIRS pairs (default 12), -r REPS; the table written to $OUT/cfgab-table.json
#   run(command="cd .clean && CFGAB_KEY='Q6_K 152064x3584' CFGAB_CFG=32,2,1,4,1,0,0,0,0,1,1 bash tools/device_s18.sh cfgab",
#       carry=[".whl", ".clean"])
set -u
STEPS=${*:-cfgab}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    cfgab)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      python3 tools/cfg_table.py "${CFGAB_KEY:?set CFGAB_KEY}" "${CFGAB_CFG:?set CFGAB_CFG}" "$OUT/cfgab-table.json" || exit 1
      echo "==== A/B: the shipped table | $CFGAB_KEY = [$CFGAB_CFG]"
      timeout ${AB_TIMEOUT:-400} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-2} \
        --ab "MINFER_GEMV_Q8G_TABLE=" "MINFER_GEMV_Q8G_TABLE=$OUT/cfgab-table.json" --pairs ${PAIRS:-12} --no-progress \
        >"$OUT/cfgab.log" 2>&1
      grep -E "B/A|^\| (tg|test)" "$OUT/cfgab.log" | tail -4;;
    *) rest="$rest $step";;
  esac
  case $step in cfgab) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s16.sh $rest
exit 0
