#!/usr/bin/env bash
# Serving many users on the device (H200): the GPU batching tests, the synthetic 7B, the batched
# table (`minfer bench --parallel`) and the HTTP serving benchmark (minfer/bench/serve_bench.py)
# at 1/8/32/128 clients plus prefix-reuse TTFT. From the repo root:
#   run(command="MINFER_COMMIT=<hash of HEAD> bash tools/device_serve.sh [STEPS]", carry=[".whl"])
# .whl must hold the gguf wheel and the server's wheels the image lacks (fastapi, starlette,
# pydantic, pydantic-core, annotated-types, typing-inspection, uvicorn; see tools/README or the
# device notes). STEPS (default: tests synth parallel serve parallel_raw), any subset in order;
# parallel_raw is the batched table without the dense bf16 planes (--dense-planes off: raw-block
# GEMV up to M=32, dequantize + cuBLAS above), the A/B of that choice.
# Writes JSON under $OUT (at most 8 files come back) and prints a short table last. ~6-8 minutes.
set -u
STEPS=${*:-tests synth parallel serve parallel_raw}
source tools/device_setup.sh
M="python3 -m minfer"
Q7=/tmp/q7.gguf
summary=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    tests)
      timeout ${TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q -x -p no:cacheprovider tests/gpu/test_batching_gpu.py 2>&1 \
        | tee /tmp/pytest-batching.log | tail -40
      cp /tmp/pytest-batching.log "$OUT/pytest-batching.log"
      summary="$summary\npytest tests/gpu/test_batching_gpu.py: $(tail -1 /tmp/pytest-batching.log)";;
    synth)
      [ -f $Q7 ] || $M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m 2>&1 | tail -2;;
    parallel)
      MINFER_DEBUG_PATHS=1 timeout ${PARALLEL_TIMEOUT:-200} $M bench -m $Q7 --device cuda --parallel ${BATCHES:-1,8,32,128} \
        -p 512 -n 128 --out "$OUT/parallel-7b.json" 2>&1 | tee /tmp/parallel.log | tail -40
      summary="$summary\nminfer bench --parallel (7B Q4_K_M synth, pp512 tg128):\n$(grep '^|' /tmp/parallel.log)";;
    parallel_raw)
      timeout ${PARALLEL_TIMEOUT:-200} $M bench -m $Q7 --device cuda --parallel ${BATCHES:-1,8,32,128} \
        -p 512 -n 128 --dense-planes off --out "$OUT/parallel-7b-raw.json" 2>&1 | tee /tmp/parallel-raw.log | tail -12
      summary="$summary\nthe same without dense planes (--dense-planes off):\n$(grep '^|' /tmp/parallel-raw.log)";;
    serve)
      timeout ${SERVE_TIMEOUT:-240} python3 -m minfer.bench.serve_bench --launch -m $Q7 --device cuda --ctx 4096 \
        --url http://127.0.0.1:8093 --clients ${CLIENTS:-1,8,32,128} --prompt-lens 128,512,1024 --max-tokens 128 \
        --vocab 150000 --prefix 2048 --out "$OUT/serve-7b.json" 2>&1 | tee /tmp/serve.log | tail -30
      summary="$summary\nHTTP serving (closed loop, prompts 128/512/1024, 128 tokens):\n$(grep -E '^\||^prefix' /tmp/serve.log)";;
    *) echo "unknown step $step";;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
echo -e "\n==== summary ====$summary"
