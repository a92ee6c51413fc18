#!/usr/bin/env bash
# rankwatch's verdicts on the GPU check's step records (scripts/gpu/device_time_check.py, run on
# a GPU machine): starts rankwatchd (its embedded broker, a temporary state directory, ports
# bound to 0 on 127.0.0.1), replays each job's records twice, device-timed and host-timed
# (`rankwatch replay --format records`), and prints `rankwatch diagnose` for each.
#
#   scripts/gpu/replay_device_check.sh OUT      (OUT: device_time_check.py's --out)
#
# Environment: RANKWATCH_BIN=DIR (build/bin).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: scripts/gpu/replay_device_check.sh OUT}
bin=${RANKWATCH_BIN:-build/bin}
[[ -x "$bin/rankwatchd" && -x "$bin/rankwatch" ]] || { echo "replay_device_check: no $bin/rankwatchd (scripts/build.sh)" >&2; exit 1; }

workdir=$(mktemp -d -t rankwatch-device-check-XXXXXX)
"$bin/rankwatchd" --state-dir "$workdir/state" --metrics-listen 127.0.0.1:0 --grpc-listen 127.0.0.1:0 \
  --ui-listen 127.0.0.1:0 2>"$workdir/rankwatchd.log" &
daemon=$!
trap 'kill -TERM $daemon 2>/dev/null || true; wait $daemon 2>/dev/null || true; rm -rf "$workdir"' EXIT
for _ in $(seq 1 150); do
  [[ -f "$workdir/state/endpoints.json" ]] && break
  kill -0 $daemon 2>/dev/null || { cat "$workdir/rankwatchd.log" >&2; exit 1; }
  sleep 0.1
done
endpoints=$(cat "$workdir/state/endpoints.json")
field() { sed -E "s/.*\"$1\": \"([^\"]*)\".*/\1/" <<<"$endpoints"; }
brokers=$(field brokers)
grpc=$(field grpc)
metrics=$(field metrics)

jobs=()
for dir in "$out"/*/; do
  job=$(basename "$dir")
  for clock in device host; do
    [[ -d "$dir/$clock" ]] || continue
    "$bin/rankwatch" replay --brokers "$brokers" --job "gpu-$job-$clock" --format records "$dir/$clock" \
      2>>"$workdir/replay.log" >/dev/null
    jobs+=("gpu-$job-$clock")
  done
done
((${#jobs[@]})) || { echo "replay_device_check: no <job>/device or <job>/host records under $out" >&2; exit 1; }

# Wait until each job's aligned steps stop growing (a replayed rank's last batch is final), then
# print the diagnoses.
aligned() { curl -sf "http://$metrics/metrics" | grep -E "^rankwatch_steps_aligned_total\{[^}]*training_job=\"$1\"" | awk '{print $2}' || true; }
for job in "${jobs[@]}"; do
  last=-1 same=0
  for _ in $(seq 1 300); do
    now=$(aligned "$job")
    if [[ -n "$now" && "$now" == "$last" ]]; then ((++same >= 10)) && break; else same=0; fi
    last=$now
    sleep 0.2
  done
done
for job in "${jobs[@]}"; do
  echo "===== $job"
  "$bin/rankwatch" diagnose --server "$grpc" --job "$job" || true
done
