#!/usr/bin/python3
"""Soak (issue #16): rankwatch under steady load for an hour, with crashes and a broker restart.

Real processes on this machine over loopback TCP:
  * `rankwatch kafka --partitions 256`, the development broker (librdkafka's mock cluster);
  * JOBS simulated jobs (8 to 64 ranks, `--speed max --rate` paced so that the fleet offers RATE
    step records/s in total; the nominal step is chosen so that record time keeps pace with wall
    time); one job in ten has a permanent compute straggler, one in ten an input straggler, one in
    ten a compute straggler that comes and goes every minute (alert traffic), one in twenty a
    memory leak; the rest are balanced. Jobs of one shape (ranks, faults) share one
    `rankwatch simulate --jobs N` process: ~20 producers for 200 jobs;
  * KERNEL_LOOPS loops of `rankwatch replay --format kineto` over the Kineto fixtures
    (tests/fixtures/kineto), one replay every KERNEL_PERIOD s per loop, each under a new job id
    (kernel results are analysed per job and a replay of the same id would be late); the daemons
    run with --job-ttl/--job-retention of KERNEL_TTL so those jobs are retired and the number of
    jobs in memory reaches a steady state;
  * two `rankwatchd` in separate consumer groups reading the same topic: the reference, never
    interrupted, and the subject, SIGKILLed KILLS times at spread moments and restarted on its
    state directory;
  * one simulated broker restart (SIGUSR1 to `rankwatch kafka`: every broker down for
    DOWN_SECONDS, connections closed and refused, then up; the mock cluster lives in memory, so
    a real restart of its process would lose the log: down/up is the closest there is);
  * a WatchAlerts subscriber (python3-grpcio) on the reference.

Every minute one line: records/s consumed (reference), RSS of both daemons (/proc), checkpoint
write and pause p50/p99 (sampled every second from rankwatch_checkpoint_seconds and
rankwatch_checkpoint_pause_seconds when rankwatch_checkpoints_total moved: the gauges hold the last
checkpoint's figures, so the percentiles are over the checkpoints sampled, "n of m" says how many),
alert latency p50/p99 (Alert.triggered_unix_ns to arrival at the subscriber), messages lost to
retention (rankwatch_input_lost_messages_total, both daemons, every subject process), restarts.

At the end, after both daemons aligned every step: RSS growth after warm-up (minute WARMUP vs the
last minute of load, both daemons), exactly-once (rankwatch_steps_aligned_total and
Diagnosis.aligned_steps equal to the simulated steps for every job in both daemons, no step timed
out), diagnoses equal (step label, culprit ranks, cause, culprit phase, severity, memory label; and
how many are equal as a whole, the evaluation time and hang evidence aside), a JSON summary.
With --trim-probe (default when gdb is installed), malloc_trim(0) is then called in both daemons
and their RSS after it reported: what the daemon holds against free memory glibc's malloc kept.
Exit code 1 when a target fails: consumed rate >= RATE, RSS growth < 5 % (both), exactly once,
diagnoses equal, no message lost, every kill and restart done.

  benchmarks/soak.py [--minutes 60] [--jobs 200] [--rate 200000] [--kills 5] [--broker-restart]
                     [--partitions 256] [--compression zstd] [--warmup-minutes 5] [--json-out F] [--bin build/bin]

Long CPU-heavy run: start it with `nice -n 10` on a shared machine.
"""
import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
sys.path.insert(0, os.path.join(ROOT, "build", "gen_py"))

import harness  # noqa: E402

RANK_CYCLE = [8, 16, 8, 32, 8, 16, 64, 8, 16, 24]  # 20 ranks a job on average
KINETO = os.path.join(ROOT, "tests", "fixtures", "kineto")
FIXTURES = ["hta-trace-filter-2rank", "hta-nccl-ddp-rank0", "hta-negative-queue-rank0"]
# The samples the soak reads; the rest of /metrics is skipped before parsing.
WANTED = ("rankwatch_events_total", "rankwatch_checkpoint", "rankwatch_input_lost_messages_total",
          "rankwatch_ingest_lag_seconds", "rankwatch_events_rejected_total", "rankwatch_jobs ",
          "rankwatch_state_healthy", "rankwatch_kafka_assigned_partitions", "rankwatch_heap_bytes",
          "rankwatch_state_memory_bytes")
FINAL = WANTED + ("rankwatch_steps_aligned_total", "rankwatch_steps_timed_out_total")


def log(msg):
    print(msg, flush=True)


