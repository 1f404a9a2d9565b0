#!/usr/bin/env bash
# Device calls of the 2026-12-01 third session (issue 12: L2 prefetch of later weights).
#   l2sweep: python -m minfer.bench.gemv_q8_sweep --l2 (per shape: cold / warm / chained prefetch)
#   then the steps of tools/device_s6.sh (treeab ab gen) and tools/device_s4.sh (tests bench dprof ...)
set -u
STEPS=${*:-tests l2sweep}
source tools/device_setup.sh >/dev/null
case " $STEPS " in *" hostgap "*|*" envab "*)
  [ -f /tmp/q7.gguf ] || (python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1 &);;
esac
waitq7() { sleep 1; while [ ! -f /tmp/q7.gguf ] || pgrep -f "^python3? -m minfer synth" >/dev/null; do sleep 2; done; }
rest=""; summary=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    l2sweep)
      timeout ${SWEEP_TIMEOUT:-150} python3 -m minfer.bench.gemv_q8_sweep --l2 --json "$OUT/l2sweep.json" \
        ${SWEEP_SHAPES:+--shapes $SWEEP_SHAPES} >"/tmp/l2sweep.log" 2>&1
      tail -12 /tmp/l2sweep.log
      summary="$summary\nl2 sweep:\n$(grep -E 'cold|Error' /tmp/l2sweep.log)";;
    gsweep)   # the Gluon q8 GEMV per config; its best configs become the table this copy loads
      timeout ${SWEEP_TIMEOUT:-200} python3 -m minfer.bench.gemv_q8_sweep --gluon ${SWEEP_WIDE:+--wide} ${SWEEP_PDL:+--pdl} --budget-s ${SWEEP_BUDGET:-170} \
        --json "$OUT/gsweep.json" --table minfer/ops/cuda/gemv_q8g_h200.json ${SWEEP_SHAPES:+--shapes $SWEEP_SHAPES} \
        >"/tmp/gsweep.log" 2>&1
      cp minfer/ops/cuda/gemv_q8g_h200.json "$OUT/" 2>/dev/null
      grep -E "triton|best|WRONG|failed|Error|^table" /tmp/gsweep.log | head -40
      summary="$summary\ngluon sweep:\n$(grep -E '^\|' /tmp/gsweep.log)";;
    hostgap)   # tools/host_gap.py: a bench token's wall vs its graph's GPU time
      waitq7
      timeout ${HOSTGAP_TIMEOUT:-120} python3 tools/host_gap.py /tmp/q7.gguf >"$OUT/hostgap.log" 2>&1
      tail -4 "$OUT/hostgap.log"
      summary="$summary\nhost gap:\n$(grep depth "$OUT/hostgap.log")";;
    envab)     # ENVAB="VAR=a VAR=b": `minfer bench -p 0 -n 128 -d 0,3354` in separate processes, alternated
      waitq7
      for i in $(seq ${ENVAB_PAIRS:-3}); do
        for setting in ${ENVAB:-MINFER_GEMV_Q8_GLUON=0 MINFER_GEMV_Q8_GLUON=1}; do
          env $setting timeout 120 python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-3} \
            --no-progress >"/tmp/envab-$setting-$i.log" 2>&1
          summary="$summary\n$setting $i: $(grep '^|' /tmp/envab-$setting-$i.log | tail -2 | awk -F'|' '{printf "%s %s;", $6, $7}')"
        done
      done
      cat /tmp/envab-*.log > "$OUT/envab.log";;
    *) rest="$rest $step";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s6.sh $rest
echo -e "\n==== s7 summary ====$summary"
exit 0
