#include "operators/lost_time.h"

#include <algorithm>
#include <cmath>

#include "operators/phase_stats.h"

namespace rankwatch {

LostTime::LostTime(uint32_t world_size, size_t window_steps)
    : world_size_(world_size),
      window_steps_(window_steps),
      window_by_rank_(world_size, 0),
      total_by_rank_(world_size, 0) {}

namespace {
constexpr double kNs = 1e-9;
int64_t ToNs(double seconds) { return std::llround(seconds * 1e9); }
}  // namespace

LostTime::StepCost LostTime::CostOf(const StepWindow::Step& step, const BlockedModel& model) {
  StepCost c;
  own_.clear();
  step_.clear();
  double max_own = -1;
  for (const StepWindow::Entry& e : step.entries) {
    if (!e.Has(Phase::kStep)) continue;
    std::array<double, kPhaseCount> v{};
    for (int p = 0; p < kPhaseCount; ++p) v[p] = static_cast<double>(e.ns[p]) * 1e-9;
    step_.push_back(v[static_cast<int>(Phase::kStep)]);
    c.rank_ns += e.ns[static_cast<int>(Phase::kStep)];
    const double own = OwnTime(v, e.present, model, static_cast<double>(e.gc_ns) * kNs);
    if (std::isnan(own)) continue;
    own_.push_back(own);
    if (own > max_own) {
      max_own = own;
      c.culprit = e.rank;
    }
  }
  if (!step_.empty()) last_median_step_seconds_ = MedianInPlace(step_);
  const bool synchronised =
      model.kind != BlockedModel::Kind::kNone && model.kind != BlockedModel::Kind::kUnknown;
  if (synchronised && own_.size() >= 2) {
    const double n = static_cast<double>(own_.size());
    c.straggler = ToNs(n * std::max(0.0, max_own - MedianInPlace(own_)));
  }
  return c;
}

void LostTime::Push(const StepCost& c) {
  window_.push_back(c);
  window_rank_ns_ += c.rank_ns;
  window_straggler_ += c.straggler;
  if (c.culprit < world_size_) window_by_rank_[c.culprit] += c.straggler;
  while (window_.size() > window_steps_) {
    const StepCost& old = window_.front();
    window_rank_ns_ -= old.rank_ns;
    window_straggler_ -= old.straggler;
    if (old.culprit < world_size_) window_by_rank_[old.culprit] -= old.straggler;
    window_.pop_front();
  }
}

void LostTime::AddStep(const StepWindow::Step& step, const BlockedModel& model, bool ends_hang) {
  StepCost c = CostOf(step, model);
  if (ends_hang) c.straggler = c.rank_ns = 0;
  total_rank_ns_ += c.rank_ns;
  total_straggler_ += c.straggler;
  if (c.culprit < world_size_) total_by_rank_[c.culprit] += c.straggler;
  Push(c);
}

void LostTime::AddWindowOnly(const StepWindow::Step& step, const BlockedModel& model) {
  Push(CostOf(step, model));
}

void LostTime::AddHang(double seconds, uint32_t ranks) {
  if (seconds <= 0) return;
  const int64_t ns = ToNs(seconds * ranks);
  total_hang_ += ns;
  total_rank_ns_ += ns;
}

LostTimeSummary LostTime::Summary() const {
  LostTimeSummary s;
  s.window_rank_seconds = static_cast<double>(window_rank_ns_) * kNs;
  s.window_straggler_rank_seconds = static_cast<double>(window_straggler_) * kNs;
  s.total_rank_seconds = static_cast<double>(total_rank_ns_) * kNs;
  s.total_straggler_rank_seconds = static_cast<double>(total_straggler_) * kNs;
  s.total_hang_rank_seconds = static_cast<double>(total_hang_) * kNs;
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (total_by_rank_[r] <= 0) continue;
    RankCost c{r, static_cast<double>(window_by_rank_[r]) * kNs,
               static_cast<double>(total_by_rank_[r]) * kNs};
    auto more = [](const RankCost& a, const RankCost& b) {
      return a.total_rank_seconds > b.total_rank_seconds;
    };
    s.top.insert(std::upper_bound(s.top.begin(), s.top.end(), c, more), c);
    if (s.top.size() > 3) s.top.pop_back();
  }
  return s;
}

state::v1::LostTimeState LostTime::ExportState() const {
  state::v1::LostTimeState st;
  st.set_rank_ns(total_rank_ns_);
  st.set_straggler_rank_ns(total_straggler_);
  st.set_hang_rank_ns(total_hang_);
  for (uint32_t r = 0; r < world_size_; ++r) {
    if (total_by_rank_[r] <= 0) continue;
    st.add_cost_ranks(r);
    st.add_cost_rank_ns(total_by_rank_[r]);
  }
  return st;
}

absl::Status LostTime::ImportState(const state::v1::LostTimeState& st) {
  if (st.cost_ranks_size() != st.cost_rank_ns_size()) {
    return absl::DataLossError("stored lost time: rank and cost lists differ in length");
  }
  for (int i = 0; i < st.cost_ranks_size(); ++i) {
    const uint32_t r = st.cost_ranks(i);
    const int64_t v = st.cost_rank_ns(i);
    if (r >= world_size_ || v < 0) {
      return absl::DataLossError("stored lost time: a rank's cost is out of range");
    }
    total_by_rank_[r] = v;
  }
  if (st.rank_ns() < 0 || st.straggler_rank_ns() < 0 || st.hang_rank_ns() < 0) {
    return absl::DataLossError("stored lost time: a negative total");
  }
  total_rank_ns_ = st.rank_ns();
  total_straggler_ = st.straggler_rank_ns();
  total_hang_ = st.hang_rank_ns();
  return absl::OkStatus();
}

}  // namespace rankwatch
