#!/usr/bin/env bash
# Device calls of the 2026-12-06 twenty-ninth session's successor (perf-log AY3):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s29.sh hw rn rawsweep downsweep [prof]; true", carry=[".whl"])
# hw: the raw GEMV's halfword reads (Switches.gemv_raw_halfwords) -- their GPU tests, then the 0.5B geometry's
#   in-process A/B MINFER_GEMV_RAW_HALFWORDS 0 -> 1 (tg128, PAIRS interleaved pairs, -r 2), nothing else running.
# rn: the 0.5B's A/B of MINFER_GEMV_RAW_RESNORM 0 -> 1 (the raw o GEMV's residual norm epilogue).
# q8rn: as hw for the Triton q8 down's residual norm tail (Switches.gemv_q8_resnorm; tools/device_s30.sh forwards here).
# rope: as hw for the raw q/k/v GEMV's rope epilogue (Switches.gemv_raw_rope).
# prof: tools/prof_decode.py on the same file (depth 16) with the switch as the environment sets it.
# downsweep: minfer.bench.gemv_q8_sweep --small --wide (the 0.5B's Q4_K / Q6_K down on the Triton q8 kernel), then
#   --small --gluon --wide --pdl (the same shapes on the Gluon kernel, under the shape rule's 1,024-row floor).
# rawsweep: minfer.bench.raw_gemv_sweep -- the raw GEMV per shape (the 0.5B's, SmolLM2's), bytes vs halfwords, per tile.
# Other steps go to tools/device_s28.sh (glu15) and on (build, side, tests, ...).
set -u
STEPS=${*:-hw}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
M5=/tmp/d05.gguf
synth05() { [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --no-progress >/dev/null 2>&1; }
tests_then_ab() {   # NAME SWITCH GREP TESTS...: the GPU tests (xdist), then the 0.5B's A/B SWITCH 0 -> 1, nothing else running
  local name=$1 switch=$2 key=$3; shift 3
  ( synth05; touch /tmp/synth05.done ) &
  if [ $# -gt 0 ]; then   # (no test files: the A/B alone)
    xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
    timeout ${HW_TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q $xd -p no:cacheprovider "$@" >"$OUT/pytest-$name.log" 2>&1
    echo "$name tests: $(tail -1 "$OUT/pytest-$name.log")"
    grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-$name.log" | head -10
  fi
  while [ ! -f /tmp/synth05.done ]; do sleep 1; done
  MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-150} python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 \
    --ab "$switch=0" "$switch=1" --pairs ${PAIRS:-8} --out "$OUT/$name-ab.json" --no-progress >"$OUT/$name-ab.log" 2>&1
  echo "$name A/B: rc $?"
  grep -E "^\| [0-9]+ \| tg|^\| tg128|$key|fell back|Traceback" "$OUT/$name-ab.log" | head -20
}
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    hw)
      tests_then_ab hw MINFER_GEMV_RAW_HALFWORDS "halfwords" tests/gpu/test_gemv_raw_halfwords_gpu.py \
        tests/gpu/test_gemv_raw_resnorm_gpu.py tests/gpu/test_gemv_raw_group_gpu.py;;
    q8rn)   # the Triton q8 down's residual norm tail (Switches.gemv_q8_resnorm, perf-log AZ7)
      tests_then_ab q8rn MINFER_GEMV_Q8_RESNORM "resnorm" tests/gpu/test_gemv_q8_resnorm_gpu.py \
        tests/gpu/test_gemv_raw_resnorm_gpu.py tests/gpu/test_gemv_glu_prologue_gpu.py;;
    rope)   # the raw q/k/v GEMV's rope epilogue (Switches.gemv_raw_rope, perf-log AZ9)
      tests_then_ab rope MINFER_GEMV_RAW_ROPE "raw_rope" tests/gpu/test_gemv_raw_rope_gpu.py \
        tests/gpu/test_gemv_raw_group_gpu.py tests/gpu/test_qkv_rope_gpu.py;;
    tile4)   # the raw one-pass GEMV's 4-row tiles past 2,112 rows (Switches.gemv_raw_tile4, perf-log BA1): tests, A/B
      tests_then_ab tile4 MINFER_GEMV_RAW_TILE4 "one_pass" tests/gpu/test_gemv_raw_tile4_gpu.py \
        tests/gpu/test_gemv_raw_rope_gpu.py tests/gpu/test_gemv_raw_group_gpu.py tests/gpu/test_gemv_raw_resnorm_gpu.py;;
    tile4ab)   # its A/B alone
      tests_then_ab tile4 MINFER_GEMV_RAW_TILE4 "one_pass";;
    rn)   # the raw o GEMV's residual norm epilogue (Switches.gemv_raw_resnorm): the 0.5B's A/B 0 -> 1 (after hw)
      tests_then_ab rn MINFER_GEMV_RAW_RESNORM "raw_resnorm";;
    prof)
      synth05
      timeout ${PROF_TIMEOUT:-120} python3 tools/prof_decode.py $M5 16 >"$OUT/prof05.log" 2>&1
      grep -v "^ *$" "$OUT/prof05.log" | grep -v Warn | tail -${PROF_LINES:-30};;
    rawsweep)
      timeout ${SWEEP_TIMEOUT:-200} python3 -m minfer.bench.raw_gemv_sweep --json "$OUT/raw-sweep.json" >"$OUT/raw-sweep.log" 2>&1
      echo "rawsweep: rc $?"; grep -E "^\|" "$OUT/raw-sweep.log" | head -40; grep -E "Error|Traceback" "$OUT/raw-sweep.log" | head -3;;
    downsweep)   # the 0.5B's Triton q8 down (896 x 4864) over the wide config set
      timeout ${SWEEP_TIMEOUT:-200} python3 -m minfer.bench.gemv_q8_sweep --small --wide --budget-s 150 \
        --json "$OUT/down05-sweep.json" >"$OUT/down05-sweep.log" 2>&1
      echo "downsweep: rc $?"; tail -8 "$OUT/down05-sweep.log"
      timeout ${SWEEP_TIMEOUT:-200} python3 -m minfer.bench.gemv_q8_sweep --small --gluon --wide --pdl --budget-s 120 \
        --json "$OUT/down05-gluon.json" >"$OUT/down05-gluon.log" 2>&1
      echo "downsweep gluon: rc $?"; grep -E "gluon best|^table|^\|" "$OUT/down05-gluon.log" | head -12;;
    *) OUT=$OUT bash tools/device_s28.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
