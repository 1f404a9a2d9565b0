#!/usr/bin/env bash
# The int8-activation GEMV on the device: its GPU tests, then the per-shape sweep against the bf16 GEMV.
#   run(command="bash tools/device_q8.sh", carry=[".whl"])
set -u
source tools/device_setup.sh >/dev/null
timeout ${TESTS_TIMEOUT:-120} python3 -m pytest -q -p no:cacheprovider tests/gpu/test_gemv_q8_gpu.py ${EXTRA_TESTS:-} >"$OUT/pytest-q8.log" 2>&1
grep -E "^(FAILED|ERROR)|Error|assert" "$OUT/pytest-q8.log" | head -20; tail -1 "$OUT/pytest-q8.log"
timeout ${SWEEP_TIMEOUT:-240} python3 -m minfer.bench.gemv_q8_sweep --json "$OUT/q8-sweep.json" --budget-s ${BUDGET:-150} >"$OUT/q8-sweep.log" 2>&1
grep -E "^\||quantize|failed|WRONG|Error" "$OUT/q8-sweep.log" | tail -40
