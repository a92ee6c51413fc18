#!/usr/bin/env bash
# Installs what is missing (Debian packages), builds, and runs every test (unit and
# end-to-end) with ctest. Idempotent and non-interactive; CI runs it through .ci/run.
#
#   scripts/test.sh [CTEST ARGS]        build/ (BUILD_DIR), every test; arguments go to ctest
#   scripts/test.sh --sanitize=address,undefined [--e2e] [CTEST ARGS]
#                                       build-asan/: the unit tests (ctest -L unit) under
#                                       ASan+UBSan; --e2e: then the e2e tests too
#   scripts/test.sh --sanitize=thread [CTEST ARGS]
#                                       build-tsan/: the unit tests under TSan
#   scripts/test.sh --sanitize=all      the matrix: ASan+UBSan unit and e2e, then TSan unit
#   scripts/test.sh --sanitize=... --build-only
#                                       only the sanitizer build (.ci/run builds build-asan/ at
#                                       idle priority while build/'s tests run)
#
# A sanitizer run builds only what its tests need (scripts/ctest_targets.py; everything with
# --e2e). BUILD_LOCK=FILE: builds run under `flock FILE` (a machine shared by several builds).
# Findings fail the run: ASan/UBSan/TSan abort the process (halt_on_error); in the e2e run,
# where a daemon's exit status may go unchecked, every report is also written to
# build-asan/sanitizer-logs/ and any file there fails the run. docs/testing.md has the details.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

SANITIZE=""
E2E=0
BUILD_ONLY=0
ARGS=()
for a in "$@"; do
  case "$a" in
    --sanitize=*) SANITIZE=${a#--sanitize=} ;;
    --e2e) E2E=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    *) ARGS+=("$a") ;;
  esac
done

scripts/deps.sh
scripts/venv.sh >/dev/null  # .venv: the tests' Python with torch 2.13.0 (tests/requirements.txt)

# Runtime options of each sanitizer. LSan (detect_leaks=1) runs at the exit of each ASan process.
ASAN_RUNTIME="detect_leaks=1:halt_on_error=1:abort_on_error=0:print_summary=1"
UBSAN_RUNTIME="print_stacktrace=1:halt_on_error=1"
TSAN_RUNTIME="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/scripts/tsan.supp"

# configure_and_build DIR SANITIZERS LABEL|all
configure_and_build() {
  local dir=$1 sanitizers=$2 what=$3
  mkdir -p "$dir/.cmake/api/v1/query"
  touch "$dir/.cmake/api/v1/query/codemodel-v2"  # lets ctest_targets.py map tests to targets
  local lock=()
  [[ -n "${BUILD_LOCK:-}" ]] && lock=(flock "$BUILD_LOCK")
  "${lock[@]}" cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release \
    -DRANKWATCH_SANITIZE="$sanitizers" >/dev/null
  local targets=""
  if [[ "$what" != all ]]; then
    targets=$(python3 scripts/ctest_targets.py "$dir" "$what" | tr '\n' ' ')
  fi
  local start=$SECONDS
  BUILD_DIR=$dir CMAKE_ARGS="-DRANKWATCH_SANITIZE=$sanitizers" TARGETS="$targets" \
    "${lock[@]}" scripts/build.sh
  echo "== $dir ($sanitizers): built ${what} in $((SECONDS - start)) s"
}

# run_ctest DIR LABEL-ARGS...: runs ctest, printing how long it took.
run_ctest() {
  local dir=$1
  shift
  local start=$SECONDS rc=0
  (cd "$dir" && ctest --output-on-failure -j2 "$@") || rc=$?
  echo "== $dir: ctest $* took $((SECONDS - start)) s (exit $rc)"
  return $rc
}

if [[ -z "$SANITIZE" ]]; then
  [[ $E2E == 1 ]] && { echo "--e2e goes with --sanitize=address,undefined" >&2; exit 2; }
  start=$SECONDS
  scripts/build.sh
  echo "== ${BUILD_DIR:-build}: built in $((SECONDS - start)) s"
  [[ $BUILD_ONLY == 1 ]] && exit 0
  run_ctest "${BUILD_DIR:-build}" "${ARGS[@]}"
  exit
fi

asan() {
  local dir=build-asan
  configure_and_build "$dir" address,undefined "$([[ $E2E == 1 ]] && echo all || echo unit)"
  [[ $BUILD_ONLY == 1 ]] && return 0
  ASAN_OPTIONS=$ASAN_RUNTIME UBSAN_OPTIONS=$UBSAN_RUNTIME run_ctest "$dir" -L unit "${ARGS[@]}"
  [[ $E2E == 1 ]] || return 0
  # The e2e tests start rankwatchd, rankwatch and rankwatch-agent built with ASan+UBSan. The
  # collectors_* tests are left out: they load the Python extension (built with ASan too) into
  # /usr/bin/python3 and PyTorch, which would need libasan preloaded into the interpreter.
  local logs=$ROOT/$dir/sanitizer-logs
  rm -rf "$logs" && mkdir -p "$logs"
  local rc=0
  ASAN_OPTIONS="$ASAN_RUNTIME:log_path=$logs/asan" UBSAN_OPTIONS="$UBSAN_RUNTIME:log_path=$logs/ubsan" \
    run_ctest "$dir" -L e2e -E '^collectors_' "${ARGS[@]}" || rc=$?
  if compgen -G "$logs/*" >/dev/null; then
    echo "== sanitizer reports from the e2e processes:" >&2
    head -n 60 "$logs"/* >&2
    rc=1
  fi
  return $rc
}

tsan() {
  local dir=build-tsan
  configure_and_build "$dir" thread unit
  [[ $BUILD_ONLY == 1 ]] && return 0
  TSAN_OPTIONS=$TSAN_RUNTIME run_ctest "$dir" -L unit "${ARGS[@]}"
}

case "$SANITIZE" in
  address,undefined | undefined,address | address) asan ;;
  thread)
    [[ $E2E == 1 ]] && { echo "--e2e runs under ASan only" >&2; exit 2; }
    tsan ;;
  all)
    E2E=1
    rc=0
    asan || rc=$?
    tsan || rc=$?
    exit $rc ;;
  *)
    echo "unknown --sanitize=$SANITIZE (address,undefined | thread | all)" >&2
    exit 2 ;;
esac
