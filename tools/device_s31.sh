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
    card2)   # call 2 (perf-log BA1): on an H200 the llama.cpp build with the tile4 GPU tests beside it, the side
             # by side (0.5B, 7B; REPS 2), then the tile4 A/B; elsewhere the tile4 tests and A/B, then the 0.5B profile
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      case "$gpu" in
        *H200*) touch /tmp/q7.gguf
                bash tools/device_s30.sh build
                xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n 8"
                timeout 150 python3 -m pytest -m gpu -q $xd -p no:cacheprovider tests/gpu/test_gemv_raw_tile4_gpu.py \
                  tests/gpu/test_gemv_raw_rope_gpu.py >"$OUT/pytest-tile4.log" 2>&1
                echo "tile4 tests: $(tail -1 "$OUT/pytest-tile4.log")"
                grep -E "^(FAILED|ERROR)" "$OUT/pytest-tile4.log" | head -10
                SIDE_MODELS=${SIDE_MODELS:-"qwen2.5-0.5b qwen2.5-7b"} REPS=${REPS:-2} bash tools/device_s30.sh side
                PAIRS=${PAIRS:-6} bash tools/device_s30.sh tile4ab;;
        *) bash tools/device_s30.sh tile4 prof;;
      esac;;
    *) bash tools/device_s30.sh $step;;
  esac
done
exit 0
