#!/usr/bin/env bash
# The lead's recorded device run (H200) of a session: GPU tests, the synthetic 7B single-user
# bench (pp/tg at depth 0 and 3354, launch paths), the previous release as the control in the
# same run (tree in .old/, carried), the batched table and the HTTP serving benchmark.
#   run(command="MINFER_COMMIT=<hash> bash tools/device_final.sh [STEPS]", carry=[".whl", ".old"])
# STEPS (default: tests bench old): any of tests bench old parallel serve, in order.
# Every step has its own timeout so one failure cannot eat the call; JSON/logs go to $OUT.
set -u
STEPS=${*:-tests bench old}
source tools/device_setup.sh >/dev/null
M="python3 -m minfer"
Q7=/tmp/q7.gguf
summary=""
[ -f $Q7 ] || $M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/dev/null 2>&1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    tests)
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q $xd -p no:cacheprovider tests/gpu >"$OUT/pytest-gpu.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | head -20
      summary="$summary\npytest -m gpu: $(tail -1 "$OUT/pytest-gpu.log")";;
    bench)
      MINFER_DEBUG_PATHS=1 timeout ${BENCH_TIMEOUT:-150} $M bench -m $Q7 -p 512,3354 -n 128 -d 0,3354 -r ${REPS:-2} \
        --out "$OUT/bench-7b.json" --no-progress >"$OUT/bench-7b.log" 2>&1
      grep -v "^ *$" "$OUT/bench-7b.log" | tail -45
      summary="$summary\nminfer (this tree):\n$(grep '^|' "$OUT/bench-7b.log")";;
    old)
      (cd .old && timeout ${OLD_TIMEOUT:-90} python3 -m minfer bench -m $Q7 -p 3354 -n 128 -r ${REPS:-2} --no-progress 2>&1 | tail -5) >"$OUT/bench-old.log"
      timeout ${OLD_TIMEOUT:-90} $M bench -m $Q7 -p 3354 -n 128 -r ${REPS:-2} --no-progress 2>&1 | tail -5 >"$OUT/bench-new2.log"
      summary="$summary\ncontrol (.old) then this tree, back to back:\n$(grep '^|' "$OUT/bench-old.log" | tail -2)\n$(grep '^|' "$OUT/bench-new2.log" | tail -2)";;
    parallel)
      MINFER_DEBUG_PATHS=1 timeout ${PARALLEL_TIMEOUT:-200} $M bench -m $Q7 --device cuda --parallel ${BATCHES:-1,8,32,128} \
        -p 512 -n 128 --out "$OUT/parallel-7b.json" >"$OUT/parallel.log" 2>&1
      tail -40 "$OUT/parallel.log"
      summary="$summary\nminfer bench --parallel (pp512 tg128):\n$(grep '^|' "$OUT/parallel.log")";;
    serve)
      timeout ${SERVE_TIMEOUT:-220} python3 -m minfer.bench.serve_bench --launch -m $Q7 --device cuda --ctx 4096 \
        --url http://127.0.0.1:8093 --clients ${CLIENTS:-1,8,32,128} --prompt-lens 128,512,1024 --max-tokens 128 \
        --vocab 150000 --prefix 2048 --out "$OUT/serve-7b.json" >"$OUT/serve.log" 2>&1
      tail -30 "$OUT/serve.log"
      summary="$summary\nHTTP serving:\n$(grep -E '^\||^prefix' "$OUT/serve.log")";;
    *) echo "unknown step $step";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
echo -e "\n==== summary ====$summary"
