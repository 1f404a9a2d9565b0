#!/usr/bin/env bash
# Device calls of the 2026-12-01 (second) session (issues 12, 13).
#   treeab: tg128 and tg128 @ d3354 from .old/ (a `git archive` of an earlier commit, carried) and
#           from this tree, in separate processes, old/new alternated TREEAB_PAIRS times
#   ab:     `minfer bench --ab` in one process for each "A|B|bench args" in AB (';'-separated)
#   gen:    tools/gen_speed.py (generate() greedy / sampled beside the forward loop)
#   then the steps of tools/device_s4.sh (tests bench dprof prof parallel pab serve sab)
set -u
STEPS=${*:-tests treeab}
source tools/device_setup.sh >/dev/null
M="python3 -m minfer"
Q7=/tmp/q7.gguf
[ -f $Q7 ] || ($M synth $Q7 --preset qwen2.5-7b --recipe q4_k_m >/tmp/synth.log 2>&1 &)
waitq7() { sleep 1; while [ ! -f $Q7 ] || pgrep -f "^python3? -m minfer synth" >/dev/null; do sleep 2; done; }
rest=""; summary=""
for step in $STEPS; do
  case $step in
    treeab)
      waitq7
      for i in $(seq ${TREEAB_PAIRS:-2}); do
        for side in old new; do
          # `python3 -m` puts the working directory first on sys.path, ahead of PYTHONPATH: the old
          # side must run from inside .old (until 2026-12-01 it ran from here, so both sides ran
          # this tree: every treeab before then was an A/A)
          if [ $side = old ]; then dir=$PWD/.old; else dir=$PWD; fi
          (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout 120 python3 -c "import minfer, sys; print('minfer from', minfer.__file__)" \
            && PYTHONPATH=/tmp/site:$dir timeout 120 python3 -m minfer bench -m $Q7 -p 0 -n 128 -d 0,3354 -r 3 --no-progress) \
            >"/tmp/treeab-$side-$i.log" 2>&1
          summary="$summary\n$side $i: $(grep '^|' /tmp/treeab-$side-$i.log | tail -2 | awk -F'|' '{printf "%s %s;", $6, $7}')"
        done
      done
      cat /tmp/treeab-*.log > "$OUT/treeab.log";;
    ab)
      waitq7
      IFS=';' read -ra items <<< "${AB:-MINFER_PINNED_IO=1|MINFER_PINNED_IO=0|-p 0 -n 128}"
      k=0
      for it in "${items[@]}"; do
        k=$((k+1)); IFS='|' read -r a b args <<< "$it"
        timeout ${AB_TIMEOUT:-120} $M bench -m $Q7 $args -r ${REPS:-3} --ab "$a" "$b" --pairs ${PAIRS:-4} --no-progress \
          >"/tmp/ab-$k.log" 2>&1
        summary="$summary\nA: $a  B: $b  ($args)\n$(grep -E '^\||B/A|ratio' /tmp/ab-$k.log | tail -6)"
      done
      cat /tmp/ab-*.log > "$OUT/ab.log";;
    gen)
      waitq7
      timeout ${GEN_TIMEOUT:-120} python3 tools/gen_speed.py $Q7 >"$OUT/gen.log" 2>&1
      summary="$summary\n$(tail -4 $OUT/gen.log)";;
    *) rest="$rest $step";;
  esac
done
[ -n "$rest" ] && bash tools/device_s4.sh $rest
echo -e "\n==== s6 summary ====$summary"
exit 0
