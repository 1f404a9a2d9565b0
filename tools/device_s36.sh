#!/usr/bin/env bash
# Device calls of the 2026-12-07 thirty-sixth session:
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s36.sh [steps]; true", carry=[".whl"])
# newarch: the fixtures this session added (bitnet, bitnet-silu: the bitnet arch with TQ-free f16 weights;
#   glm4moe-lite: GLM-4.7-Flash as deepseek2; solar-open: Solar Open as glm4moe; kimi-linear) through tests/gpu/test_arch_gpu.py
#   (float32 against transformers, bf16 against the CPU, their MUST_RUN paths), and the TQ1_0 / TQ2_0 kernel-decoder
#   cases of tests/gpu/test_kernels_gpu.py (dequantize, linear at m 1-333, against gguf.quants).
# Other steps go to tools/device_s35.sh (ncu; then s34 ... s4).
set -u
for step in ${*:-newarch}; do
  case $step in
    newarch)
      echo "card: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
      source tools/device_setup.sh >/dev/null
      export MINFER_SETUP_DONE=1
      timeout ${NEWARCH_TIMEOUT:-200} python3 -m pytest -m gpu -q -rP -p no:cacheprovider tests/gpu/test_arch_gpu.py \
        -k "bitnet or glm4moe-lite or solar-open or kimi" >"$OUT/pytest-newarch.log" 2>&1
      echo "newarch rc $?"; grep -E "^bf16 |^(FAILED|ERROR)|^E " "$OUT/pytest-newarch.log" | head -20
      tail -1 "$OUT/pytest-newarch.log"
      timeout ${TQ_TIMEOUT:-120} python3 -m pytest -m gpu -q -p no:cacheprovider tests/gpu/test_kernels_gpu.py \
        -k "TQ1_0 or TQ2_0" >"$OUT/pytest-tq.log" 2>&1
      echo "tq rc $?"; grep -E "^(FAILED|ERROR)|^E " "$OUT/pytest-tq.log" | head -10; tail -1 "$OUT/pytest-tq.log";;
    *) bash tools/device_s35.sh $step;;
  esac
done
exit 0
