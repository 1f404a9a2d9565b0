#!/usr/bin/env bash
# Issue 12, programmatic dependent launch: GPU tests of the decode chain, then the interleaved
# A/B of MINFER_PDL on the synthetic 7B (one process, `minfer bench --ab`), then tg128 at depth
# 0 and 3354 with the defaults.   run(command="bash tools/device_pdl.sh [ab] [bench] [sweep]", carry=[".whl"])
set -u
STEPS=${*:-tests ab bench}
source tools/device_setup.sh >/dev/null
M="python3 -m minfer"
Q7=/tmp/q7.gguf
[ -f $Q7 ] || ($M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1 &)
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    tests)
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-6}"
      timeout ${TESTS_TIMEOUT:-180} python3 -m pytest -m gpu -q $xd -p no:cacheprovider ${TESTS:-tests/gpu/test_pdl_gpu.py \
        tests/gpu/test_gemv_q8_gpu.py tests/gpu/test_cuda_graphs.py tests/gpu/test_model_gpu.py tests/gpu/test_kernels_gpu.py} \
        >"$OUT/pytest-gpu.log" 2>&1
      grep -E "^(FAILED|ERROR)|Error" "$OUT/pytest-gpu.log" | head -20; tail -1 "$OUT/pytest-gpu.log";;
    ab)
      while [ ! -f $Q7 ] || pgrep -f "^python3? -m minfer synth" >/dev/null; do sleep 2; done
      for item in ${AB:-MINFER_PDL}; do      # VAR (A: VAR=1, B: VAR=0) or VAR:a:b
        IFS=: read -r sw a b <<<"$item"; a=${a:-1}; b=${b:-0}
        timeout ${AB_TIMEOUT:-120} $M bench -m $Q7 -p 0 -n 128 -r ${REPS:-3} --ab "$sw=$a" "$sw=$b" --no-progress \
          >"$OUT/ab-$sw.log" 2>&1
        echo "== A: $sw=$a   B: $sw=$b"; grep "^|" "$OUT/ab-$sw.log" | tail -6; grep -i "error\|Traceback" "$OUT/ab-$sw.log" | head -5
      done;;
    bench)
      while [ ! -f $Q7 ] || pgrep -f "^python3? -m minfer synth" >/dev/null; do sleep 2; done
      MINFER_DEBUG_PATHS=1 timeout ${BENCH_TIMEOUT:-150} $M bench -m $Q7 -p 0 -n 128 -d 0,3354 -r ${REPS:-3} \
        --out "$OUT/bench-7b.json" --no-progress >"$OUT/bench-7b.log" 2>&1
      grep "^|" "$OUT/bench-7b.log"; grep -i "pdl\|fell back\|error" "$OUT/bench-7b.log" | head -12;;
    sweep)
      timeout ${SWEEP_TIMEOUT:-240} python3 -m minfer.bench.qgemm_q8_sweep ${SWEEP_ARGS:-} --out "$OUT/qgemm_q8_h200.json" \
        >"$OUT/sweep.log" 2>&1; tail -40 "$OUT/sweep.log";;
    *) echo "unknown step $step";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
