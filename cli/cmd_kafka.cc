// `rankwatch kafka`: a local Kafka-protocol broker (librdkafka's mock cluster) in its own
// process on 127.0.0.1. Prints the bootstrap address as the first line of stdout.
//
// A simulated broker restart (SIGUSR1, or --restart-at): every broker goes down for
// --down-seconds (connections closed and refused, the in-memory logs kept), then up again.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <memory>
#include <vector>

#include "cli/commands.h"
#include "common/stop_signal.h"
#include "kafka/embedded_broker.h"

namespace rankwatch {
namespace {

std::atomic<bool> g_restart_requested{false};

extern "C" void OnRestartSignal(int) { g_restart_requested.store(true); }

struct KafkaFlags {
  EmbeddedBrokerOptions broker;
  std::string bootstrap_file;
  double down_seconds = 10;
  std::vector<double> restart_at;  // seconds after start
};

// Down for `down`, then up; a stop request ends the outage early. Returns false on an error.
bool RestartBrokers(EmbeddedBroker& broker, std::chrono::milliseconds down, int number) {
  absl::Status s = broker.SetDown();
  if (!s.ok()) {
    spdlog::error("kafka: {}", std::string(s.message()));
    return false;
  }
  spdlog::warn(
      "kafka: restart {}: every broker down (connections closed and refused, logs kept) "
      "for {:.1f} s",
      number, down.count() / 1e3);
  WaitForStop(down);
  s = broker.SetUp();
  if (!s.ok()) {
    spdlog::error("kafka: {}", std::string(s.message()));
    return false;
  }
  spdlog::warn("kafka: restart {}: every broker up again", number);
  return true;
}

}  // namespace

CommandRunner AddKafkaCommand(CLI::App& app) {
  auto f = std::make_shared<KafkaFlags>();
  CLI::App* cmd = app.add_subcommand(
      "kafka", "run a local in-memory Kafka-protocol broker on 127.0.0.1 (development, tests)");
  cmd->add_option("--partitions", f->broker.partitions, "partitions of the topic")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--topic", f->broker.topic, "topic to create")->capture_default_str();
  cmd->add_option("--brokers", f->broker.brokers, "number of mock brokers")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--bootstrap-file", f->bootstrap_file,
                  "also write the bootstrap address to this file");
  cmd->add_option("--down-seconds", f->down_seconds,
                  "a simulated restart (SIGUSR1 or --restart-at) keeps every broker down this "
                  "long: connections closed and refused, the in-memory logs kept")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 3600.0));
  cmd->add_option("--restart-at", f->restart_at,
                  "seconds after start at which to simulate a broker restart (repeatable)")
      ->check(CLI::Range(0.0, 1e7));
  return [cmd, f]() -> int {
    if (!cmd->parsed()) return -1;
    struct sigaction sa {};
    sa.sa_handler = OnRestartSignal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGUSR1, &sa, nullptr);

    auto broker = EmbeddedBroker::Start(f->broker);
    if (!broker.ok()) {
      spdlog::error("{}", std::string(broker.status().message()));
      return 1;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::string& bootstrap = (*broker)->bootstrap();
    std::printf("%s\n", bootstrap.c_str());
    std::fflush(stdout);
    if (!f->bootstrap_file.empty()) {
      const std::string tmp = f->bootstrap_file + ".tmp";
      std::ofstream(tmp) << bootstrap << "\n";
      std::rename(tmp.c_str(), f->bootstrap_file.c_str());
    }
    spdlog::info("kafka: broker at {}, topic {} with {} partitions; Ctrl-C to stop", bootstrap,
                 f->broker.topic, f->broker.partitions);
    std::vector<double> schedule = f->restart_at;
    std::sort(schedule.begin(), schedule.end(), std::greater<>());  // next one at the back
    const auto down = std::chrono::milliseconds(static_cast<int64_t>(f->down_seconds * 1e3));
    int restarts = 0;
    while (!WaitForStop(std::chrono::milliseconds(100))) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      bool due = g_restart_requested.exchange(false);
      while (!schedule.empty() && schedule.back() <= elapsed) {
        schedule.pop_back();
        due = true;
      }
      if (due && !RestartBrokers(**broker, down, ++restarts)) return 1;
    }
    spdlog::info("kafka: stopped");
    return 0;
  };
}

}  // namespace rankwatch
