// `rankwatch kafka`: a local Kafka-protocol broker (librdkafka's mock cluster) in its own
// process on 127.0.0.1. Prints the bootstrap address as the first line of stdout.
#include <spdlog/spdlog.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "cli/commands.h"
#include "common/stop_signal.h"
#include "ingest/embedded_broker.h"

namespace rankwatch {

CommandRunner AddKafkaCommand(CLI::App& app) {
  auto options = std::make_shared<EmbeddedBrokerOptions>();
  auto bootstrap_file = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "kafka", "run a local in-memory Kafka-protocol broker on 127.0.0.1 (development, tests)");
  cmd->add_option("--partitions", options->partitions, "partitions of the topic")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--topic", options->topic, "topic to create")->capture_default_str();
  cmd->add_option("--brokers", options->brokers, "number of mock brokers")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd->add_option("--bootstrap-file", *bootstrap_file,
                  "also write the bootstrap address to this file");
  return [cmd, options, bootstrap_file]() -> int {
    if (!cmd->parsed()) return -1;
    auto broker = EmbeddedBroker::Start(*options);
    if (!broker.ok()) {
      spdlog::error("{}", std::string(broker.status().message()));
      return 1;
    }
    const std::string& bootstrap = (*broker)->bootstrap();
    std::printf("%s\n", bootstrap.c_str());
    std::fflush(stdout);
    if (!bootstrap_file->empty()) {
      const std::string tmp = *bootstrap_file + ".tmp";
      std::ofstream(tmp) << bootstrap << "\n";
      std::rename(tmp.c_str(), bootstrap_file->c_str());
    }
    spdlog::info("kafka: broker at {}, topic {} with {} partitions; Ctrl-C to stop", bootstrap,
                 options->topic, options->partitions);
    while (!WaitForStop(std::chrono::seconds(1))) {
    }
    spdlog::info("kafka: stopped");
    return 0;
  };
}

}  // namespace rankwatch
