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
card_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
for step in ${*:-card}; do
  case $step in
    card)
      echo "card: $(card_name)"
      case "$(card_name)" in
        *H200*) bash tools/device_s31.sh card;;   # its H200 branch: build side (0.5B, 7B at d 0 / 3354, 8B)
        *) bash tools/device_s32.sh suite;;
      esac;;
    suite)
      echo "card: $(card_name)"
      TESTS_TIMEOUT=${TESTS_TIMEOUT:-330} BENCH_RUNS=${BENCH_RUNS:-1} REPS=${REPS:-2} bash tools/device_s4.sh tests bench;;
    gather2)   # perf-log BB1: the 7B's in-process A/B MINFER_SPLIT_GATHER 1 -> 2 (the gather on the uncapped Q6_K down
               # only; the Q4_K down's capped build back to the loop), tg128, PAIRS pairs, -r 2, nothing else running
      GATHER_AB="1 2" GATHER_TESTS=0 GATHER_NAME=gather2 bash tools/device_s31.sh gather;;
    card2)   # call 6 (perf-log BB3): on an H200 the 7B's bench with the defaults of 9d77fd2, two processes (REPS 3);
             # on any other card the 4-row raw tile's 0.5B A/B again (PAIRS 8)
      echo "card: $(card_name)"
      case "$(card_name)" in
        *H200*) BENCH_RUNS="1 2" REPS=${REPS:-3} bash tools/device_s4.sh bench;;
        *) PAIRS=${PAIRS:-8} bash tools/device_s29.sh tile4ab;;
      esac;;
    *) bash tools/device_s31.sh $step;;
  esac
done
exit 0
