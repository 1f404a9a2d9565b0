#!/usr/bin/env bash
# Device calls of the 2026-12-03 tenth session (issue 12): the steps of tools/device_s10.sh (sol,
# routes) -> s9 (sweepab) -> s8 (timeline ...) -> ... -> s4 (tests bench), under this session's name.
#   run(command="cd .clean && bash tools/device_s11.sh sol sweepab", carry=[".whl", ".clean"])
exec bash tools/device_s10.sh "${@:-sol}"
