#!/usr/bin/env bash
# Device calls of the 2026-12-07 thirty-eighth session:
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s38.sh [steps]; true", carry=[".whl"])
# suite: the whole GPU suite (tools/device_s4.sh tests: Model.head now ends every forward), then the embeddings'
#   GPU tests again with their bf16 lines shown (tests/gpu/test_embed_gpu.py: float32 against llama.cpp's vectors,
#   bf16 against the CPU, a graphed decode after an embedding), and one 7B tg128 bench (the head refactor in the
#   decode graph).
# embed: tests/gpu/test_embed_gpu.py alone, with -rP.
# Other steps go to tools/device_s37.sh (stages, ring, final; then s36 ... s4).
set -u
rest=""
for step in ${*:-suite}; do
  t0=$(date +%s)
  case $step in
    suite)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      TESTS_TIMEOUT=${TESTS_TIMEOUT:-420} BENCH_RUNS=1 bash tools/device_s4.sh tests bench
      source tools/device_setup.sh >/dev/null
      timeout 200 python3 -m pytest -m gpu -q -rP -p no:cacheprovider tests/gpu/test_embed_gpu.py \
        >"$OUT/pytest-embed.log" 2>&1
      echo "embed rc $?"; grep -E "^embed bf16|^(FAILED|ERROR)" "$OUT/pytest-embed.log" | head -20
      tail -1 "$OUT/pytest-embed.log";;
    embed)    # the embeddings' GPU tests alone, their bf16 lines shown
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      timeout 200 python3 -m pytest -m gpu -q -rP -p no:cacheprovider tests/gpu/test_embed_gpu.py \
        >"$OUT/pytest-embed.log" 2>&1
      echo "embed rc $?"; grep -E "^embed bf16|^(FAILED|ERROR)" "$OUT/pytest-embed.log" | head -20
      tail -1 "$OUT/pytest-embed.log";;
    *) rest="$rest $step";;
  esac
  case $step in suite|embed) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s37.sh $rest
exit 0
