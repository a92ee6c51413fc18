#!/usr/bin/env bash
# Fuzzing campaign (issue #16; not CI): builds the libFuzzer targets with clang, ASan and UBSan
# into build-fuzz/, runs each target for N minutes, one after the other, from a scratch copy of
# its seeds, and prints per target the executions per second, the total executions, the
# coverage (libFuzzer's `cov:` edges and `ft:` features), the corpus size and the crashes found
# (their artifact paths). The same table goes to build-fuzz/fuzz-summary.md. docs/fuzzing.md.
#
#   scripts/fuzz.sh [--minutes N] [--jobs J] [--nice K] [target...]
#
#   --minutes N  minutes per target (default 10)
#   --jobs J     parallel build jobs (default 2); the targets themselves run one at a time
#   --nice K     run the fuzzers under `nice -n K` (default 10)
#   target       batch kineto msprof ascend_csv csv_table daemon_config job_state changelog
#                flight_recorder (default: all)
#
# A crash leaves its input in build-fuzz/fuzz-artifacts/<target>/; once fixed, copy it to
# fuzz/regression/<target>/ so that ctest (fuzz_replay_<target>) replays it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD="$ROOT/build-fuzz"
ALL=(batch kineto msprof ascend_csv csv_table daemon_config job_state changelog flight_recorder)
MINUTES=10
JOBS=2
NICE=10
TARGETS=()

while (($#)); do
  case "$1" in
    --minutes) MINUTES=$2; shift 2 ;;
    --minutes=*) MINUTES=${1#*=}; shift ;;
    --jobs) JOBS=$2; shift 2 ;;
    --jobs=*) JOBS=${1#*=}; shift ;;
    --nice) NICE=$2; shift 2 ;;
    --nice=*) NICE=${1#*=}; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) TARGETS+=("$1"); shift ;;
  esac
done
((${#TARGETS[@]})) || TARGETS=("${ALL[@]}")
for t in "${TARGETS[@]}"; do
  [[ " ${ALL[*]} " == *" $t "* ]] || { echo "fuzz.sh: unknown target $t (${ALL[*]})" >&2; exit 2; }
done

# Inputs larger than this are not tried (libFuzzer -max_len), per target: the seeds' sizes
# with room to grow; the state and telemetry inputs are small.
max_len() {
  case "$1" in
    batch) echo 16384 ;;
    kineto) echo 65536 ;;
    msprof) echo 32768 ;;
    ascend_csv|csv_table) echo 65536 ;;
    daemon_config) echo 8192 ;;
    job_state|changelog) echo 16384 ;;
    flight_recorder) echo 32768 ;;
  esac
}

# clang (Debian's clang 14 has libFuzzer), installed the way scripts/deps.sh installs packages.
if ! command -v clang++ >/dev/null || ! command -v clang >/dev/null; then
  echo "fuzz.sh: installing clang" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends clang
fi
"$ROOT/scripts/deps.sh"

LOCK=(flock /tmp/rw-build.lock)
command -v flock >/dev/null || LOCK=()
if [[ ! -f "$BUILD/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD" -DRANKWATCH_FUZZ=ON \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
fi
"${LOCK[@]}" cmake --build "$BUILD" -j"$JOBS" --target "${TARGETS[@]/#/fuzz_}"

SUMMARY="$BUILD/fuzz-summary.md"
ROWS=()
FAILED=0
for t in "${TARGETS[@]}"; do
  corpus="$BUILD/fuzz-corpus/$t"
  artifacts="$BUILD/fuzz-artifacts/$t"
  log="$BUILD/fuzz-logs/$t.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  cp -n "$ROOT/fuzz/seeds/$t/"* "$corpus/" 2>/dev/null || true
  regression=()
  [[ -d "$ROOT/fuzz/regression/$t" ]] && regression=("$ROOT/fuzz/regression/$t")
  stamp="$BUILD/fuzz-logs/$t.start"
  touch "$stamp"
  seconds=$((MINUTES * 60))
  echo "fuzz.sh: $t for $MINUTES min (log: $log)" >&2
  set +e
  # -fork is not used: one process, so that `stat::` totals cover the whole run. Crashes stop
  # the run (the input is kept); the next target still runs.
  nice -n "$NICE" "$BUILD/fuzz/fuzz_$t" "$corpus" "${regression[@]}" \
    -max_total_time="$seconds" -print_final_stats=1 -max_len="$(max_len "$t")" \
    -rss_limit_mb=4096 -malloc_limit_mb=2048 -timeout=20 -len_control=100 \
    -artifact_prefix="$artifacts/" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  per_s=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # The last status line (#N ... cov: C ft: F corp: K/size ...).
  status=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -1)
  cov=$(sed -n 's/.*cov: \([0-9]*\).*/\1/p' <<<"$status")
  ft=$(sed -n 's/.*ft: \([0-9]*\).*/\1/p' <<<"$status")
  corp=$(sed -n 's/.*corp: \([0-9]*\/[0-9a-zA-Z]*\).*/\1/p' <<<"$status")
  crashes=$(find "$artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) -newer "$stamp" 2>/dev/null | sort | tr '\n' ' ')
  if [[ $rc -ne 0 || -n "$crashes" ]]; then
    FAILED=1
    result="rc=$rc ${crashes:-(no artifact)}"
  else
    result="none"
  fi
  ROWS+=("| $t | $MINUTES | ${per_s:-?} | ${execs:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $result |")
  printf '%-14s %6s execs/s %12s execs  cov %6s  ft %7s  corpus %-12s crashes: %s\n' \
    "$t" "${per_s:-?}" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done

{
  echo "| target | minutes | execs/s | execs | cov | ft | corpus (inputs/bytes) | crashes |"
  echo "|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${ROWS[@]}"
} >"$SUMMARY"
echo "fuzz.sh: summary in $SUMMARY" >&2
exit "$FAILED"
