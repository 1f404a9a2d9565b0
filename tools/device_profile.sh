#!/usr/bin/env bash
# Per-op profiles on the device (H200): the single-user decode step and batched decode steps of
# the synthetic 7B, then (optional) the GPU suite.
#   run(command="bash tools/device_profile.sh [single] [batch] [tests]", carry=[".whl"])
set -u
STEPS=${*:-single batch}
source tools/device_setup.sh >/dev/null
Q7=/tmp/q7.gguf
[ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/dev/null 2>&1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    single) timeout ${SINGLE_TIMEOUT:-120} python3 -m minfer.bench.kernels --profile $Q7 --prompt 512 \
              --json "$OUT/profile-single.json" >"$OUT/profile-single.log" 2>&1; grep -A30 "decode step (eager)" "$OUT/profile-single.log"; tail -2 "$OUT/profile-single.log";;
    batch) for b in ${BATCHES:-32 128}; do
             timeout ${BATCH_TIMEOUT:-120} python3 -m minfer.bench.kernels --profile $Q7 --batch $b --prompt 512 \
               --json "$OUT/profile-b$b.json" >"$OUT/profile-b$b.log" 2>&1; grep -v "^ *$" "$OUT/profile-b$b.log" | tail -32
           done;;
    tests) xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
           timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q $xd -p no:cacheprovider tests/gpu >"$OUT/pytest-gpu.log" 2>&1
           grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | head -20; tail -1 "$OUT/pytest-gpu.log";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
