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
    gather)   # perf-log BA3: the split tiles' one-round partial sums (Switches.split_gather) -- its GPU test, then the 7B's
              # in-process A/B MINFER_SPLIT_GATHER 0 -> 1 (tg128, PAIRS pairs, -r 2), nothing else running
      source tools/device_setup.sh >/dev/null
      ( [ -s /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m --no-progress \
          >/tmp/synth7.log 2>&1; touch /tmp/synth7.done ) &
      if [ "${GATHER_TESTS:-1}" = 1 ]; then
        timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_split_gather_gpu.py >"$OUT/pytest-gather.log" 2>&1
        echo "gather tests: $(tail -1 "$OUT/pytest-gather.log")"
        grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-gather.log" | head -8
      fi
      while [ ! -f /tmp/synth7.done ]; do sleep 1; done
      set -- ${GATHER_AB:-0 1}; ab=${GATHER_NAME:-gather}   # (tools/device_s32.sh gather2: GATHER_AB="1 2", no tests)
      MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-240} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -r 2 \
        --ab MINFER_SPLIT_GATHER=$1 MINFER_SPLIT_GATHER=$2 --pairs ${PAIRS:-6} --out "$OUT/$ab-ab.json" --no-progress \
        >"$OUT/$ab-ab.log" 2>&1
      echo "$ab A/B: rc $?"
      grep -E "^\| [0-9]+ \| tg|^\| tg128|gemv_q8|fell back|Traceback" "$OUT/$ab-ab.log" | head -20;;
    card3)   # call 3: the tile4 tests and A/B (0.5B), then the gather test and the 7B's A/B
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      bash tools/device_s30.sh tile4
      bash tools/device_s31.sh gather;;
    *) bash tools/device_s30.sh $step;;
  esac
done
exit 0
