#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-third session: the GPU tests that failed on 2026-12-05's H100
# call, the bf16 diagnosis of three fixtures (tools/bf16_diag.py), then tools/device_s4.sh's steps.
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s23.sh ftests diag bench; cp /tmp/minfer-out/* $OUT/",
#       carry=[".whl"])
set -u
# (.head.tgz, the committed code over the copied working tree: tools/device_setup.sh)
STEPS=${*:-ftests diag}
source tools/device_setup.sh >/dev/null
Q7=/tmp/q7.gguf
case " $STEPS " in *" bench "*) [ -f $Q7 ] || (python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1 &);; esac
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    ftests)   # the failed tests of the last GPU run and the never-run kernels' tests, in parallel
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      timeout ${FTESTS_TIMEOUT:-240} python3 -m pytest -m gpu -q $xd -p no:cacheprovider ${PYTEST_ARGS:-} \
        tests/gpu/test_arch_gpu.py -k "${FTESTS_K:-(dots1 or lfm2moe or llama4 or qwen3vlmoe or ernie4_5 or hunyuan or qwen3next or gemma4 or nemotron or mamba2 or granitehybrid or qwen35 or falcon or deepseek or chunk or batching or ssm or deltanet) and not (among_31 or graphed_batch_decode or dense_planes or w4_gemm or held_steps)}" \
        tests/gpu/test_batching_gpu.py tests/gpu/test_ssm_step_gpu.py tests/gpu/test_deltanet_step_gpu.py \
        tests/gpu/test_chunked_attention_gpu.py >"$OUT/pytest-ftests.log" 2>&1
      grep -E "^(FAILED|ERROR)|^E  .*(Error|assert)" "$OUT/pytest-ftests.log" | head -30
      grep -E "^bf16 " "$OUT/pytest-ftests.log" | sort -t' ' -k10 | tail -12
      echo "ftests: $(tail -1 "$OUT/pytest-ftests.log")";;
    diag)
      timeout ${DIAG_TIMEOUT:-200} python3 tools/bf16_diag.py ${DIAG_NAMES:-hunyuan-moe qwen3next gemma4} \
        >"$OUT/bf16-diag.log" 2>&1
      grep -v Warning "$OUT/bf16-diag.log" | tail -30;;
    *) OUT=$OUT bash tools/device_s4.sh $step;;      # in the order given
  esac
  case $step in ftests|diag) echo "[$step: $(( $(date +%s) - t0 )) s]";; esac
done
exit 0
