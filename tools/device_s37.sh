#!/usr/bin/env bash
# Device calls of the 2026-12-07 thirty-seventh session:
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s37.sh [steps]; true", carry=[".whl"])
# stages: the shared-memory ring of the Gluon GEMV (a config's prefetch 3 / 4, gemv_q8g_stages.py) bit for bit against
#   the register prefetch (tests/gpu/test_gemv_q8_stages_gpu.py), and the Gluon GEMV's other GPU tests (the ring's
#   change moved _finish / _mixed_tile between modules).
# ring: tools/skip_oracle.py on the synthetic 7B at positions 100 / 3354 over RING_VARIANTS (the downs, gate+up and
#   the lm head on a 3- or 4-stage ring), then tools/sweep_pick.py's winners (>= PICK_MIN us saved at 3354, no loss
#   at 100) against the shipped table in `minfer bench -p 0 -n 128 -d 0,3354 --ab`, PAIRS pairs.
# final: the whole GPU suite (tools/device_s4.sh tests), the new fixtures' bf16 lines, a tg128 bench, and the ring
#   oracle on an H200.
# Other steps go to tools/device_s36.sh (newarch; then s35 ncu, s34 ... s4).
set -u
RING_VARIANTS=${RING_VARIANTS:-"base cfg:Q4_K+3584x18944=32,2,9,4,3,72,0,0,0,1,1 cfg:Q4_K+3584x18944=32,2,9,4,4,72,0,0,0,1,1 \
cfg:Q6_K+3584x18944=32,2,5,4,3,0,0,0,0,1,1 cfg:Q6_K+3584x18944=32,2,5,4,4,0,0,0,0,1,1 \
cfg:Q4_K+37888x3584=32,1,1,4,3,0,0,0,0,1,1 cfg:Q4_K+37888x3584=32,1,1,4,4,0,0,0,0,1,1 cfg:Q6_K+152064x3584=32,2,1,4,3"}
rest=""
for step in ${*:-stages ring}; do
  t0=$(date +%s)
  case $step in
    stages)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n 4"
      timeout ${STAGES_TIMEOUT:-300} python3 -m pytest -m gpu -q -p no:cacheprovider $xd \
        tests/gpu/test_gemv_q8_stages_gpu.py tests/gpu/test_gemv_q8_gpu.py tests/gpu/test_gemv_q8_tiles_gpu.py \
        tests/gpu/test_qkv_rope_gpu.py tests/gpu/test_gemv_q8_resnorm_gpu.py >"$OUT/pytest-stages.log" 2>&1
      echo "stages rc $?"; grep -E "^(FAILED|ERROR)|^E " "$OUT/pytest-stages.log" | head -20
      tail -1 "$OUT/pytest-stages.log";;
    ring)
      source tools/device_setup.sh >/dev/null
      [ -f /tmp/q7.gguf ] || python3 -m minfer synth /tmp/q7.gguf --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
      timeout ${ORACLE_TIMEOUT:-330} python3 tools/skip_oracle.py /tmp/q7.gguf 100 3354 -- $RING_VARIANTS \
        >"$OUT/ring-oracle.log" 2>&1
      echo "oracle rc $?"; grep -E "^\||^depth|left out|Error|error" "$OUT/ring-oracle.log" | grep -v "^|---" | head -40
      B=$(cd tools && python3 sweep_pick.py "$OUT/ring-oracle.log" --min ${PICK_MIN:-4} | tail -1)
      if [ -n "$B" ]; then
        echo "==== A/B: shipped table vs $B"; grep -o '"Q[46]_K [0-9x]*": \[[^]]*\]' ${B#*=} 2>/dev/null | head
        timeout ${AB_TIMEOUT:-200} python3 -m minfer bench -m /tmp/q7.gguf -p 0 -n 128 -d 0,3354 -r ${REPS:-2} \
          --ab "MINFER_GEMV_Q8G_TABLE" "$B" --pairs ${PAIRS:-4} --no-progress >"$OUT/ring-ab.log" 2>&1
        echo "ab rc $?"; grep -E "B/A|pair |tok/s" "$OUT/ring-ab.log" | tail -14
      fi;;
    final)
      # the whole GPU suite on the session's code, the new fixtures' bf16 ratios, one tg128 bench; the ring's oracle
      # again where the card is an H200 (CG1 ran on an H100)
      TESTS_TIMEOUT=${TESTS_TIMEOUT:-420} BENCH_RUNS=1 bash tools/device_s4.sh tests bench
      timeout 200 python3 -m pytest -m gpu -q -rP -p no:cacheprovider tests/gpu/test_arch_gpu.py \
        -k "chameleon or muse or hrm or kimi" >"$OUT/pytest-newarch.log" 2>&1
      echo "newarch rc $?"; grep -E "^bf16 |^(FAILED|ERROR)" "$OUT/pytest-newarch.log" | head -20
      tail -1 "$OUT/pytest-newarch.log"
      if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then bash tools/device_s37.sh ring; fi;;
    *) rest="$rest $step";;
  esac
  case $step in stages|ring|final) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
[ -n "$rest" ] && OUT=${OUT:-/tmp/minfer-out} bash tools/device_s36.sh $rest
exit 0
