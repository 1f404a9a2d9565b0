#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirty-second session (perf-log BB0):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s32.sh [steps]; true", carry=[".whl", ".lcpp.tar.xz"])
# card (the default): on an H200 the llama.cpp side by side owed since the twenty-ninth session (build side: the
#   0.5B, the 7B at d 0 / 3354, Llama-3.1-8B, REPS 2); on any other card the whole `pytest -m gpu` on the
#   defaults of 9d77fd2 (raw rope, split gather on), then the 7B's bench (suite).
# card2: on an H200 the 7B's bench (two processes), else the 4-row raw tile's A/B again.
# suite: the whole GPU suite (TESTS_TIMEOUT 330), then `minfer bench` of the 7B (d 0 / 3354, one process).
# Other steps go to tools/device_s31.sh (gather, card2, ...; then s30, s29, s28, s26, s25, s4).
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
        *) bash tools/device_s32.sh suite;;
      esac;;
    suite)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      TESTS_TIMEOUT=${TESTS_TIMEOUT:-330} BENCH_RUNS=${BENCH_RUNS:-1} REPS=${REPS:-2} bash tools/device_s4.sh tests bench;;
    gather2)   # perf-log BB1: the 7B's in-process A/B MINFER_SPLIT_GATHER 1 -> 2 (the gather on the uncapped Q6_K down
               # only; the Q4_K down's capped build back to the loop), tg128, PAIRS pairs, -r 2, nothing else running
      source tools/device_setup.sh >/dev/null
      ( [ -s /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m --no-progress \
          >/tmp/synth7.log 2>&1; touch /tmp/synth7.done ) &
      while [ ! -f /tmp/synth7.done ]; do sleep 1; done
      MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-240} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -r 2 \
        --ab MINFER_SPLIT_GATHER=1 MINFER_SPLIT_GATHER=2 --pairs ${PAIRS:-6} --out "$OUT/gather2-ab.json" --no-progress \
        >"$OUT/gather2-ab.log" 2>&1
      echo "gather2 A/B: rc $?"
      grep -E "^\| [0-9]+ \| tg|^\| tg128|gemv_q8|fell back|Traceback" "$OUT/gather2-ab.log" | head -20;;
    card2)   # call 6 (perf-log BB3): on an H200 the 7B's bench with the defaults of 9d77fd2, two processes (REPS 3);
             # on any other card the 4-row raw tile's 0.5B A/B again (PAIRS 8)
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "card: $gpu"
      case "$gpu" in
        *H200*) BENCH_RUNS="1 2" REPS=${REPS:-3} bash tools/device_s4.sh bench;;
        *) PAIRS=${PAIRS:-8} bash tools/device_s29.sh tile4ab;;
      esac;;
    *) bash tools/device_s31.sh $step;;
  esac
done
exit 0
