#!/usr/bin/env bash
# rankwatch demo: installs what is missing, builds, then starts rankwatchd on its embedded
# Kafka broker and a simulated 32-rank data-parallel job in which rank 17 is 30% slower in
# compute. Prints the web UI, metrics and gRPC addresses and a status line every 5 s; Ctrl-C stops
# every process it started.
#
# --with-prometheus also starts Debian's Prometheus (/usr/bin/prometheus, its own temporary
# storage, a free port on 127.0.0.1) scraping the daemon every 2 s with deploy/prometheus's
# rules, and prints its URL.
#
# Environment: RANKWATCH_BIN=DIR uses already-built binaries from DIR (no install, no build);
# DEMO_RANKS (32), DEMO_STEP_MS (100), DEMO_METRICS (127.0.0.1:9466), DEMO_GRPC (127.0.0.1:7466),
# DEMO_UI (127.0.0.1:8466).
set -euo pipefail
cd "$(dirname "$0")/.."

WITH_PROMETHEUS=0
for arg in "$@"; do
  case "$arg" in
    --with-prometheus) WITH_PROMETHEUS=1 ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument '$arg' (usage: scripts/demo.sh [--with-prometheus])" >&2; exit 2 ;;
  esac
done

if [[ -z "${RANKWATCH_BIN:-}" ]]; then
  scripts/deps.sh
  scripts/build.sh
  RANKWATCH_BIN=build/bin
fi
RANKS=${DEMO_RANKS:-32}
STEP_MS=${DEMO_STEP_MS:-100}
METRICS=${DEMO_METRICS:-127.0.0.1:9466}
GRPC=${DEMO_GRPC:-127.0.0.1:7466}
UI=${DEMO_UI:-127.0.0.1:8466}

workdir=$(mktemp -d -t rankwatch-demo-XXXXXX)
pids=()
cleanup() {
  trap - INT TERM EXIT
  echo
  echo "demo: stopping ${pids[*]:-nothing}"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$workdir"
  echo "demo: stopped"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

"$RANKWATCH_BIN/rankwatchd" --state-dir "$workdir/state" --metrics-listen "$METRICS" \
  --grpc-listen "$GRPC" --ui-listen "$UI" 2>"$workdir/rankwatchd.log" &
pids+=($!)
for _ in $(seq 1 100); do
  [[ -f "$workdir/state/endpoints.json" ]] && break
  if ! kill -0 "${pids[0]}" 2>/dev/null; then
    echo "demo: rankwatchd failed to start:" >&2
    cat "$workdir/rankwatchd.log" >&2
    exit 1
  fi
  sleep 0.1
done
endpoints=$(cat "$workdir/state/endpoints.json")
field() { sed -E "s/.*\"$1\": \"([^\"]*)\".*/\1/" <<<"$endpoints"; }
metrics=$(field metrics)
grpc=$(field grpc)
ui=$(field ui)
brokers=$(field brokers)

"$RANKWATCH_BIN/rankwatch" simulate --brokers "$brokers" --job demo-job --ranks "$RANKS" \
  --steps 100000000 --step-ms "$STEP_MS" --speed realtime --sync ddp --report-collective \
  --fault slow-compute:17:0.3 2>"$workdir/simulate.log" >/dev/null &
pids+=($!)

processes="rankwatchd=${pids[0]} simulate=${pids[1]}"
prometheus_line=""
if ((WITH_PROMETHEUS)); then
  prom_port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$workdir/prometheus.yml" <<YML
global: {scrape_interval: 2s, evaluation_interval: 2s}
rule_files: ["$PWD/deploy/prometheus/rules/rankwatch-recording.yml", "$PWD/deploy/prometheus/rules/rankwatch-alerts.yml"]
scrape_configs:
  - job_name: rankwatch
    static_configs: [{targets: ["$metrics"]}]
YML
  /usr/bin/prometheus --config.file="$workdir/prometheus.yml" --storage.tsdb.path="$workdir/prometheus" \
    --web.listen-address="127.0.0.1:$prom_port" 2>"$workdir/prometheus.log" &
  pids+=($!)
  for _ in $(seq 1 100); do
    curl -sf --max-time 1 "http://127.0.0.1:$prom_port/-/ready" >/dev/null && break
    if ! kill -0 "${pids[2]}" 2>/dev/null; then
      echo "demo: prometheus failed to start:" >&2
      cat "$workdir/prometheus.log" >&2
      exit 1
    fi
    sleep 0.2
  done
  processes+=" prometheus=${pids[2]}"
  prometheus_line="  prometheus: http://127.0.0.1:$prom_port   (deploy/prometheus rules; try training_job:rankwatch_straggler_score:max)
"
fi

cat <<TXT
rankwatch demo is running (Ctrl-C stops it)
  web UI:   http://$ui/ui/   (the job: http://$ui/ui/jobs/demo-job)
  metrics:  http://$metrics/metrics
  gRPC:     $grpc   (rankwatch.v1.RankWatch, grpc.health.v1.Health, reflection)
  Kafka:    $brokers   (embedded broker, topic rankwatch.telemetry)
  job:      demo-job, $RANKS ranks, DDP, rank 17 is 30% slower in compute
${prometheus_line}  logs:     $workdir/rankwatchd.log, $workdir/simulate.log
  processes: $processes
try:  curl -s http://$metrics/metrics | grep -E 'rankwatch_(steps_aligned|step_diagnosis|straggler_score|step_phase_seconds)'
TXT

while true; do
  for pid in "${pids[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "demo: process $pid exited; see the logs above" >&2
      exit 1
    fi
  done
  text=$(curl -s --max-time 2 "http://$metrics/metrics" || true)
  aligned=$(grep -E '^rankwatch_steps_aligned_total\{training_job="demo-job"\}' <<<"$text" | awk '{print $2}' || true)
  diagnosis=$(grep -E '^rankwatch_step_diagnosis\{training_job="demo-job",diagnosis="[a-z_]+"\} 1$' <<<"$text" | sed -E 's/.*diagnosis="([a-z_]+)".*/\1/' || true)
  worst=$(grep -E '^rankwatch_step_worst_rank\{training_job="demo-job",phase="compute"\}' <<<"$text" | awk '{print $2}' || true)
  score=$(grep -E '^rankwatch_straggler_score\{training_job="demo-job",kind="compute"\}' <<<"$text" | awk '{printf "%.2f", $2}' || true)
  echo "demo: aligned steps ${aligned:-0}, diagnosis ${diagnosis:-none yet}, worst compute rank ${worst:-n/a} (score ${score:-n/a})"
  sleep 5 &
  wait $! || true
done
