#!/usr/bin/env bash
# Device calls of the 2026-11-30 night session (issues 12, 13): the whole GPU suite, the
# single-user bench twice in one call (the spread before any A/B), the batched-step profile
# (tools/prof_batch.py), the --parallel table and the A/B of named switches on it.
#   run(command="bash tools/device_s4.sh [tests] [bench] [prof] [parallel] [pab]", carry=[".whl"])
set -u
STEPS=${*:-tests bench prof}
source tools/device_setup.sh >/dev/null
M="python3 -m minfer"
Q7=/tmp/q7.gguf
[ -f $Q7 ] || pgrep -f "^python3? -m minfer synth" >/dev/null || ($M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1 &)
# (anchored: an unanchored pattern also matches the shell whose command line starts the synth, perf-log AJ3 / AK7)
waitq7() { sleep 1; while [ ! -f $Q7 ] || pgrep -f "^python3? -m minfer synth" >/dev/null; do sleep 2; done; }
summary=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    tests)
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${TESTS_TIMEOUT:-220} python3 -m pytest -m gpu -q $xd -p no:cacheprovider ${PYTEST_ARGS:-} ${TESTS:-tests/gpu} \
        >"$OUT/pytest-gpu.log" 2>&1
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-gpu.log" | head -20
      grep -E "^E |^>|Error" "$OUT/pytest-gpu.log" | head -${FAIL_LINES:-30}
      summary="$summary\npytest -m gpu: $(tail -1 "$OUT/pytest-gpu.log")";;
    bench)
      waitq7
      for i in ${BENCH_RUNS:-1 2}; do
        MINFER_DEBUG_PATHS=1 timeout ${BENCH_TIMEOUT:-120} $M bench -m $Q7 -p 0 -n 128 -d 0,3354 -r ${REPS:-3} \
          --out "$OUT/bench-7b-$i.json" --no-progress >"$OUT/bench-7b-$i.log" 2>&1
        grep -i "fell back\|error\|Traceback" "$OUT/bench-7b-$i.log" | head -5
        mv "$OUT"/bench-7b-$i.md /tmp/ 2>/dev/null
        summary="$summary\nbench run $i:\n$(grep '^|' "$OUT/bench-7b-$i.log" | tail -2)"
      done;;
    prof)
      waitq7
      timeout ${PROF_TIMEOUT:-200} python3 tools/prof_batch.py $Q7 ${PROF_B:-32 128} >"$OUT/prof-batch.log" 2>&1
      tail -60 "$OUT/prof-batch.log";;
    dprof)    # tools/prof_decode.py: a graphed single-user step's kernels and the host gap between steps
      waitq7
      timeout ${DPROF_TIMEOUT:-150} python3 tools/prof_decode.py $Q7 ${DPROF_DEPTHS:-} >"$OUT/prof-decode.log" 2>&1
      grep -v "^ *$" "$OUT/prof-decode.log" | tail -${DPROF_LINES:-40};;
    parallel)
      waitq7
      MINFER_DEBUG_PATHS=1 timeout ${PARALLEL_TIMEOUT:-200} $M bench -m $Q7 --device cuda --parallel ${BATCHES:-1,8,32,128} \
        -p 512 -n 128 --out "$OUT/parallel-7b.json" >"$OUT/parallel.log" 2>&1
      tail -25 "$OUT/parallel.log"
      summary="$summary\nminfer bench --parallel (pp512 tg128):\n$(grep '^|' "$OUT/parallel.log")";;
    pab)      # PAB="VAR=a VAR=b": the --parallel table under each setting, in turn, same call
      waitq7
      for setting in ${PAB:-MINFER_BATCH_ASYNC=1 MINFER_BATCH_ASYNC=0}; do
        env $setting timeout ${PARALLEL_TIMEOUT:-150} $M bench -m $Q7 --device cuda --parallel ${PAB_BATCHES:-32,128} \
          -p 512 -n 128 >"${PAB_DIR:-$OUT}/pab-${setting//=/_}.log" 2>&1
        summary="$summary\n$setting:\n$(grep '^|' "${PAB_DIR:-$OUT}/pab-${setting//=/_}.log" | tail -4)"
      done;;
    serve)
      waitq7
      timeout ${SERVE_TIMEOUT:-300} python3 -m minfer.bench.serve_bench --launch -m $Q7 --device cuda --ctx 4096 \
        --url http://127.0.0.1:8093 --clients ${CLIENTS:-1,8,32,128} --prompt-lens 128,512,1024 --max-tokens 128 \
        --vocab 150000 --prefix 2048 --out "$OUT/serve-7b.json" >"$OUT/serve.log" 2>&1
      tail -30 "$OUT/serve.log"
      summary="$summary\nHTTP serving:\n$(grep -E '^\||^prefix' "$OUT/serve.log")";;
    sab)      # SAB="VAR=a VAR=b": the HTTP serving benchmark under each setting, in turn
      waitq7
      for setting in ${SAB:-MINFER_GIL_SWITCH_US=500 MINFER_GIL_SWITCH_US=0}; do
        env $setting timeout ${SERVE_TIMEOUT:-200} python3 -m minfer.bench.serve_bench --launch -m $Q7 --device cuda \
          --ctx 4096 --url http://127.0.0.1:8093 --clients ${CLIENTS:-1,8,32,128} --prompt-lens 128,512,1024 \
          --max-tokens 128 --vocab 150000 --out "/tmp/sab-${setting//=/_}.json" >"/tmp/sab-${setting//=/_}.log" 2>&1
        summary="$summary\n$setting:\n$(grep -E '^\|' "/tmp/sab-${setting//=/_}.log")"
      done;;
    diag)
      waitq7
      timeout ${DIAG_TIMEOUT:-240} python3 tools/diag_async.py $Q7 >"$OUT/diag.log" 2>&1; tail -80 "$OUT/diag.log";;
    *) echo "unknown step $step";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
echo -e "\n==== summary ====$summary"
