#!/usr/bin/env bash
# Device calls of the 2026-12-05 twenty-fifth session: perf-log AU0's oracle (tools/skip_oracle.py with
# --check: each variant replayed once after its capture, so a CUDA fault names its variant; the attention
# variants and the SwiGLU-2 switch in separate processes), then tools/device_s24.sh's steps (bench, tests ...).
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s25.sh oracle bench; true", carry=[".whl"])
set -u
if [ -f .head.tgz ]; then
  tar xzf .head.tgz
  for f in tests/gpu/*.py; do tar tzf .head.tgz | grep -qx "$f" || rm -f "$f"; done   # uncommitted test files
fi
STEPS=${*:-oracle}
source tools/device_setup.sh >/dev/null
export MINFER_SETUP_DONE=1
Q7=/tmp/q7.gguf
[ -f $Q7 ] || python3 -m minfer synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    oracle)
      i=0
      for group in ${ORACLE_GROUPS:-"-attn -combine short short&-attn" "env:MINFER_GEMV_SWIGLU=2"}; do
        i=$((i + 1))
        timeout ${ORACLE_TIMEOUT:-200} python3 tools/skip_oracle.py $Q7 ${ORACLE_DEPTHS:-100 3354} -- $group --check \
          >"$OUT/oracle-$i.log" 2>&1
        echo "oracle group $i ($group): rc $?"
        grep -E "^\||^depth|left out|^\(capturing|^\(replayed|Error" "$OUT/oracle-$i.log" | grep -v "^|---" | tail -20
      done;;
    *) OUT=$OUT bash tools/device_s24.sh $step;;
  esac
  echo "[$step: $(( $(date +%s) - t0 )) s]"
done
exit 0
