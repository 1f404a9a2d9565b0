#!/usr/bin/env bash
# The whole-model device run (H200): install, GPU tests, the synthetic 7B, bench + peer,
# launch paths and per-op profile, A/B of the prefill switches. From the repo root:
#   run(command="MINFER_COMMIT=<hash of HEAD here> bash tools/device_e2e.sh [STEPS]", carry=[".whl"])
# (the device copy has no .git: MINFER_COMMIT puts the commit into the bench records)
# STEPS (default: tests synth bench paths ab): any subset, in order (also: exp). AB_SPECS="A|B;A|B".
# Everything goes to $OUT; a summary is printed last.
set -u
STEPS=${*:-tests synth bench paths ab}
source tools/device_setup.sh
M="python3 -m minfer"
Q7=/tmp/q7.gguf
summary=""
for step in $STEPS; do
  t0=$(date +%s)
  case $step in
    tests)
      timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q --maxfail=8 -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/pytest-gpu.log" | tail -25
      summary="$summary\npytest -m gpu: $(tail -1 "$OUT/pytest-gpu.log")";;
    synth)
      [ -f $Q7 ] || $M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m 2>&1 | tail -2
      $M inspect $Q7 | tail -8;;
    paths)
      MINFER_DEBUG_PATHS=1 timeout 200 python3 -m minfer.bench.kernels --profile $Q7 --prompt 3354 --json "$OUT/profile-7b.json" 2>&1 | tee "$OUT/profile-7b.log" | grep -v "^ *$" | head -90;;
    bench)
      timeout 300 $M bench -m $Q7 -p 512,3354 -n 128 -r ${REPS:-3} --peer torch-bf16 --out "$OUT/bench-7b.json" --no-progress 2>&1 | tee "$OUT/bench-7b.log" | tail -20
      summary="$summary\n$(tail -20 "$OUT/bench-7b.log")";;
    ab)
      # each entry: "A|B" (comma-separated ENV=VALUE lists); default: issue 7's switches
      IFS=';' read -ra specs <<< "${AB_SPECS:-MINFER_PREFETCH=1|MINFER_PREFETCH=0;MINFER_FUSE_GROUPS=1,MINFER_PREFETCH=0|MINFER_FUSE_GROUPS=0,MINFER_PREFETCH=0;MINFER_FUSE_GROUPS=1,MINFER_PREFETCH=1|MINFER_FUSE_GROUPS=0,MINFER_PREFETCH=0}"
      i=0
      for spec in "${specs[@]}"; do
        i=$((i+1)); a="${spec%%|*}"; b="${spec#*|}"
        timeout 150 $M bench -m $Q7 -p 512,3354 -n 0 -r 2 --ab "$a" "$b" --pairs 4 --no-progress 2>&1 | tee "$OUT/ab-$i.log" | tail -12
        summary="$summary\nA/B $a | $b:\n$(tail -6 "$OUT/ab-$i.log")"
      done;;
    exp)
      # EXPS="exp_attn ...": device experiments (tools/<name>.py), each prints a table last
      for e in ${EXPS:-exp_attn}; do
        timeout 200 python3 tools/$e.py --json "$OUT/$e.json" 2>&1 | tee "$OUT/$e.log" | tail -30
        summary="$summary\n$(sed -n '/^====/,$p' "$OUT/$e.log")"
      done;;
    *) echo "unknown step $step";;
  esac
  echo "[step $step: $(( $(date +%s) - t0 )) s]"
done
echo -e "\n==== summary ====$summary"
