#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirty-fourth session (perf-log CD0):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s34.sh [steps]; true", carry=[".whl", ".lcpp.tar.xz"])
# why635 (the default): why the H200 7B read 634.9 tok/s in the thirty-third session's side step and 657.7 alone
#   (perf-log CC4-CC5). llama.cpp is built first (nothing else running after the build), then, with the SM clock,
#   memory clock, power and temperature sampled every 0.5 s beside each run (clocks-*.csv):
#   A1 minfer 7B -d 0 alone; C minfer 7B -d 0,3354 in one process (as the side step does); L llama-bench 7B
#   -d 0,3354; B minfer 7B -d 0 right after it; A2 minfer 7B -d 0 after a 30 s idle. Every minfer run with
#   MINFER_DEBUG_PATHS=1, -r 3, the file the side step makes (/tmp/side-qwen2.5-7b.gguf, the qwen2 vocab copied in).
# probe: tools/grid_barrier_probe.py (perf-log CD1).
# side8: the side by side owed since CC5 for the 0.5B and Llama-3.1-8B (REPS 2), on the build `why635` left.
# Other steps go to tools/device_s33.sh (card, card3, fix, ropediag, tile4; then s32 ... s4).
set -u
card_name() { nvidia-smi --query-gpu=name --format=csv,noheader | head -1; }
sample() {   # sample NAME CMD...: run CMD with the clocks sampled beside it into $OUT/clocks-NAME.csv
  local name=$1; shift
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu \
    --format=csv,noheader -lms 500 >"$OUT/clocks-$name.csv" 2>/dev/null &
  local smi=$!
  "$@"; local rc=$?
  kill $smi 2>/dev/null; wait $smi 2>/dev/null
  echo "$name: rc $rc; SM clock min/median/max $(awk -F', ' '{print $2+0}' "$OUT/clocks-$name.csv" | sort -n | \
    awk '{a[NR]=$1} END {if (NR) print a[1] "/" a[int((NR+1)/2)] "/" a[NR] " MHz over " NR " samples"}')"
  return $rc
}
for step in ${*:-why635}; do
  case $step in
    why635)
      echo "card: $(card_name)"
      source tools/device_setup.sh >/dev/null
      export MINFER_SETUP_DONE=1
      touch /tmp/q7.gguf      # device_s25.sh would synthesize its own 7B otherwise
      bash tools/device_s25.sh build
      M7=/tmp/side-qwen2.5-7b.gguf; V=/tmp/lc/llama.cpp/ggml-vocab-qwen2.gguf
      while [ ! -f /tmp/lc/started ]; do sleep 1; done
      [ -f $M7 ] || python3 -m minfer synth $M7 --preset qwen2.5-7b --recipe q4_k_m --tokenizer-from $V \
        --no-progress >/tmp/synth7.log 2>&1
      while [ ! -f /tmp/lc/done ]; do sleep 2; done
      cat /tmp/lc/done; cp /tmp/lc/build.log "$OUT/llama-build.log" 2>/dev/null
      LB=/tmp/lc/build/bin/llama-bench
      mb() { MINFER_DEBUG_PATHS=1 timeout 150 python3 -m minfer bench -m $M7 -p 0 -n 128 -d $1 -r 3 \
               --out "$OUT/bench-$2.json" --no-progress >"$OUT/bench-$2.log" 2>&1; }
      sleep 10
      sample A1 mb 0 A1
      sample C mb 0,3354 C
      sample L timeout 150 $LB -m $M7 -ngl 99 -fa 1 -p 0 -n 128 -d 0,3354 -r 2 >"$OUT/llama-7b.log" 2>&1
      sample B mb 0 B
      sleep 30
      sample A2 mb 0 A2
      echo "== 7B tg128 (t/s), in run order"
      for r in A1 C L B A2; do
        f="$OUT/bench-$r.log"; [ $r = L ] && f="$OUT/llama-7b.log"
        echo "$r: $(grep -E 'tg128' "$f" | sed 's/  */ /g' | tr '\n' ' ')"
      done
      grep -iE "fell back|fallback" "$OUT"/bench-*.log | head -3;;
    probe)   # perf-log CD1: a grid barrier inside one persistent kernel against a graphed launch boundary
      echo "card: $(card_name)"
      source tools/device_setup.sh >/dev/null
      export MINFER_SETUP_DONE=1
      timeout ${PROBE_TIMEOUT:-150} python3 tools/grid_barrier_probe.py ${PROBE_ARGS:-} >"$OUT/grid-barrier.log" 2>&1
      echo "probe rc $?"; cat "$OUT/grid-barrier.log" | tail -20;;
    side8)
      touch /tmp/q7.gguf
      SIDE_MODELS=${SIDE_MODELS:-"qwen2.5-0.5b llama3.1-8b"} REPS=${REPS:-2} bash tools/device_s30.sh build side;;
    *) bash tools/device_s33.sh $step;;
  esac
done
exit 0
