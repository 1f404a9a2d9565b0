# Sourced by the device scripts: $OUT, the gguf wheel (the image lacks gguf; it travels in
# .whl, see the device tool's README Notes), minfer installed from the checkout, env.txt.
# At most 8 files come back from $OUT: the pip log stays in /tmp unless the install fails.
OUT=${OUT:-/tmp/minfer-out}
mkdir -p "$OUT"
# a script that already ran this (tools/device_s23.sh handing a step to device_s4.sh) skips the installs
[ -n "${MINFER_SETUP_DONE:-}" ] && return 0
# .head.tgz (untracked, made here by `git archive HEAD minfer tools tests/gpu ... | gzip`): the committed code
# over whatever a helper's uncommitted edits left in the copied working tree
if [ -f .head.tgz ]; then
  tar xzf .head.tgz
  for f in tests/gpu/*.py; do tar tzf .head.tgz | grep -qx "$f" || rm -f "$f"; done   # uncommitted test files
fi
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip-install.log 2>&1 \
  || { cp /tmp/pip-install.log "$OUT/"; echo "(pip install -e . failed, using PYTHONPATH; see pip-install.log)"; }
{
  date -u; echo "MINFER_COMMIT=${MINFER_COMMIT:-unset} (the device copy's git, possibly stale: $(git log -1 --format=%h 2>/dev/null))"
  nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv
  python3 -c 'import torch, triton, numpy; print("torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__, "cuda", torch.cuda.is_available())'
} 2>&1 | tee "$OUT/env.txt"
export MINFER_SETUP_DONE=1
