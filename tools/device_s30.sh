#!/usr/bin/env bash
# Device calls of the 2026-12-06 thirtieth session (perf-log AZ7):
#   run(command="MINFER_COMMIT=<sha> bash tools/device_s30.sh q8rn; true", carry=[".whl"])
# q8rn (in tools/device_s29.sh): the Triton q8 down's residual norm tail (Switches.gemv_q8_resnorm) -- its GPU tests,
#   the raw GEMV's (the shared resnorm_tail.py) and the GLU prologue's, then the 0.5B geometry's in-process A/B
#   MINFER_GEMV_Q8_RESNORM 0 -> 1 (tg128, PAIRS interleaved pairs, -r 2), nothing else running.
exec bash tools/device_s29.sh "${@:-q8rn}"
