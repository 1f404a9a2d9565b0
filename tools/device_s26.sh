#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-sixth session (perf-log AV):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s26.sh rule; true", carry=[".whl"])
# rule: the Gluon q8 GEMV's shape rule (ops/cuda/gemv_q8g_table.py shape_rule) -- its GPU tests and the GPU tests
#   of the kernels and fusions it routes more shapes to, while the 1.5B / Llama-3.1-8B / Qwen3-8B geometries
#   are synthesized (Q4_K_M) in the background; then per model an in-process A/B of MINFER_GEMV_Q8G_RULE 0 -> 1
#   (tg128, 4 interleaved pairs).
# rawnorm: the residual add + RMSNorm in the small models' raw group GEMVs (Switches.gemv_raw_norm): its GPU tests,
#   then the 0.5B's in-process A/B of MINFER_GEMV_RAW_NORM 0 -> 1, and of MINFER_DECODE_ATTN_ROPE 0 -> 1 with it on.
# glu: the GLU prologue of the Triton q8 down GEMV (Switches.gemv_glu_prologue): GPU tests, the 0.5B's A/B.
# cold: the first `minfer run` on an empty Triton cache, then twice warm (the compile's cost on a fresh machine).
# flip: the rule's decode errors (serial), then path-counting GPU tests with the rule on by default.
# gsync: tools/grid_sync_probe.py (a launch chain against one persistent kernel with grid barriers).
# Other steps go to tools/device_s25.sh (side, small, oracle, ...; side takes SIDE_MODELS).
set -u
STEPS=${*:-rule}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
RULE_MODELS=${RULE_MODELS:-qwen2.5-1.5b llama3.1-8b qwen3-8b}
M5=/tmp/ab-qwen2.5-0.5b.gguf     # (not side's file, which carries llama.cpp's vocab)
ab05() {   # NAME SWITCH PATTERN: the 0.5B's in-process A/B of SWITCH 0 -> 1 (tg128), the log's lines matching PATTERN
  [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --no-progress >/dev/null 2>&1
  MINFER_DEBUG_PATHS=1 timeout 200 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 --ab "$2=0" "$2=1" \
    --pairs ${PAIRS:-4} --out /tmp/$1-ab.json --no-progress >"$OUT/$1-ab.log" 2>&1
  grep -E "^\| [0-9]+ \| tg|^\| tg128" "$OUT/$1-ab.log"; grep -iE "$3|fell back|Traceback|Error" "$OUT/$1-ab.log" | head -5
  cp /tmp/$1-ab.json "$OUT/" 2>/dev/null
}
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    rule)
      ( for p in $RULE_MODELS; do
          s=$(date +%s)
          [ -f /tmp/rule-$p.gguf ] || python3 -m minfer synth /tmp/rule-$p.gguf --preset $p --recipe q4_k_m --no-progress \
            >>/tmp/synth-rule.log 2>&1
          echo "synth $p: $(( $(date +%s) - s )) s" >>/tmp/synth-times.txt
        done; touch /tmp/synth-rule.done ) &
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-6}"
      timeout ${RULE_TESTS_TIMEOUT:-300} python3 -m pytest -m gpu -q $xd -p no:cacheprovider ${PYTEST_ARGS:-} \
        ${RULE_TESTS:-tests/gpu/test_gemv_q8g_rule_gpu.py tests/gpu/test_gemv_q8_gpu.py tests/gpu/test_model_gpu.py \
        tests/gpu/test_qkv_rope_gpu.py tests/gpu/test_norm_into_gemv_gpu.py tests/gpu/test_gemv_q8_tiles_gpu.py \
        tests/gpu/test_cuda_graphs.py} >"$OUT/pytest-rule.log" 2>&1
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-rule.log" | head -30
      grep -E "^rule-err " "$OUT/pytest-rule.log" | head -24
      echo "rule tests: $(tail -1 "$OUT/pytest-rule.log") [$(( $(date +%s) - t0 )) s]"
      while [ ! -f /tmp/synth-rule.done ]; do sleep 2; done; cat /tmp/synth-times.txt
      for p in $RULE_MODELS; do
        s=$(date +%s)
        MINFER_DEBUG_PATHS=1 timeout ${AB_TIMEOUT:-150} python3 -m minfer bench -m /tmp/rule-$p.gguf -p 0 -n 128 -r 2 \
          --ab "MINFER_GEMV_Q8G_RULE=0" "MINFER_GEMV_Q8G_RULE=1" --pairs ${PAIRS:-4} --out /tmp/rule-ab-$p.json \
          --no-progress >"$OUT/rule-ab-$p.log" 2>&1
        echo "== $p: rc $? [$(( $(date +%s) - s )) s]"
        grep -E "^\| [0-9]+ \| tg|^\| tg128" "$OUT/rule-ab-$p.log"
        grep -iE "fell back|fallback|Traceback|Error" "$OUT/rule-ab-$p.log" | head -5
        cp /tmp/rule-ab-$p.json "$OUT/" 2>/dev/null
      done;;
    rawnorm)   # perf-log AV1: the norms in the small models' raw group GEMVs -- GPU tests, then the 0.5B A/B
      timeout ${RAWNORM_TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q -p no:cacheprovider \
        ${RAWNORM_TESTS:-tests/gpu/test_compile_watch_gpu.py tests/gpu/test_gemv_raw_group_gpu.py tests/gpu/test_model_gpu.py} \
        -k "${RAWNORM_K:-raw or norm or 0.5b or one_pass or compile}" \
        >"$OUT/pytest-rawnorm.log" 2>&1
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-rawnorm.log" | head -20
      echo "rawnorm tests: $(tail -1 "$OUT/pytest-rawnorm.log")"
      ab05 rawnorm MINFER_GEMV_RAW_NORM "raw_norm"
      if [ "${ATTNROPE:-1}" = 1 ]; then
        # the rope + KV append in the decode attention (Switches.decode_attn_rope; off: the 7B's q/k/v Gluon epilogue
        # takes the rope, which the raw groups have not) on top of the raw norms
        MINFER_GEMV_RAW_NORM=1 timeout 200 python3 -m minfer bench -m $M5 -p 0 -n 128 -r 2 --ab "MINFER_DECODE_ATTN_ROPE=0" \
          "MINFER_DECODE_ATTN_ROPE=1" --pairs ${PAIRS:-4} --no-progress >"$OUT/attnrope-ab.log" 2>&1
        grep -E "^\| [0-9]+ \| tg|^\| tg128" "$OUT/attnrope-ab.log"; grep -iE "Traceback|Error" "$OUT/attnrope-ab.log" | head -3
      fi;;
    glu)       # perf-log AW1: the GLU prologue in the Triton q8 down GEMV -- GPU tests, then the 0.5B A/B
      timeout ${GLU_TESTS_TIMEOUT:-150} python3 -m pytest -m gpu -q -p no:cacheprovider \
        tests/gpu/test_gemv_glu_prologue_gpu.py >"$OUT/pytest-glu.log" 2>&1
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-glu.log" | head -20
      echo "glu tests: $(tail -1 "$OUT/pytest-glu.log")"
      ab05 glu MINFER_GEMV_GLU_PROLOGUE "q8glu|into_gemv";;
    cold)      # first-run cost on a fresh machine: the Triton kernels' compile (empty TRITON_CACHE_DIR), then warm
      [ -f $M5 ] || python3 -m minfer synth $M5 --preset qwen2.5-0.5b --recipe q4_k_m --no-progress >/dev/null 2>&1
      TC=/tmp/triton-cold; rm -rf $TC
      for i in $(seq ${COLD_RUNS:-3}); do
        s=$(date +%s.%N)
        TRITON_CACHE_DIR=$TC timeout 400 python3 -m minfer run -m $M5 --raw "Once upon a time" -n 64 --temp 0 \
          >"$OUT/cold-$i.log" 2>&1
        echo "cold run $i: rc $? wall $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s"
        grep -E "^minfer: (loaded|compiling)|^prompt:" "$OUT/cold-$i.log" | cut -c1-320
      done
      echo "triton cache: $(find $TC -name '*.cubin' | wc -l) cubins";;
    flip)      # perf-log AW3: the rule's decode errors printed (serial: xdist's workers swallow -s), then the GPU tests
               # most likely to count kernel paths, with the rule on by default
      timeout ${FLIP_RULE_TIMEOUT:-120} python3 -m pytest -m gpu -q -s -p no:cacheprovider -p no:xdist \
        tests/gpu/test_gemv_q8g_rule_gpu.py -k models_decode >"$OUT/rule-serial.log" 2>&1
      echo "rule serial: rc $?"; grep -E "^rule-err |passed|failed" "$OUT/rule-serial.log" | tail -16
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-6}"
      timeout ${FLIP_TESTS_TIMEOUT:-170} python3 -m pytest -m gpu -q $xd -p no:cacheprovider ${FLIP_TESTS:-tests/gpu/test_model_gpu.py \
        tests/gpu/test_cuda_graphs.py tests/gpu/test_qkv_rope_gpu.py tests/gpu/test_norm_into_gemv_gpu.py} >"$OUT/flip.log" 2>&1
      echo "flip tests: rc $?"; grep -E "^(FAILED|ERROR)" "$OUT/flip.log" | head -20; tail -1 "$OUT/flip.log";;
    gsync)
      timeout ${GSYNC_TIMEOUT:-120} python3 tools/grid_sync_probe.py --json "$OUT/gsync.json" >"$OUT/gsync.log" 2>&1
      echo "gsync: rc $?"; tail -25 "$OUT/gsync.log";;
    *) OUT=$OUT bash tools/device_s25.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
