#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirtieth session (perf-log AZ7):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s30.sh q8rn; true", carry=[".whl"])
# q8rn: the Triton q8 down's residual norm tail (Switches.gemv_q8_resnorm) -- its GPU tests and the raw GEMV's
#   (the shared resnorm_tail.py), then the 0.5B geometry's in-process A/B MINFER_GEMV_Q8_RESNORM 0 -> 1 (tg128,
#   PAIRS interleaved pairs, -r 2), nothing else running.
# Other steps go to tools/device_s29.sh (hw, rn, prof, rawsweep, downsweep) and on.
set -u
STEPS=${*:-q8rn}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
M5=/tmp/d05.gguf
synth05() { [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --no-progress >/dev/null 2>&1; }
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    q8rn)
      ( synth05; touch /tmp/synth05.done ) &
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${Q8RN_TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q $xd -p no:cacheprovider \
        tests/gpu/test_gemv_q8_resnorm_gpu.py tests/gpu/test_gemv_raw_resnorm_gpu.py tests/gpu/test_gemv_glu_prologue_gpu.py \
        >"$OUT/pytest-q8rn.log" 2>&1
      echo "q8rn tests: $(tail -1 "$OUT/pytest-q8rn.log")"
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-q8rn.log" | head -10
      while [ ! -f /tmp/synth05.done ]; do sleep 1; done
      MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-150} python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 \
        --ab "MINFER_GEMV_Q8_RESNORM=0" "MINFER_GEMV_Q8_RESNORM=1" --pairs ${PAIRS:-8} --out "$OUT/q8rn-ab.json" \
        --no-progress >"$OUT/q8rn-ab.log" 2>&1
      echo "q8rn A/B: rc $?"
      grep -E "^\| [0-9]+ \| tg|^\| tg128|resnorm|fell back|Traceback" "$OUT/q8rn-ab.log" | head -20;;
    *) OUT=$OUT bash tools/device_s29.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
