#!/usr/bin/env bash
# Device calls of the 2026-12-07 thirty-fifth session (perf-log CE0):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s35.sh [steps]; true", carry=[".whl"])
# ncu (the default): the decode GEMV's shapes (q/k/v, o, gate+up, the Q4_K and Q6_K downs) under Nsight Compute,
#   launched as the engine launches them (tools/ncu_gemv.py): why the one-wave split-K down reads ~2.9 TB/s where
#   gate+up reads ~3.9 (perf-log CD3). The raw CSV goes to $OUT/ncu.csv, the summary table to stdout.
# newarch: the two architectures this session added (chatglm, llama with experts as mixtral) through
#   tests/gpu/test_arch_gpu.py (float32 against transformers, bf16 against the CPU, their paths).
# Other steps go to tools/device_s34.sh (why635, probe, side8; then s33 ... s4).
set -u
for step in ${*:-ncu}; do
  case $step in
    ncu)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      export MINFER_SETUP_DONE=1
      NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
      [ -n "$NCU" ] || { echo "no ncu on this machine"; continue; }
      echo "ncu: $NCU ($($NCU --version | tail -1))"
      timeout ${NCU_TIMEOUT:-400} $NCU --clock-control none --profile-from-start off --kernel-name regex:gemv_q8g \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --csv --page raw \
        python3 tools/ncu_gemv.py --calls ${NCU_CALLS:-2} ${NCU_SHAPES:+--shapes $NCU_SHAPES} \
        >"$OUT/ncu.csv" 2>"$OUT/ncu.err"
      echo "ncu rc $?"; grep -v "^==PROF==" "$OUT/ncu.err" | tail -15
      python3 tools/ncu_gemv.py --summarize "$OUT/ncu.csv";;
    newarch)
      source tools/device_setup.sh >/dev/null
      export MINFER_SETUP_DONE=1
      timeout ${NEWARCH_TIMEOUT:-150} python3 -m pytest -m gpu -q -rP -p no:cacheprovider tests/gpu/test_arch_gpu.py \
        -k "chatglm or mixtral" >"$OUT/pytest-newarch.log" 2>&1
      echo "newarch rc $?"; grep -E "^bf16 |^(FAILED|ERROR)|^E " "$OUT/pytest-newarch.log" | head -20
      tail -1 "$OUT/pytest-newarch.log";;
    *) bash tools/device_s34.sh $step;;
  esac
done
exit 0
