#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirty-first session (perf-log BA0):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s31.sh [steps]; true", carry=[".whl", ".lcpp.tar.xz"])
# card (the default): on an H200 the llama.cpp side by side (build side: the 0.5B, the 7B at d 0 / 3354,
#   Llama-3.1-8B, REPS 2); on any other card the raw rope A/B and the raw GEMV sweep (rope rawsweep).
# Other steps go to tools/device_s30.sh (rope, rawsweep, hw, ...; then s28, s26, s25: build, side, tests, bench).
set -u
STEPS=${*:-card}
for step in $STEPS; do
  case $step in
    card)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      case "$gpu" in
        *H200*) touch /tmp/q7.gguf
                SIDE_MODELS=${SIDE_MODELS:-"qwen2.5-0.5b qwen2.5-7b llama3.1-8b"} REPS=${REPS:-2} \
                  bash tools/device_s30.sh build side;;
        *) bash tools/device_s30.sh rope rawsweep;;
      esac;;
    card2)   # call 2 (perf-log BA1; the budget too small for a llama.cpp build): the tile4 GPU tests and its 0.5B A/B,
             # then the 0.5B's profile with every default
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      bash tools/device_s30.sh tile4 prof;;
    *) bash tools/device_s30.sh $step;;
  esac
done
exit 0
