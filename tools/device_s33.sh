#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirty-third session (perf-log CC0):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s33.sh [steps]; true", carry=[".whl", ".lcpp.tar.xz"])
# card (the default): on an H200 the llama.cpp side by side owed since the twenty-ninth session (build side: the
#   0.5B, the 7B at d 0 / 3354, Llama-3.1-8B, REPS 2; tools/device_s31.sh card); on any other card `tile4`.
# ropediag: tools/rope_epilogue_diag.py (SEEDS seeded activations over the rope epilogue test's 48 cases), then the
#   test file itself with MINFER_GEMV_RAW_TILE4 0 and 1 (perf-log CC1-CC2).
# fix: ropediag, then tile4 (perf-log CC2).
# tile4: the whole `pytest -m gpu` (xdist -n 8, 330 s cap) with MINFER_GEMV_RAW_TILE4=1 -- the test owed before the
#   4-row raw tile goes on by default (perf-log BB4).
# Other steps go to tools/device_s32.sh (suite, gather2, card2; then s31, s30, s29, s28, s26, s25, s4).
set -u
card_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
for step in ${*:-card}; do
  case $step in
    card)
      echo "card: $(card_name)"
      case "$(card_name)" in
        *H200*) bash tools/device_s31.sh card;;
        *) bash tools/device_s33.sh tile4;;
      esac;;
    tile4)
      echo "card: $(card_name)"
      MINFER_GEMV_RAW_TILE4=1 TESTS_TIMEOUT=${TESTS_TIMEOUT:-330} bash tools/device_s4.sh tests;;
    ropediag)   # perf-log CC1: where the raw rope epilogue and GEMV + rope_kv disagree (seeded), then the test file
                # itself 3 times each with MINFER_GEMV_RAW_TILE4 unset and 1 (xdist -n 8)
      echo "card: $(card_name)"
      source tools/device_setup.sh >/dev/null
      timeout ${DIAG_TIMEOUT:-200} python3 tools/rope_epilogue_diag.py --seeds ${SEEDS:-40} >"$OUT/rope-diag.log" 2>&1
      grep -v "seeds with a mismatch" "$OUT/rope-diag.log" | head -40; grep "seeds with a mismatch" "$OUT/rope-diag.log"
      for t4 in ${ROPE_T4:-0 1}; do
        MINFER_GEMV_RAW_TILE4=$t4 timeout 120 python3 -m pytest -m gpu -q -n 8 -p no:cacheprovider \
          tests/gpu/test_gemv_raw_rope_gpu.py >"$OUT/rope-test-$t4.log" 2>&1
        echo "tile4=$t4: $(tail -1 "$OUT/rope-test-$t4.log")"; grep "^FAILED" "$OUT/rope-test-$t4.log"
      done;;
    card3)   # call 3 (perf-log CC3): on an H200 the side by side without Llama-3.1-8B (the budget), else `fix`
      echo "card: $(card_name)"
      case "$(card_name)" in
        *H200*) SIDE_MODELS=${SIDE_MODELS:-"qwen2.5-0.5b qwen2.5-7b"} bash tools/device_s31.sh card;;
        *) bash tools/device_s33.sh fix;;
      esac;;
    fix)
      SEEDS=${SEEDS:-20} bash tools/device_s33.sh ropediag tile4;;
    *) bash tools/device_s32.sh $step;;
  esac
done
exit 0
