#!/usr/bin/env bash
# The one script a device call runs (the H200 of the `device` tool), from the repo root:
#   run(command="bash tools/device_run.sh [STEPS]", carry=[".whl"])
# STEPS (default "tests bench"): tests = pytest -m gpu on tests/gpu; bench = kernel
# microbenchmarks (python -m minfer.bench.kernels); quick = bench at M=512 only;
# BENCH_ARGS="--sweep" adds tile sweeps; step `profile` = the per-op profile of the engine
# (python -m minfer.bench.kernels --profile: a 4-layer synthetic 7B).
# Logs and JSON go to $OUT (what comes back); a short table is printed last.
set -u
STEPS=${*:-tests bench}
source tools/device_setup.sh
summary=""
for step in $STEPS; do
  case $step in
    tests)
      t0=$(date +%s)
      timeout 240 python3 -m pytest -m gpu -q --maxfail=15 -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/pytest-gpu.log" | tail -40
      summary="$summary\npytest -m gpu: $(tail -1 "$OUT/pytest-gpu.log") ($(( $(date +%s) - t0 )) s)"
      ;;
    bench|quick)
      q=""; [ "$step" = quick ] && q="--quick"
      timeout ${BENCH_TIMEOUT:-220} python3 -m minfer.bench.kernels $q ${BENCH_ARGS:-} --json "$OUT/kernels.json" 2>&1 | tee "$OUT/bench.log" | tail -5
      summary="$summary\n$(sed -n '/==== kernel/,$p' "$OUT/bench.log")"
      ;;
    profile)
      MINFER_DEBUG_PATHS=1 timeout 200 python3 -m minfer.bench.kernels --profile --prompt 512 --json "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log" | grep -v "^ *$" | head -60
      ;;
    *) echo "unknown step $step" ;;
  esac
done
echo -e "\n==== summary ====$summary"
