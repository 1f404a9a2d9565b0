#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-fourth session: the GPU tests of what changed since 5af4935's run
# (tests/gpu/test_ssm1_step_gpu.py, the deepseek2/3 batched test in float32, the new architectures' and the
# Mamba-1 fixtures' test_arch_gpu entries, gemma4 under the 2.5x bar), then tools/device_s23.sh's steps.
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s24.sh new [bench ...]; true", carry=[".whl"])
set -u
STEPS=${*:-new}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    new)
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${NEW_TIMEOUT:-300} python3 -m pytest -m gpu -q $xd -p no:cacheprovider -rP \
        tests/gpu/test_ssm1_step_gpu.py tests/gpu/test_batching_gpu.py tests/gpu/test_arch_gpu.py \
        -k "${NEW_K:-ssm1 or deepseek2_fixture or gemma4 or mamba or jamba or minicpm3 or afmoe or jais2}" \
        >"$OUT/pytest-new.log" 2>&1
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-new.log" | head -30
      grep -E "^bf16 |float32: alone" "$OUT/pytest-new.log" | head -30
      echo "new: $(tail -1 "$OUT/pytest-new.log")";;
    paths)   # which attention paths and fallbacks a fixture's GPU run takes (minicpm3: no MLA decode kernel)
      timeout ${PATHS_TIMEOUT:-150} python3 tools/diag_paths.py ${PATHS_NAMES:-minicpm3 deepseek2} --ctx ${PATHS_CTX:-64} \
        >"$OUT/diag-paths.log" 2>&1
      grep -v Warning "$OUT/diag-paths.log" | tail -30;;
    oracle)  # perf-log AQ0's oracle: the graphed 7B step's GPU time with the attention / combine launches left
             # out and with the SwiGLU-2 variant (tools/skip_oracle.py); no A/B (PICK_MIN past any gain)
      SWEEP_VARIANTS=${SWEEP_VARIANTS:-"-attn -combine env:MINFER_GEMV_SWIGLU=2"} PICK_MIN=${PICK_MIN:-100000} \
        ORACLE_TIMEOUT=${ORACLE_TIMEOUT:-240} OUT=$OUT bash tools/device_s9.sh sweepab;;
    *) OUT=$OUT bash tools/device_s23.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
