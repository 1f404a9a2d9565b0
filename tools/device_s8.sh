#!/usr/bin/env bash
# Device calls of the 2026-12-01 fourth session (issue 12).
#   timeline:  tools/gemv_timeline.py (TL_DEPTHS, TL_VARIANTS: each GEMV's programs per SM and wave)
#   oracle:    tools/skip_oracle.py (the graph's GPU time with small kernels left out, outputs frozen)
#   depthtok:  tools/depth_tokens.py (the bench's loop token by token after its prefill)
#   hostcalls: tools/host_calls.py (each host-side call of a graphed token, timed on this CPU)
#   sigsweep:  tools/skip_oracle.py at positions 108 / 3362 over the PDL signal points of the current step
#              (per-shape late via the Gluon table's seventh field, the attention norm early, early sites):
#              perf-log AB5's first candidate for the next session; SIGSWEEP_EXTRA adds variants
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
    sigsweep) # the shipped table's configs with late flipped, one shape at a time, and PDL early variants
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      v="cfg:Q4_K+4608x3584=32,2,4,4,1,96,1 cfg:Q4_K+37888x3584=32,1,1,4,1,0,1 cfg:Q4_K+3584x18944=32,2,9,4,1,0,1"
      v="$v cfg:Q6_K+3584x18944=32,2,5,4,1,0,1 cfg:Q4_K+3584x3584=32,16,1,8,0,0,1 early_attn_norm"
      v="$v env:MINFER_PDL_EARLY_SITES=swiglu env:MINFER_PDL_EARLY_SITES=rope_kv short short&early_attn_norm"
      timeout ${ORACLE_TIMEOUT:-300} python3 tools/skip_oracle.py /tmp/q7.gguf 100 3354 -- $v ${SIGSWEEP_EXTRA:-} \
        >"$OUT/sigsweep.log" 2>&1
      tail -30 "$OUT/sigsweep.log";;
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
  case $step in depthtok|hostcalls|envab2|floor|oracle|timeline|sigsweep) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=$OUT bash tools/device_s7.sh $rest
exit 0
