#!/usr/bin/env bash
# Configures and builds rankwatch into build/ (Release: -O2, no debug info; 2 jobs, ccache when present).
# Incremental: a second run only rebuilds what changed.
#   BUILD_DIR        build folder (build)
#   JOBS             parallel compile jobs (2)
#   CMAKE_BUILD_TYPE (Release; RelWithDebInfo adds debug info)
#   CMAKE_ARGS       extra cmake arguments, e.g. "-DRANKWATCH_SANITIZE=thread"
#   TARGETS          build only these targets (space-separated); empty = everything
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
# shellcheck disable=SC2086  # CMAKE_ARGS and TARGETS are word lists
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
if [[ -n "${TARGETS:-}" ]]; then
  # shellcheck disable=SC2086
  cmake --build "$BUILD_DIR" -j"$JOBS" --target ${TARGETS}
else
  cmake --build "$BUILD_DIR" -j"$JOBS"
fi