def quantile(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def fmt_ms(v):
    return "-" if v is None else "%.1f" % (v * 1e3)


def memory_breakdown(samples, pid=None):
    """MiB by the daemon's gauges: jemalloc's allocated, active, metadata and resident bytes
    (builds with jemalloc), RocksDB's memtables, table readers and block cache; {} without a scrape. With a pid, also the
    kernel's split of its RSS: anonymous pages (the heap, stacks) and file pages (the binary's
    and the libraries' code as it is touched)."""
    if not samples:
        return {}
    out = {}
    if pid is not None:
        try:
            with open("/proc/%d/status" % pid) as f:
                for line in f:
                    for field, key in (("RssAnon:", "rss_anon"), ("RssFile:", "rss_file")):
                        if line.startswith(field):
                            out[key] = round(int(line.split()[1]) / 1024.0, 1)
        except OSError:
            pass
    for name, label, key in (("rankwatch_heap_bytes", "allocated", "heap_allocated"),
                             ("rankwatch_heap_bytes", "active", "heap_active"),
                             ("rankwatch_heap_bytes", "metadata", "heap_metadata"),
                             ("rankwatch_heap_bytes", "resident", "heap_resident"),
                             ("rankwatch_state_memory_bytes", "memtables", "memtables"),
                             ("rankwatch_state_memory_bytes", "table_readers", "table_readers"),
                             ("rankwatch_state_memory_bytes", "block_cache", "block_cache")):
        v = harness.metric(samples, name, kind=label)
        if v is not None:
            out[key] = round(v / 2**20, 1)
    return out


def rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def scrape(daemon, prefixes=WANTED):
    """The samples of `daemon` whose names start with one of `prefixes`, parsed, and a last
    sample ("series", {}, N): how many series /metrics holds."""
    with urllib.request.urlopen("http://%s/metrics" % daemon.endpoints["metrics"], timeout=10) as r:
        lines = r.read().decode().splitlines()
    samples = harness.parse_metrics("\n".join(line for line in lines if line.startswith(prefixes)))
    samples.append(("series", {}, float(sum(1 for line in lines if line and not line.startswith("#")))))
    return samples


def total(samples, name, **labels):
    return sum(v for n, l, v in samples if n == name and all(l.get(k) == w for k, w in labels.items()))


class Job:
    def __init__(self, name, ranks, steps):
        self.name, self.ranks, self.steps = name, ranks, steps


class Producer:
    """One `rankwatch simulate --jobs N` process: N jobs of one shape (ranks, faults)."""

    def __init__(self, prefix, count, ranks, steps, step_ms, rate, faults, seed):
        self.prefix, self.count, self.ranks, self.steps, self.step_ms, self.rate, self.faults, self.seed = (
            prefix, count, ranks, steps, step_ms, rate, faults, seed)
        width = max(3, len(str(count - 1)))
        names = [prefix] if count == 1 else ["%s-%0*d" % (prefix, width, i) for i in range(count)]
        self.jobs = [Job(n, ranks, steps) for n in names]
        self.proc = None
        self.result = None


def plan_jobs(args, load_seconds):
    """The jobs, grouped into producers of one shape each.

    Job i has RANK_CYCLE[i] ranks and a fault class: one in ten a permanent compute straggler,
    one in ten an input straggler, one in ten a compute straggler a third of every minute, one in
    twenty a memory leak (the rest balanced). Jobs of the same ranks and class share a producer
    process (`rankwatch simulate --jobs`), its faults on the same ranks: ~20 processes for 200 jobs
    instead of 200, whose librdkafka threads alone would saturate a 2-core machine.
    """
    ranks = [RANK_CYCLE[i % len(RANK_CYCLE)] for i in range(args.jobs)]
    total_ranks = sum(ranks)
    steps_per_s = args.rate / total_ranks           # every rank steps at this pace
    step_ms = 1000.0 / steps_per_s                  # record time keeps pace with wall time
    steps = max(1, int(steps_per_s * load_seconds))
    period = max(40, int(60 * steps_per_s))         # intermittent fault: a minute's steps
    classes = {}
    for i, r in enumerate(ranks):
        c = i + i // len(RANK_CYCLE)  # shifted each cycle, so that every size meets every fault
        if c % 10 == 3:
            kind = "slow"
        elif c % 10 == 7:
            kind = "input"
        elif c % 10 == 5:
            kind = "intermittent"
        else:
            kind = "balanced"
        leak = c % 20 == 9
        key = (r, kind, leak)
        classes[key] = classes.get(key, 0) + 1
    stem = job_stem(args, classes, steps_per_s)
    producers = []
    for n, ((r, kind, leak), count) in enumerate(sorted(classes.items())):
        faults = []
        if kind == "slow":
            faults.append("slow-compute:%d:0.5" % ((5 * n + 3) % r))
        elif kind == "input":
            faults.append("slow-input:%d:4" % ((3 * n + 1) % r))
        elif kind == "intermittent":
            first = (n * 7) % period
            for a in range(first, steps, period):
                faults.append("slow-compute:%d:0.5:%d-%d" % ((n + 1) % r, a, a + period // 3))
        if leak:
            faults.append("memory-leak:all:%.6f" % (20 * 1024.0 / steps))  # 20 GiB over the run
        prefix = "%s-r%d-%s%s" % (stem, r, kind, "-leak" if leak else "")
        producers.append(Producer(prefix, count, r, steps, step_ms, args.rate * r * count / total_ranks,
                                  faults, seed=1000 * (n + 1)))
    return producers, steps_per_s, step_ms


def job_names(stem, classes):
    """(job id, ranks) of every job, as plan_jobs names them."""
    out = []
    for (r, kind, leak), count in sorted(classes.items()):
        prefix = "%s-r%d-%s%s" % (stem, r, kind, "-leak" if leak else "")
        width = max(3, len(str(count - 1)))
        names = [prefix] if count == 1 else ["%s-%0*d" % (prefix, width, i) for i in range(count)]
        out += [(name, r) for name in names]
    return out


def kafka_property(text):
    """--reference-kafka/--subject-kafka: a librdkafka property as KEY=VALUE."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError("expected KEY=VALUE (a librdkafka property), got %r" % text)
    return text


def partition_of(key, partitions):
    """librdkafka's default partitioner (consistent_random): CRC-32 of the key."""
    return zlib.crc32(key.encode()) % partitions


def job_stem(args, classes, steps_per_s):
    """The stem of the job ids ("soak<salt>"), salted so that the hottest partition carries as
    few records/s as can be found in 2,000 tries. Jobs are keyed to partitions and the
    development broker keeps 5 MiB a partition: with "soak" itself two 64-rank jobs share a
    partition that holds 28 s of input, less than a SIGKILLed subject may need to catch up.
    The 5 MiB stands in for a real cluster's retention of hours; salting keeps the soak about the
    daemon, not about that bound. The hottest partition's figures are printed at the start."""
    best = None
    for salt in range(2000):
        stem = "soak%d" % salt
        load = {}
        for name, ranks in job_names(stem, classes):
            k = partition_of(name, args.partitions)
            load[k] = load.get(k, 0.0) + ranks * steps_per_s
        worst = max(load.values())
        if best is None or worst < best[0]:
            best = (worst, stem)
    args.hottest_partition_records_per_s = best[0]
    return best[1]


class Soak:
    def __init__(self, args):
        self.args = args
        self.fleet = harness.Fleet()
        self.lock = threading.Lock()
        self.stop_load = threading.Event()
        self.kills_done = 0
        self.kill_log = []
        self.broker_restarts = 0
        self.subject = None
        self.reference = None
        self.dead_subject_lost = 0.0    # lost messages counted by subject processes now killed
        self.last_subject_lost = {}     # pid -> last value seen
        self.kernel_replays = 0
        self.broker_down_until = 0.0
        self.kernel_events_published = 0
        self.kernel_failures = []
        self.cp = {"reference": [], "subject": []}       # (write s, pause s) samples this minute
        self.cp_written = {"reference": 0, "subject": 0}  # checkpoints written this minute
        self.cp_all = {"reference": [], "subject": []}
        self.cp_last = {}                                  # pid -> checkpoints_total last seen
        self.lag_max = {"reference": 0.0, "subject": 0.0}
        self.rss = {"reference": [], "subject": []}       # MiB, one a second, this minute
        self.latencies = []                                # every alert's, seconds

    # --- processes -------------------------------------------------------------------------
    def start_broker(self):
        a = self.args
        p = self.fleet.start("kafka", [os.path.join(harness.BIN, "rankwatch"), "kafka", "--partitions",
                                       str(a.partitions), "--down-seconds", str(a.down_seconds)])
        line = harness.wait_until(lambda: p.stdout().split("\n")[0] if "\n" in p.stdout() else None, 15,
                                  "the broker's bootstrap line")
        self.broker = p
        return line

    def daemon_args(self, group):
        a = self.args
        return ["--group", group, "--config", self.group_config[group], "--job-ttl", "%ds" % a.kernel_ttl,
                "--job-retention", "%ds" % a.kernel_ttl, "--log-level", "warn"]

    def write_group_config(self, group):
        """The daemon's config file: the e2e tests' fast group settings, and the group's
        --reference-kafka/--subject-kafka librdkafka properties."""
        extra = (self.args.subject_kafka if group == "subject" else self.args.reference_kafka) or []
        path = os.path.join(self.fleet.workdir, group + ".yaml")
        with open(path, "w") as f:
            f.write(harness.FAST_GROUP)
            for prop in extra:
                key, value = prop.split("=", 1)
                f.write("  %s: %s\n" % (key, json.dumps(value)))
        return path

    def start_daemon(self, group, state):
        env = None
        conf = self.args.subject_malloc_conf if group == "subject" else self.args.reference_malloc_conf
        if conf is not None:
            env = dict(os.environ, MALLOC_CONF=conf)
        return self.fleet.start_daemon(self.brokers, extra=self.daemon_args(group), state_dir=state, env=env)

    def batch_steps(self, prod):
        """Step records per message: --batch-steps, or a second's steps of one rank, as the
        collector sends them (it flushes every second by default)."""
        return self.args.batch_steps or max(1, round(1000.0 / prod.step_ms))

    def start_jobs(self):
        for prod in self.producers:
            cmd = [os.path.join(harness.BIN, "rankwatch"), "simulate", "--brokers", self.brokers,
                   "--job", prod.prefix, "--jobs", str(prod.count), "--ranks", str(prod.ranks),
                   "--steps", str(prod.steps), "--step-ms", "%.6f" % prod.step_ms, "--speed", "max",
                   "--rate", "%.3f" % prod.rate, "--report-collective", "--seed", str(prod.seed),
                   "--compression", self.args.compression, "--batch-steps", str(self.batch_steps(prod))]
            for f in prod.faults:
                cmd += ["--fault", f]
            prod.proc = self.fleet.start("sim-" + prod.prefix, cmd)

    def kernel_loop(self, loop):
        a = self.args
        n = 0
        while not self.stop_load.is_set():
            # No replay starts while the brokers are down: it would fail to connect, as any
            # producer would, and that is not what the soak measures.
            with self.lock:
                down_until = self.broker_down_until
            if self.stop_load.wait(max(0.0, down_until - time.monotonic())):
                break
            started = time.monotonic()
            fixture = FIXTURES[(loop + n) % len(FIXTURES)]
            job = "kern-%d-%d" % (loop, n)
            n += 1
            r = subprocess.run([os.path.join(harness.BIN, "rankwatch"), "replay", "--brokers", self.brokers,
                                "--job", job, "--format", "kineto", os.path.join(KINETO, fixture)],
                               capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
            try:
                out = json.loads(r.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                out = None
            with self.lock:
                if r.returncode != 0 or out is None or out.get("failed"):
                    self.kernel_failures.append("%s: rc %d %s" % (job, r.returncode, r.stderr.strip()[-200:]))
                else:
                    self.kernel_replays += 1
                    self.kernel_events_published += out["kernel_events"]
            self.stop_load.wait(max(0.0, a.kernel_period - (time.monotonic() - started)))

    def chaos(self, schedule):
        """Runs the kills and the broker restart at their times (seconds after the load began)."""
        for at, action in schedule:
            if self.stop_load.wait(max(0.0, self.t0 + at - time.monotonic())):
                return
            if action == "kill":
                with self.lock:
                    victim = self.subject
                self.note_subject_lost(victim, final=True)
                killed_at = time.monotonic()
                victim.stop(signal.SIGKILL)
                with self.lock:
                    self.subject = None
                    self.kills_done += 1
                try:
                    fresh = self.start_daemon("subject", self.subject_state)
                except AssertionError as e:
                    log("soak: the subject did not come back after kill %d: %s" % (self.kills_done, e))
                    self.kill_log.append({"at_s": round(at, 1), "restart_s": None, "error": str(e)})
                    return
                took = time.monotonic() - killed_at
                with self.lock:
                    self.subject = fresh
                self.kill_log.append({"at_s": round(at, 1), "restart_s": round(took, 2)})
                log("soak: t=%4.0fs subject SIGKILLed (%d/%d), back in its group after %.1f s"
                    % (at, self.kills_done, self.args.kills, took))
            else:
                with self.lock:
                    self.broker_down_until = time.monotonic() + self.args.down_seconds + 2
                os.kill(self.broker.proc.pid, signal.SIGUSR1)
                with self.lock:
                    self.broker_restarts += 1
                log("soak: t=%4.0fs broker restart: every broker down for %.0f s, then up"
                    % (at, self.args.down_seconds))

    # --- sampling ----------------------------------------------------------------------------
    def note_subject_lost(self, daemon, final=False):
        if daemon is None:
            return
        try:
            s = scrape(daemon)
        except Exception:  # noqa: BLE001 - a dying daemon: keep the last value seen
            s = None
        pid = daemon.proc.pid
        if s is not None:
            self.last_subject_lost[pid] = total(s, "rankwatch_input_lost_messages_total")
        if final:
            self.dead_subject_lost += self.last_subject_lost.pop(pid, 0.0)

    def sample(self, which, daemon):
        """One scrape: checkpoint figures when a checkpoint was written since the last one."""
        if daemon is None:
            return None
        try:
            s = scrape(daemon)
        except Exception:  # noqa: BLE001 - killed or restarting
            return None
        pid = daemon.proc.pid
        count = harness.metric(s, "rankwatch_checkpoints_total") or 0
        last = self.cp_last.get(pid)
        if last is not None and count > last:
            self.cp_written[which] += int(count - last)
            sample = (harness.metric(s, "rankwatch_checkpoint_seconds") or 0.0,
                      harness.metric(s, "rankwatch_checkpoint_pause_seconds") or 0.0,
                      harness.metric(s, "rankwatch_checkpoint_bytes") or 0.0)
            self.cp[which].append(sample)
            self.cp_all[which].append(sample)
        self.cp_last[pid] = count
        mib = rss_mib(pid)
        if mib is not None:
            self.rss[which].append(mib)
        self.lag_max[which] = max(self.lag_max[which], harness.metric(s, "rankwatch_ingest_lag_seconds") or 0.0)
        if which == "subject":
            self.last_subject_lost[pid] = total(s, "rankwatch_input_lost_messages_total")
        return s

    def lost_now(self, ref_samples):
        ref = total(ref_samples, "rankwatch_input_lost_messages_total") if ref_samples else 0.0
        subj = self.dead_subject_lost + sum(self.last_subject_lost.values())
        return ref, subj

    # --- the run -----------------------------------------------------------------------------
    def run(self):
        a = self.args
        load_s = a.minutes * 60.0
        warmup = min(a.warmup_minutes, max(1, a.minutes // 2))
        self.producers, steps_per_s, step_ms = plan_jobs(a, load_s)
        self.jobs = [j for prod in self.producers for j in prod.jobs]
        log("soak: %d jobs in %d producer processes, %d ranks, %.0f step records/s offered (%.1f steps/s a rank, "
            "%.2f ms steps, %d steps a job), %d kernel replay loops every %.0f s, %d partitions, %.0f min, %d kills, broker restart %s, "
            "warm-up %d min"
            % (len(self.jobs), len(self.producers), sum(j.ranks for j in self.jobs), a.rate, steps_per_s, step_ms, self.jobs[0].steps,
               a.kernel_loops, a.kernel_period, a.partitions, a.minutes, a.kills,
               "on" if a.broker_restart else "off", warmup))
        hot = a.hottest_partition_records_per_s
        log("soak: job ids %s-*; the hottest of %d partitions takes %.0f step records/s, ~%.0f s of input in the "
            "development broker's 5 MiB (at ~36 bytes a record with zstd)"
            % (self.jobs[0].name.split("-")[0], a.partitions, hot, 5 * 1024 * 1024 / (hot * 36.0)))
        self.group_config = {g: self.write_group_config(g) for g in ("reference", "subject")}
        self.brokers = self.start_broker()
        self.reference = self.start_daemon("reference", os.path.join(self.fleet.workdir, "reference"))
        self.subject_state = os.path.join(self.fleet.workdir, "subject")
        self.subject = self.start_daemon("subject", self.subject_state)
        from alert_client import Watcher  # noqa: E402 - needs build/gen_py on the path
        watcher = Watcher(self.reference.endpoints["grpc"])

        # Kills and the broker restart spread over the load, between 10 % and 90 % of it, each in
        # its own slot with some jitter; the broker restart takes the middle slot.
        rng = random.Random(a.seed)
        actions = ["kill"] * a.kills
        if a.broker_restart:
            actions.insert(len(actions) // 2, "broker")
        slot = 0.8 * load_s / max(1, len(actions))
        schedule = [(0.1 * load_s + slot * (i + 0.5 + rng.uniform(-0.25, 0.25)), act)
                    for i, act in enumerate(actions)]

        self.t0 = time.monotonic()
        self.start_jobs()
        kernel_threads = [threading.Thread(target=self.kernel_loop, args=(i,), daemon=True)
                          for i in range(a.kernel_loops)]
        for t in kernel_threads:
            t.start()
        chaos = threading.Thread(target=self.chaos, args=(schedule,), daemon=True)
        chaos.start()

        minutes = []
        alerts_seen = 0
        prev_ref = None
        prev_ref_t = None
        minute = 0
        next_tick = self.t0
        ref_s = subj_s = None
        while True:
            next_tick += a.sample_interval
            time.sleep(max(0.0, next_tick - time.monotonic()))
            now = time.monotonic()
            ref_s = self.sample("reference", self.reference) or ref_s
            with self.lock:
                subject = self.subject
            subj_s = self.sample("subject", subject) or (subj_s if subject is not None else None)
            if now - self.t0 < (minute + 1) * 60.0:
                continue
            minute += 1
            steps = total(ref_s, "rankwatch_events_total", kind="step")
            kernels = total(ref_s, "rankwatch_events_total", kind="kernel")
            if prev_ref is None:
                rate_steps, rate_kernel = steps / (now - self.t0), kernels / (now - self.t0)
            else:
                rate_steps = (steps - prev_ref[0]) / (now - prev_ref_t)
                rate_kernel = (kernels - prev_ref[1]) / (now - prev_ref_t)
            prev_ref, prev_ref_t = (steps, kernels), now
            new_alerts = watcher.alerts[alerts_seen:]
            alerts_seen += len(new_alerts)
            latencies = [t - al.triggered_unix_ns / 1e9 for al, t in new_alerts]
            self.latencies += latencies
            lost_ref, lost_subj = self.lost_now(ref_s)
            row = {
                "minute": minute, "elapsed_s": round(now - self.t0, 1),
                "records_per_s": round(rate_steps + rate_kernel), "step_records_per_s": round(rate_steps),
                "kernel_events_per_s": round(rate_kernel),
                "rss_mib": {w: round(statistics.mean(v), 1) if v else None for w, v in self.rss.items()},
                "rss_max_mib": {w: round(max(v), 1) if v else None for w, v in self.rss.items()},
                "subject_pid": subject.proc.pid if subject else None,
                "jobs": harness.metric(ref_s, "rankwatch_jobs"), "series": harness.metric(ref_s, "series"),
                "checkpoint": {},
                "alerts": len(latencies),
                "alert_latency_s": {"p50": quantile(latencies, 0.5), "p99": quantile(latencies, 0.99)},
                "lost_messages": {"reference": lost_ref, "subject": lost_subj},
                "kills": self.kills_done, "broker_restarts": self.broker_restarts,
                "max_ingest_lag_s": dict(self.lag_max),
                # Where the memory is, by the daemons' own gauges at the minute's last scrape (MiB).
                "memory_mib": {"reference": memory_breakdown(ref_s, self.reference.proc.pid),
                               "subject": memory_breakdown(subj_s, subject.proc.pid if subject else None)},
            }
            for which in ("reference", "subject"):
                w = [x[0] for x in self.cp[which]]
                p = [x[1] for x in self.cp[which]]
                b = [x[2] for x in self.cp[which]]
                row["checkpoint"][which] = {"write_p50_s": quantile(w, 0.5), "write_p99_s": quantile(w, 0.99),
                                            "pause_p50_s": quantile(p, 0.5), "pause_p99_s": quantile(p, 0.99),
                                            "sampled": len(w), "written": self.cp_written[which],
                                            # estimated: the sampled checkpoints' mean size x the number written
                                            "mib_written": round(statistics.mean(b) * self.cp_written[which] / 2**20, 1)
                                            if b else 0.0}
                self.cp[which], self.cp_written[which] = [], 0
            self.lag_max = {"reference": 0.0, "subject": 0.0}
            self.rss = {"reference": [], "subject": []}
            minutes.append(row)
            c, r = row["checkpoint"], row["rss_mib"]
            log("[%3d] t=%5.0fs records/s %7d (steps %7d, kernel %6d)  RSS ref %6.1f subj %6s MiB  "
                "ckpt write p50/p99 ref %s/%s subj %s/%s ms (pause ref %s/%s subj %s/%s ms; %d of %d, %d of %d sampled)  "
                "alert p50/p99 %s/%s ms (%d)  lost %d/%d  kills %d/%d  broker restarts %d  lag ref %.1f subj %.1f s  "
                "jobs %d series %d  checkpoints ref %.1f subj %.1f MiB"
                % (minute, row["elapsed_s"], row["records_per_s"], row["step_records_per_s"],
                   row["kernel_events_per_s"], r["reference"] or 0,
                   "%.1f" % r["subject"] if r["subject"] else "-",
                   fmt_ms(c["reference"]["write_p50_s"]), fmt_ms(c["reference"]["write_p99_s"]),
                   fmt_ms(c["subject"]["write_p50_s"]), fmt_ms(c["subject"]["write_p99_s"]),
                   fmt_ms(c["reference"]["pause_p50_s"]), fmt_ms(c["reference"]["pause_p99_s"]),
                   fmt_ms(c["subject"]["pause_p50_s"]), fmt_ms(c["subject"]["pause_p99_s"]),
                   c["reference"]["sampled"], c["reference"]["written"],
                   c["subject"]["sampled"], c["subject"]["written"],
                   fmt_ms(row["alert_latency_s"]["p50"]), fmt_ms(row["alert_latency_s"]["p99"]), len(latencies),
                   lost_ref, lost_subj, self.kills_done, a.kills, self.broker_restarts,
                   row["max_ingest_lag_s"]["reference"], row["max_ingest_lag_s"]["subject"],
                   row["jobs"] or 0, row["series"] or 0,
                   c["reference"]["mib_written"], c["subject"]["mib_written"]))
            for which in ("reference", "subject"):
                if row["memory_mib"][which]:
                    log("      memory %-9s %s" % (which, "  ".join(
                        "%s %.1f" % (k, v) for k, v in row["memory_mib"][which].items())))
            if minute >= a.minutes:
                break

        # --- the end of the load: producers finish, the daemons drain ------------------------
        self.stop_load.set()
        chaos.join(120)
        for t in kernel_threads:
            t.join(300)
        sim_failures = []
        for prod in self.producers:
            try:
                prod.proc.proc.wait(max(10.0, self.t0 + load_s + 120 - time.monotonic()))
                prod.result = json.loads(prod.proc.stdout().strip().splitlines()[-1])
                if prod.proc.proc.returncode != 0 or prod.result["failed"]:
                    sim_failures.append("%s: rc %d, %s" % (prod.prefix, prod.proc.proc.returncode, prod.result))
            except (subprocess.TimeoutExpired, ValueError, IndexError) as e:
                sim_failures.append("%s: %r %s" % (prod.prefix, e, prod.proc.stderr()[-300:]))
        load_end = time.monotonic()
        with self.lock:
            subject = self.subject
        want = {j.name: j.steps for j in self.jobs}

        def aligned_all(d):
            s = scrape(d, FINAL)
            return all(harness.metric(s, "rankwatch_steps_aligned_total", training_job=j) == n for j, n in want.items())
        # Each daemon's figures are taken as soon as it has aligned every step (or at the drain
        # timeout): finished jobs are retired --job-retention after their end, so a daemon that
        # drained early must not wait for the other one.
        drained = {}
        finals = {}
        pending = {"reference": self.reference, "subject": subject}
        # Finished jobs are retired --job-retention (--kernel-ttl) after their end: a daemon still
        # behind by then is measured before that, or its jobs are gone (NOT_FOUND for all).
        deadline = time.monotonic() + min(a.drain_timeout, 0.75 * a.kernel_ttl)
        while pending:
            for which, d in list(pending.items()):
                done = d is not None and aligned_all(d)
                if done or time.monotonic() >= deadline:
                    drained[which] = round(time.monotonic() - load_end, 1) if done else None
                    if not done:
                        log("soak: timed out after %.0f s waiting for the %s to align every step"
                            % (min(a.drain_timeout, 0.75 * a.kernel_ttl), which))
                    time.sleep(1)  # the daemon publishes its final snapshot
                    finals[which] = self.collect(d)
                    del pending[which]
            if pending:
                time.sleep(2)
        watcher.stop()
        result = self.verdict(minutes, warmup, subject, sim_failures, drained, finals, load_end, load_s)
        if a.trim_probe:
            # Separates memory the daemon holds from free memory glibc's malloc keeps after a burst
            # (a broker outage or a catch-up fills librdkafka's fetch queue; its threads' arenas
            # are not returned to the system): malloc_trim(0) in each daemon through gdb.
            for which, d in (("reference", self.reference), ("subject", subject)):
                if d is None:
                    continue
                before = rss_mib(d.proc.pid)
                r = subprocess.run(["gdb", "-p", str(d.proc.pid), "-batch", "-ex", "call (int)malloc_trim(0)"],
                                   capture_output=True, text=True, timeout=120)
                after = rss_mib(d.proc.pid)
                base = result["rss"][which]["after_warmup_mib"]
                result["rss"][which]["trim_probe"] = {
                    "before_mib": before, "after_malloc_trim_mib": after, "gdb_rc": r.returncode,
                    "growth_after_trim_pct": round(100.0 * (after - base) / base, 2) if base and after else None}
        return result

    # --- the checks ----------------------------------------------------------------------------
    def collect(self, d):
        """A daemon's final metrics and every simulated job's diagnosis: (samples, {job: diagnosis})."""
        import grpc  # noqa: E402
        from rankwatch.v1 import service_pb2, service_pb2_grpc  # noqa: E402
        if d is None:
            return [], {job.name: RuntimeError("no daemon") for job in self.jobs}
        samples = scrape(d, FINAL)
        stub = service_pb2_grpc.RankWatchStub(grpc.insecure_channel(d.endpoints["grpc"]))
        diags = {}
        for job in self.jobs:
            try:
                diags[job.name] = stub.GetDiagnosis(service_pb2.GetDiagnosisRequest(training_job=job.name), timeout=10)
            except Exception as e:  # noqa: BLE001 - reported as a mismatch below
                diags[job.name] = e
        return samples, diags

    def verdict(self, minutes, warmup, subject, sim_failures, drained, collected, load_end, load_s):
        from rankwatch.v1 import service_pb2  # noqa: E402
        a = self.args
        finals = {which: collected[which][0] for which in collected}
        diags = {which: collected[which][1] for which in collected}
        # Exactly once: every simulated step aligned once, nothing timed out, in both daemons.
        once_fail = []
        for which in ("reference", "subject"):
            s = finals[which]
            for job in self.jobs:
                al = harness.metric(s, "rankwatch_steps_aligned_total", training_job=job.name)
                to = harness.metric(s, "rankwatch_steps_timed_out_total", training_job=job.name) or 0
                d = diags[which][job.name]
                da = d.aligned_steps if not isinstance(d, Exception) else None
                if al != job.steps or da != job.steps or to != 0:
                    once_fail.append("%s %s: aligned %s (diagnosis %s) of %d, timed out %d"
                                     % (which, job.name, al, da, job.steps, to))
        # Diagnoses equal, field by field, and as a whole (evaluation time and hang evidence aside).
        diff = []
        whole_diff = []
        labels = {}
        for job in self.jobs:
            x, y = diags["reference"][job.name], diags["subject"][job.name]
            if isinstance(x, Exception) or isinstance(y, Exception):
                diff.append("%s: %s / %s" % (job.name, type(x).__name__, type(y).__name__))
                continue
            kx = key_fields(x, service_pb2)
            ky = key_fields(y, service_pb2)
            labels[kx["step_label"]] = labels.get(kx["step_label"], 0) + 1
            if kx != ky:
                diff.append("%s: reference %s, subject %s" % (job.name, kx, ky))
            for d in (x, y):
                d.ClearField("evaluated_unix_ns")
                d.step.hang.Clear()
            if x != y:
                whole_diff.append(job.name)
        lost_ref = total(finals["reference"], "rankwatch_input_lost_messages_total")
        if subject is not None:
            self.last_subject_lost[subject.proc.pid] = total(finals["subject"], "rankwatch_input_lost_messages_total")
        lost_subj = self.dead_subject_lost + sum(self.last_subject_lost.values())
        lost_in_diag = {w: sum(d.input_lost_messages for d in diags[w].values() if not isinstance(d, Exception))
                        for w in diags}
        # RSS growth after warm-up: the mean RSS (sampled every second) over the k minutes after
        # the warm-up against the last k minutes of load, k = min(5, half of what follows the
        # warm-up). Means, not single samples: RocksDB's memtable fills and is freed in a sawtooth.
        k = max(1, min(5, (len(minutes) - warmup) // 2))
        rss = {}
        for which in ("reference", "subject"):
            first = [m["rss_mib"][which] for m in minutes[warmup:warmup + k] if m["rss_mib"][which]]
            last = [m["rss_mib"][which] for m in minutes[-k:] if m["rss_mib"][which]]
            base = statistics.mean(first) if first else None
            end = statistics.mean(last) if last else None
            rss[which] = {"after_warmup_mib": round(base, 1) if base else None,
                          "at_end_mib": round(end, 1) if end else None,
                          "minutes_compared": [warmup + 1, warmup + k, len(minutes) - k + 1, len(minutes)],
                          "max_mib": max((m["rss_max_mib"][which] or 0) for m in minutes),
                          "growth_pct": round(100.0 * (end - base) / base, 2) if base and end else None}
        # Consumed rate: reference records (steps + kernel events) over the minutes after the first.
        steady = minutes[1:] or minutes
        rate = statistics.mean(m["records_per_s"] for m in steady)
        step_rate = statistics.mean(m["step_records_per_s"] for m in steady)
        cps = {w: {"write_p50_s": quantile([x[0] for x in self.cp_all[w]], 0.5),
                   "write_p99_s": quantile([x[0] for x in self.cp_all[w]], 0.99),
                   "pause_p50_s": quantile([x[1] for x in self.cp_all[w]], 0.5),
                   "pause_p99_s": quantile([x[1] for x in self.cp_all[w]], 0.99),
                   "sampled": len(self.cp_all[w])} for w in self.cp_all}
        checks = {
            "rate": rate >= a.rate and step_rate >= 0.98 * a.rate,
            "rss_growth_under_5pct": all(v["growth_pct"] is not None and v["growth_pct"] < 5.0 for v in rss.values()),
            "exactly_once": not once_fail and all(v is not None for v in drained.values()),
            "diagnoses_equal": not diff,
            "no_input_lost": lost_ref == 0 and lost_subj == 0 and not any(lost_in_diag.values()),
            "kills_done": self.kills_done == a.kills and all(k["restart_s"] is not None for k in self.kill_log),
            "broker_restart_done": self.broker_restarts == (1 if a.broker_restart else 0),
            "producers_ok": not sim_failures and not self.kernel_failures,
        }
        summary = {
            "config": {"minutes": a.minutes, "jobs": a.jobs, "ranks": sum(j.ranks for j in self.jobs),
                       "rate": a.rate, "partitions": a.partitions, "kills": a.kills,
                       "broker_restart": a.broker_restart, "down_seconds": a.down_seconds,
                       "kernel_loops": a.kernel_loops, "kernel_period_s": a.kernel_period,
                       "job_ttl_s": a.kernel_ttl, "warmup_minutes": warmup, "steps_per_job": self.jobs[0].steps,
                       "reference_malloc_conf": a.reference_malloc_conf, "subject_malloc_conf": a.subject_malloc_conf,
                       "reference_kafka": a.reference_kafka or [], "subject_kafka": a.subject_kafka or []},
            "records_per_s_mean": round(rate), "step_records_per_s_mean": round(step_rate),
            "step_records_offered": sum(j.ranks * j.steps for j in self.jobs),
            "kernel_replays": self.kernel_replays, "kernel_events_published": self.kernel_events_published,
            "kernel_events_consumed": {w: total(finals[w], "rankwatch_events_total", kind="kernel") for w in finals},
            "rss": rss,
            "checkpoint": cps,
            "alerts_received": sum(m["alerts"] for m in minutes),
            "alert_latency_s": {"p50": quantile(self.latencies, 0.5), "p99": quantile(self.latencies, 0.99),
                                "max": max(self.latencies) if self.latencies else None},
            "lost_messages": {"reference": lost_ref, "subject": lost_subj, "in_diagnoses": lost_in_diag},
            "kills": self.kill_log, "broker_restarts": self.broker_restarts,
            "drain_s": drained,
            "duplicates_rejected_subject_last_process": harness.metric(
                finals["subject"], "rankwatch_events_rejected_total", reason="duplicate"),
            "step_labels": labels,
            "exactly_once_failures": once_fail[:20], "exactly_once_failure_count": len(once_fail),
            "diagnosis_differences": diff[:20], "diagnosis_difference_count": len(diff),
            "whole_diagnosis_differences": len(whole_diff), "whole_diagnosis_differing_jobs": whole_diff[:10],
            "producer_failures": (sim_failures + self.kernel_failures)[:20],
            "checks": checks, "passed": all(checks.values()),
            "minutes_detail": minutes,
        }
        return summary

    def close(self):
        self.stop_load.set()
        if self.args.keep:
            log("soak: kept %s" % self.fleet.workdir)
            for p in reversed(self.fleet.processes):
                p.close()
        else:
            self.fleet.close()


def key_fields(d, pb):
    return {"step_label": pb.StepDiagnosisLabel.Name(d.step.label), "culprit_ranks": list(d.step.culprit_ranks),
            "cause": pb.StragglerCause.Name(d.step.cause), "culprit_phase": d.step.culprit_phase,
            "severity": d.step.severity, "memory_label": pb.MemoryDiagnosisLabel.Name(d.memory.label)}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=int, default=60, help="minutes of load (the drain comes after)")
    p.add_argument("--jobs", type=int, default=200, help="simulated jobs (8 to 64 ranks)")
    p.add_argument("--rate", type=float, default=200000, help="step records/s offered across the jobs")
    p.add_argument("--kills", type=int, default=5, help="SIGKILLs of the subject daemon")
    p.add_argument("--broker-restart", action=argparse.BooleanOptionalAction, default=True,
                   help="one simulated broker restart (rankwatch kafka, SIGUSR1)")
    p.add_argument("--down-seconds", type=float, default=10, help="how long the broker restart keeps it down")
    p.add_argument("--partitions", type=int, default=256,
                   help="the broker keeps 5 MiB (~146,000 step records with zstd) a partition, jobs are keyed "
                        "to partitions: enough of them that a daemon behind after the broker restart or a "
                        "kill catches up before retention")
    p.add_argument("--batch-steps", type=int, default=0,
                   help="step records per message (default: one rank's steps of a second, as the "
                        "collector flushes every second)")
    p.add_argument("--compression", default="zstd", choices=["lz4", "zstd"],
                   help="the simulators' codec: zstd stores a step record in ~36 bytes, lz4 in ~45")
    p.add_argument("--kernel-loops", type=int, default=2, help="concurrent Kineto replay loops")
    p.add_argument("--kernel-period", type=float, default=5, help="seconds between replays of one loop")
    p.add_argument("--kernel-ttl", type=int, default=60,
                   help="the daemons' --job-ttl and --job-retention, seconds (replayed kernel jobs are retired)")
    p.add_argument("--warmup-minutes", type=int, default=5, help="RSS baseline minute (at most half the run)")
    p.add_argument("--sample-interval", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument("--drain-timeout", type=float, default=300,
                   help="seconds to wait for each daemon to align every step after the load (at most "
                        "0.75 x --kernel-ttl: finished jobs are retired --kernel-ttl after their end)")
    p.add_argument("--reference-malloc-conf", default=None,
                   help="MALLOC_CONF for the reference daemon only (jemalloc builds)")
    p.add_argument("--subject-malloc-conf", default=None,
                   help="MALLOC_CONF for the subject daemon only; with --kills 0 and --no-broker-restart "
                        "the two daemons are an A/B of allocator settings in one run")
    p.add_argument("--reference-kafka", action="append", metavar="KEY=VALUE", type=kafka_property,
                   help="a librdkafka property for the reference daemon only (repeatable)")
    p.add_argument("--subject-kafka", action="append", metavar="KEY=VALUE", type=kafka_property,
                   help="a librdkafka property for the subject daemon only (repeatable); with --kills 0 "
                        "the two daemons are an A/B of consumer settings in one run")
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--trim-probe", action=argparse.BooleanOptionalAction, default=shutil.which("gdb") is not None,
                   help="after the checks, call malloc_trim(0) in both daemons (gdb) and report their RSS "
                        "after it: memory the daemon holds vs free memory malloc kept (informative, not a check)")
    p.add_argument("--json-out", help="also write the JSON summary here")
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs, state)")
    p.add_argument("--bin", default=None, help="folder with rankwatch and rankwatchd (default build/bin)")
    a = p.parse_args()
    if a.bin:
        harness.BIN = a.bin
    soak = Soak(a)
    try:
        summary = soak.run()
    finally:
        soak.close()
    detail = summary.pop("minutes_detail")
    for which, r in summary["rss"].items():
        trim = r.get("trim_probe") or {}
        log("soak: RSS %-9s after warm-up %s MiB, at the end %s MiB (%s %%), peak %s MiB, after malloc_trim %s MiB"
            % (which, r["after_warmup_mib"], r["at_end_mib"], r["growth_pct"], r["max_mib"],
               trim.get("after_malloc_trim_mib", "-")))
    for name, ok in summary["checks"].items():
        log("soak: %-22s %s" % (name, "ok" if ok else "FAILED"))
    log(json.dumps(summary))
    if a.json_out:
        summary["minutes_detail"] = detail
        with open(a.json_out, "w") as f:
            json.dump(summary, f, indent=1)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
