#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds, and runs every test (unit and
# end-to-end) with ctest. Idempotent and non-interactive; CI runs it through .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh
cd "${BUILD_DIR:-build}"
ctest --output-on-failure -j2 "$@"
