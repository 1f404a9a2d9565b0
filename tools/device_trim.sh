#!/usr/bin/env bash
# Before a device call: the working tree travels to the GPU machine under 64 MiB (tracked and untracked-not-ignored
# files, measured about as a tar), and with the architecture fixtures it no longer fits. What no device script reads
# -- the bench records' raw logs and images, the performance log -- is removed from the working tree here; after
# the call, `bash tools/device_trim.sh restore` (git checkout) puts them back. Run it only while no one else edits
# the tree (a helper's uncommitted file under bench/ or docs/perf-log.md would be lost).
#   bash tools/device_trim.sh          # trim, then print the size that will travel
#   bash tools/device_trim.sh restore
set -eu
cd "$(git rev-parse --show-toplevel)"
TRIM="bench/results/raw bench/results/*.png docs/perf-log.md"
if [ "${1:-}" = restore ]; then
  git checkout -- bench docs/perf-log.md && echo "restored"
  exit 0
fi
if [ -n "$(git status --porcelain -- bench docs/perf-log.md)" ]; then
  echo "bench/ or docs/perf-log.md has uncommitted changes: commit them first" >&2
  exit 1
fi
# shellcheck disable=SC2086
rm -rf $TRIM
size=$( { git ls-files -z; git ls-files -z -o --exclude-standard; } | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"; done | tar --null -cf - -T - $( [ -d .whl ] && echo .whl ) | wc -c)
echo "trimmed; the tree that travels: $(( size / 1048576 )) MiB of 64 (restore: bash tools/device_trim.sh restore)"
