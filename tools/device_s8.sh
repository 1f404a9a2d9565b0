#!/usr/bin/env bash
# Device calls of the 2026-12-01 fourth session (issue 12).
#   timeline:  tools/gemv_timeline.py (TL_DEPTHS, TL_VARIANTS: each GEMV's programs per SM and wave)
#   oracle:    tools/skip_oracle.py (the graph's GPU time with small kernels left out, outputs frozen)
#   depthtok:  tools/depth_tokens.py (the bench's loop token by token after its prefill)
#   hostcalls: tools/host_calls.py (each host-side call of a graphed token, timed on this CPU)
#   envab2:    ENVAB2="A=0,B=1;A=1,B=1": `minfer bench -p 0 -n 128 -d 0,3354` per setting (a setting:
#              comma-separated VAR=value), settings alternated in separate processes, ENVAB_PAIRS rounds
#   then the steps of tools/device_s7.sh (l2sweep gsweep hostgap envab) -> s6 (treeab ab gen) -> s4
set -u
STEPS=${*:-tests hostcalls}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    depthtok) # tools/depth_tokens.py: the bench's loop token by token after its prefill, 4 ways
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${DEPTHTOK_TIMEOUT:-150} python3 tools/depth_tokens.py /tmp/q7.gguf ${DEPTHTOK_DEPTHS:-0 3354} >"$OUT/depthtok.log" 2>&1
      tail -16 "$OUT/depthtok.log";;
    hostcalls)
      timeout 120 python3 tools/host_calls.py >"$OUT/hostcalls.log" 2>&1
      cat "$OUT/hostcalls.log";;
    floor)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      for d in ${FLOOR_DEPTHS:-16}; do
        timeout 150 python3 tools/host_floor.py /tmp/q7.gguf $d >"$OUT/floor-$d.log" 2>&1
        tail -10 "$OUT/floor-$d.log"
      done;;
    oracle)   # tools/skip_oracle.py: the graph with small kernels left out (a timing bound for fusions)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${ORACLE_TIMEOUT:-200} python3 tools/skip_oracle.py /tmp/q7.gguf ${ORACLE_DEPTHS:-16 3354} ${ORACLE_VARIANTS:+-- $ORACLE_VARIANTS} >"$OUT/oracle.log" 2>&1
      tail -${ORACLE_LINES:-22} "$OUT/oracle.log";;
    timeline) # tools/gemv_timeline.py: the GEMVs' programs per SM and wave, per variant
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${TL_TIMEOUT:-200} python3 tools/gemv_timeline.py /tmp/q7.gguf ${TL_DEPTHS:-16} ${TL_VARIANTS:+-- $TL_VARIANTS} \
        >"$OUT/timeline.log" 2>&1
      tail -${TL_LINES:-60} "$OUT/timeline.log";;
    envab2)
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      IFS=';' read -ra settings <<< "${ENVAB2:-MINFER_DECODE_ATTN_ROPE=0;MINFER_DECODE_ATTN_ROPE=1}"
      summary=""
      for i in $(seq ${ENVAB_PAIRS:-2}); do
        for setting in "${settings[@]}"; do
          tag=${setting//[,=]/_}
          env ${setting//,/ } timeout 120 python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-3} \
            --no-progress >"/tmp/envab2-$tag-$i.log" 2>&1
          summary="$summary\n$setting $i: $(grep '^|' /tmp/envab2-$tag-$i.log | tail -2 | awk -F'|' '{printf "%s %s;", $6, $7}')"
        done
      done
      cat /tmp/envab2-*.log > "$OUT/envab2.log"
      echo -e "==== envab2 ====$summary";;
    *) rest="$rest $step";;
  esac
  case $step in depthtok|hostcalls|envab2|floor|oracle|timeline) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s7.sh $rest
exit 0
