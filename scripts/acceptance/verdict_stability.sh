#!/bin/bash
# Issue #47, acceptance 2, in full: each case of tests/collectors/test_verdict_stability.py three
# times (a heavy stage 0, GC pauses on rank 2, a balanced pipeline job, a balanced DDP job), each
# while a second 4-process DDP job loads the cores. About 10 minutes on 2 cores; prints every
# verdict change.
# Needs a build (scripts/build.sh) and the test environment (scripts/venv.sh).
set -euo pipefail
cd "$(dirname "$0")/../../build"
RANKWATCH_STABILITY_RUNS="${RANKWATCH_STABILITY_RUNS:-3}" \
  ctest -R '^collectors_verdict_stability$' --output-on-failure -V
