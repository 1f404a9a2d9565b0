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
    abtree)
      # the decode of two trees interleaved, one process a run: A = .old.tgz (untracked: `git archive <sha> minfer |
      # gzip > .old.tgz`), B = this checkout; tg128 only, ABRUNS pairs
      source tools/device_setup.sh >/dev/null
      mkdir -p /tmp/old && tar xzf .old.tgz -C /tmp/old
      # the editable install's finder claims `minfer` before PYTHONPATH (call 3 ran this checkout on both sides): off
      python3 -m pip uninstall -y -q minfer >/dev/null 2>&1
      Q7=/tmp/q7.gguf
      [ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/dev/null 2>&1
      for i in $(seq ${ABRUNS:-3}); do
        for side in A B; do
          if [ $side = A ]; then pp=/tmp/site:/tmp/old; else pp=/tmp/site:$PWD; fi
          (cd /tmp && PYTHONPATH=$pp timeout 120 python3 -m minfer bench -m $Q7 -p 0 -n 128 -r 3 --no-progress \
            --out "/tmp/ab-$side-$i.json" >"/tmp/ab-$side-$i.log" 2>&1)
          echo "$side $i $(cd /tmp && PYTHONPATH=$pp python3 -c 'import minfer, os; print(os.path.dirname(minfer.__file__))') \
            $(grep -E '^\|.*tg128' /tmp/ab-$side-$i.log | awk -F'|' '{print $7}')" | tee -a "$OUT/abtree.log"
        done
      done
      cat /tmp/ab-A-1.log /tmp/ab-B-1.log >>"$OUT/abtree.log";;
    *) rest="$rest $step";;
  esac
  case $step in final|abtree) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s40.sh $rest
exit 0
