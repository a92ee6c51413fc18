#include "parts/part_runtime.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

namespace rankwatch {
namespace {

// A part that plugs one of everything in, and logs what is called.
class LoggingPart : public DaemonPart, public TickHook, public DiagnosisContributor {
 public:
  LoggingPart(std::string name, std::vector<std::string>* log, absl::Status start = {})
      : name_(std::move(name)), log_(log), start_(std::move(start)) {}

  std::string_view name() const override { return name_; }
  absl::Status Start(PartContext& context) override {
    log_->push_back(name_ + " start (brokers " + context.environment().brokers + ")");
    if (!start_.ok()) return start_;
    context.Schedule(name_ + " duty", std::chrono::seconds(1),
                     [this](TimePoint) { log_->push_back(name_ + " duty"); });
    context.HookTick(this);
    context.services().AddDiagnosis(this);
    context.services().Offer<LoggingPart>(this);
    context.AtCheckpoint([this] { log_->push_back(name_ + " save"); });
    return absl::OkStatus();
  }
  absl::Status Restored(PartContext& context) override {
    log_->push_back(name_ + " restored (ui " + context.environment().ui_url + ")");
    return absl::OkStatus();
  }
  void Stop() override { log_->push_back(name_ + " stop"); }

  void OnTick(const TickView&, std::vector<v1::Alert>*) override {}
  void AddTo(const JobSnapshot&, v1::Diagnosis* d) const override {
    d->mutable_hang_stacks()->set_summary(d->hang_stacks().summary() + name_);
  }

 private:
  const std::string name_;
  std::vector<std::string>* log_;
  const absl::Status start_;
};

using Log = std::vector<std::string>;

std::vector<std::unique_ptr<DaemonPart>> Parts(Log* log, absl::Status second_start = {}) {
  std::vector<std::unique_ptr<DaemonPart>> parts;
  parts.push_back(std::make_unique<LoggingPart>("a", log));
  parts.push_back(std::make_unique<LoggingPart>("b", log, second_start));
  return parts;
}

TEST(PartRuntimeTest, RunsThePartsThroughTheirLifecycleInOrder) {
  Log log;
  TimePoint now{};
  PartEnvironment environment;
  environment.brokers = "kafka:9092";
  PartRuntime parts(Parts(&log), environment, [&now] { return now; });
  ASSERT_TRUE(parts.Start().ok());
  EXPECT_EQ(log, (Log{"a start (brokers kafka:9092)", "b start (brokers kafka:9092)"}));
  // What they plugged in, in their order.
  EXPECT_EQ(parts.hooks().size(), 2u);
  EXPECT_EQ(parts.duties().size(), 2u);
  v1::Diagnosis diagnosis;
  for (const DiagnosisContributor* c : parts.services().diagnosis())
    c->AddTo(JobSnapshot{}, &diagnosis);
  EXPECT_EQ(diagnosis.hang_stacks().summary(), "ab");
  // One service per type: the later offer wins.
  EXPECT_EQ(parts.services().Find<LoggingPart>(), parts.hooks()[1]);
  EXPECT_EQ(parts.services().Find<PartRuntime>(), nullptr);

  log.clear();
  parts.environment().ui_url = "http://ui:8466";
  ASSERT_TRUE(parts.Restored().ok());
  parts.duties().RunDue();
  now += std::chrono::milliseconds(999);
  parts.duties().RunDue();  // not due yet
  parts.Checkpoint();
  parts.Stop();
  EXPECT_EQ(log, (Log{"a restored (ui http://ui:8466)", "b restored (ui http://ui:8466)", "a duty",
                      "b duty", "a save", "b save", "a stop", "b stop", "a save", "b save"}));
}

TEST(PartRuntimeTest, AFailedStartStopsTheStart) {
  Log log;
  PartRuntime parts(Parts(&log, absl::UnavailableError("no broker")), PartEnvironment{});
  absl::Status s = parts.Start();
  EXPECT_EQ(s, absl::UnavailableError("no broker"));
  EXPECT_EQ(log, (Log{"a start (brokers )", "b start (brokers )"}));
  EXPECT_EQ(parts.duties().size(), 1u);  // the first part's
}

}  // namespace
}  // namespace rankwatch
