#!/usr/bin/env bash
# Device calls of the 2026-12-07 forty-first session:
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s41.sh [steps]; true", carry=[".whl"])
# final: the 7B tg128 / d3354 bench (twice: the block flags' removal touched the Gluon GEMV's signature, so the
#   decode's speed is checked against the last records), then the whole GPU suite with -rP (the bf16 ratios of the
#   session's fixtures and of the fortieth's mended ones: deci, nomic-bert-moe, llama-embed).
# Other steps go to tools/device_s40.sh (enc, arch; then s39 ...).
set -u
rest=""
for step in ${*:-final}; do
  t0=$(date +%s)
  case $step in
    final)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      BENCH_RUNS="1 2" bash tools/device_s4.sh bench
      TESTS_TIMEOUT=${TESTS_TIMEOUT:-480} PYTEST_ARGS="-rP" FAIL_LINES=20 bash tools/device_s4.sh tests
      source tools/device_setup.sh >/dev/null
      grep -E "^(embed |rerank )?bf16 " "$OUT/pytest-gpu.log" | grep -iE "deci|nomic-bert-moe|llama-embed|pangu|deepseek|grove|t5|xverse|orion|codeshell|openelm|refact" | head -24
      gzip -9 "$OUT/pytest-gpu.log";;
    *) rest="$rest $step";;
  esac
  case $step in final) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s40.sh $rest
exit 0
