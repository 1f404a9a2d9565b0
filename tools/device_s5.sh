#!/usr/bin/env bash
# Device calls of the 2026-12-01 session (issues 12, 13).
#   w4:    tools/w4_bench.py (qgemm_w4 against cuBLAS per 7B shape; W4_M, W4_CONFIGS, W4_SHAPES)
#   head:  pytest -m gpu on .head/ (a `git archive HEAD` copy carried along: the committed tree,
#          not helpers' half-done edits)
#   then the steps of tools/device_s4.sh (tests bench prof parallel pab serve sab diag)
set -u
STEPS=${*:-w4 head}
source tools/device_setup.sh >/dev/null
rest=""
for step in $STEPS; do
  case $step in
    w4)
      timeout ${W4_TIMEOUT:-330} python3 tools/w4_bench.py --m ${W4_M:-16,32,128} --configs "${W4_CONFIGS:-}" \
        --shapes "${W4_SHAPES:-}" --json "$OUT/w4.json" >"$OUT/w4.log" 2>&1
      tail -${W4_TAIL:-80} "$OUT/w4.log";;
    head)
      xd=""; python3 -c "import xdist" 2>/dev/null && xd="-n ${XDIST:-8}"
      (cd .head && PYTHONPATH=/tmp/site:$PWD timeout ${TESTS_TIMEOUT:-200} python3 -m pytest -m gpu -q $xd \
        -p no:cacheprovider ${TESTS:-tests/gpu} >"$OUT/pytest-head.log" 2>&1)
      grep -E "^(FAILED|ERROR)" "$OUT/pytest-head.log" | head -20
      grep -E "^E " "$OUT/pytest-head.log" | head -20
      echo "pytest -m gpu (HEAD copy): $(tail -1 "$OUT/pytest-head.log")";;
    *) rest="$rest $step";;
  esac
done
[ -n "$rest" ] && bash tools/device_s4.sh $rest
exit 0
