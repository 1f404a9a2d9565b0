#!/usr/bin/env bash
# Device calls of the 2026-12-06 twenty-eighth session (perf-log AX):
#   run(command="touch /tmp/q7.gguf; MINFER_COMMIT=<sha> bash tools/device_s28.sh build tests glu15 side; true", carry=[".whl"])
# glu15: the GLU prologue (Switches.gemv_glu_prologue) on the Gluon kernel -- the 1.5B geometry's in-process A/B
#   MINFER_GEMV_GLU_PROLOGUE 0 -> 1 (tg128, PAIRS interleaved pairs), on the file `side` then reuses (llama.cpp's vocab).
# Other steps go to tools/device_s26.sh (flip, glu, rule, ...) and on to device_s25.sh (build, side, ...).
# (The empty /tmp/q7.gguf keeps device_s25.sh from synthesizing the 7B when no step uses it.)
set -u
STEPS=${*:-glu15}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    glu15)
      F=/tmp/side-qwen2.5-1.5b.gguf
      [ -d /tmp/lc/llama.cpp ] || { mkdir -p /tmp/lc && tar xJf .lcpp.tar.xz -C /tmp/lc; }
      [ -f $F ] || python3 -m minfer synth $F --preset qwen2.5-1.5b --recipe q4_k_m \
        --tokenizer-from /tmp/lc/llama.cpp/ggml-vocab-qwen2.gguf --no-progress >>/tmp/synth-side.log 2>&1
      MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-150} python3 -m minfer bench -m $F -p 0 -n 128 -r 2 \
        --ab "MINFER_GEMV_GLU_PROLOGUE=0" "MINFER_GEMV_GLU_PROLOGUE=1" --pairs ${PAIRS:-4} --out /tmp/glu15-ab.json \
        --no-progress >"$OUT/glu15-ab.log" 2>&1
      echo "glu15 A/B: rc $?"
      grep -E "^\| [0-9]+ \| tg|^\| tg128" "$OUT/glu15-ab.log"
      grep -E "q8glu|into_gemv|gemv_q8\.(gluon|triton)|swiglu" "$OUT/glu15-ab.log" | head -12
      grep -iE "fell back|Traceback|Error" "$OUT/glu15-ab.log" | head -5;;
    *) OUT=$OUT bash tools/device_s26.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
