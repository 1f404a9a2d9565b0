#!/usr/bin/env bash
# The recorded device run of the 2026-11-30 late session (one call, ~7 minutes): the whole GPU
# suite, the synthetic 7B decode at depth 0 and 3354 with the defaults, the interleaved A/B of
# the gate+up GEMV's SwiGLU epilogue, and the batched table with the default dense planes (32)
# and with the int8 GEMM (MINFER_QGEMM_Q8=1; 1,8,32,128). Every step has its own timeout.
#   run(command="bash tools/device_session3.sh", carry=[".whl"], timeout_s=480)
set -u
source tools/device_setup.sh >/dev/null
M="python3 -m minfer"
Q7=/tmp/q7.gguf
($M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1; touch /tmp/synth.done) &
t0=$(date +%s)
xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
timeout ${TESTS_TIMEOUT:-130} python3 -m pytest -m gpu -q $xd -p no:cacheprovider tests/gpu >"$OUT/pytest-gpu.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | head -20; echo "pytest -m gpu: $(tail -1 "$OUT/pytest-gpu.log") [$(( $(date +%s) - t0 )) s]"
while [ ! -f /tmp/synth.done ]; do sleep 1; done
t0=$(date +%s)
MINFER_DEBUG_PATHS=1 timeout 50 $M bench -m $Q7 -p 0 -n 128 -d 0,3354 -r 3 --out "$OUT/bench-7b.json" --no-progress \
  >"$OUT/bench-7b.log" 2>&1
grep "^|" "$OUT/bench-7b.log"; grep -E "fell back|q8swiglu|decode.q8|pdl.gemv" "$OUT/bench-7b.log" | head -8; echo "[bench $(( $(date +%s) - t0 )) s]"
t0=$(date +%s)
timeout 45 $M bench -m $Q7 -p 0 -n 128 -r 3 --ab MINFER_GEMV_SWIGLU=1 MINFER_GEMV_SWIGLU=0 --no-progress >"$OUT/ab-swiglu.log" 2>&1
echo "== A: MINFER_GEMV_SWIGLU=1  B: =0"; grep "^|" "$OUT/ab-swiglu.log" | tail -6; echo "[ab $(( $(date +%s) - t0 )) s]"
t0=$(date +%s)
MINFER_DEBUG_PATHS=1 timeout 55 $M bench -m $Q7 --device cuda --parallel 32 -p 512 -n 128 --out "$OUT/parallel-default.json" \
  >"$OUT/parallel-default.log" 2>&1
echo "== parallel, defaults (dense bf16 planes)"; grep "^|" "$OUT/parallel-default.log"; echo "[par $(( $(date +%s) - t0 )) s]"
t0=$(date +%s)
MINFER_QGEMM_Q8=1 MINFER_DEBUG_PATHS=1 timeout ${PAR_TIMEOUT:-130} $M bench -m $Q7 --device cuda --parallel 1,8,32,128 -p 512 -n 128 \
  --out "$OUT/parallel-q8.json" >"$OUT/parallel-q8.log" 2>&1
echo "== parallel, MINFER_QGEMM_Q8=1"; grep "^|" "$OUT/parallel-q8.log"; grep -E "qgemm_q8|fell back" "$OUT/parallel-q8.log" | head -6
echo "[par-q8 $(( $(date +%s) - t0 )) s]"
