#!/usr/bin/env bash
# Device calls of the 2026-12-07 thirty-ninth session:
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s39.sh [steps]; true", carry=[".whl"])
# flag: the down's flag wait (Switches.flag_down, ops/cuda/gemv_q8g_flags.py, perf-log CI1): its GPU tests (the 7B's
#   three layers bit-equal with the switch on and off at every graphed step, the flags zero after; the unconsumed
#   flags' memset), the SwiGLU / split-gather tests beside it; then tools/skip_oracle.py on the synthetic 7B at
#   depths 100 / 3354 (base, the SwiGLU epilogue (Switches.gemv_swiglu 1, whose tile pairs set the flags), and
#   the epilogue with the flags), then the in-process `minfer bench -p 0 -n 128 -d 0,3354 --ab
#   "MINFER_GEMV_SWIGLU=1" "MINFER_GEMV_SWIGLU=1 MINFER_FLAG_DOWN=1"` (AB_A, AB_B), PAIRS pairs (default 4), whatever the oracle says (the A/B decides).
# timeline: tools/gemv_timeline.py at depth 100 with the flags (the down's release after gate+up's end).
# Other steps go to tools/device_s38.sh (suite, embed; then s37 ... s4).
set -u
rest=""
for step in ${*:-flag}; do
  t0=$(date +%s)
  case $step in
    flag)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      timeout ${FLAG_TESTS_TIMEOUT:-240} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_flag_down_gpu.py \
        tests/gpu/test_split_gather_gpu.py tests/gpu/test_gemv_q8_gpu.py -k "flag or gather or swiglu" \
        >"$OUT/pytest-flag.log" 2>&1
      echo "flag tests rc $?"; grep -E "^(FAILED|ERROR)|^E " "$OUT/pytest-flag.log" | head -20
      tail -1 "$OUT/pytest-flag.log"
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m --no-progress \
        >/tmp/synth.log 2>&1
      timeout ${ORACLE_TIMEOUT:-240} python3 tools/skip_oracle.py /tmp/q7.gguf 100 3354 -- base \
        env:MINFER_GEMV_SWIGLU=1 env:MINFER_GEMV_SWIGLU=1,MINFER_FLAG_DOWN=1 >"$OUT/flag-oracle.log" 2>&1
      echo "oracle rc $?"; grep -E "^\||^depth|Error|error" "$OUT/flag-oracle.log" | grep -v "^|---" | head -20
      [ "${AB:-1}" = 1 ] || continue     # (AB=0: the oracle only)
      MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-200} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 \
        -d 0,3354 -r ${REPS:-2} --ab "${AB_A:-MINFER_GEMV_SWIGLU=1}" "${AB_B:-MINFER_GEMV_SWIGLU=1 MINFER_FLAG_DOWN=1}" --pairs ${PAIRS:-4} --no-progress >"$OUT/flag-ab.log" 2>&1
      echo "ab rc $?"; grep -E "^A/B|^\| (tg|[0-9])|flag_down|q8swiglu|fell back" "$OUT/flag-ab.log" | tail -24;;
    timeline)
      source tools/device_setup.sh >/dev/null
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m --no-progress \
        >/tmp/synth.log 2>&1
      timeout 200 python3 tools/gemv_timeline.py /tmp/q7.gguf 100 -- env:MINFER_FLAG_DOWN=1 >"$OUT/timeline-flag.log" 2>&1
      echo "timeline rc $?"; grep -E "^depth|^\| (gate|down)|a layer" "$OUT/timeline-flag.log" | head -12;;
    *) rest="$rest $step";;
  esac
  case $step in flag|timeline) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s38.sh $rest
exit 0
