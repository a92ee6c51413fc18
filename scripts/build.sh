#!/usr/bin/env bash
# Configures and builds rankwatch into build/ (RelWithDebInfo, 2 jobs, ccache when present).
# Incremental: a second run only rebuilds what changed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-2}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-RelWithDebInfo} >/dev/null
cmake --build "$BUILD_DIR" -j"$JOBS"
