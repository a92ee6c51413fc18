#include "operators/step_time/onset.h"

#include <algorithm>

namespace rankwatch::step_time {

StepChangeFit FitStepChange(const std::vector<double>& values) {
  StepChangeFit fit;
  const size_t m = values.size();
  std::vector<double> prefix(m + 1, 0), prefix2(m + 1, 0);
  for (size_t i = 0; i < m; ++i) {
    prefix[i + 1] = prefix[i] + values[i];
    prefix2[i + 1] = prefix2[i] + values[i] * values[i];
  }
  fit.sum = prefix[m];
  if (m == 0) return fit;
  auto sse = [&](size_t a, size_t b) {  // of values[a, b) around their mean
    const double k = static_cast<double>(b - a), sum = prefix[b] - prefix[a];
    return prefix2[b] - prefix2[a] - sum * sum / k;
  };
  fit.sse_flat = fit.sse_step = sse(0, m);
  if (m < 8) return fit;
  for (size_t t = 2; t + 2 <= m; ++t) {
    const double e = sse(0, t) + sse(t, m);
    if (e < fit.sse_step) fit.sse_step = e, fit.split = t;
  }
  if (fit.split > 0) {
    fit.before = prefix[fit.split] / static_cast<double>(fit.split);
    fit.after = (prefix[m] - prefix[fit.split]) / static_cast<double>(m - fit.split);
  }
  return fit;
}

Onset StepChangeOnset(const std::vector<uint64_t>& steps, const std::vector<double>& values) {
  Onset onset;
  const size_t m = std::min(steps.size(), values.size());
  if (m == 0) return onset;
  onset.since_step = steps.front();
  const StepChangeFit fit =
      FitStepChange(std::vector<double>(values.begin(), values.begin() + static_cast<long>(m)));
  if (fit.lifts()) {
    onset.since_step = steps[fit.split];
    onset.known = true;
  }
  return onset;
}

Onset OnsetHold::Apply(const std::string& culprit, const Onset& shown, uint64_t first,
                       uint64_t last) {
  const bool continuous =
      !culprit_.empty() && culprit_ == culprit && (!absent_ || confirmed_through_ + 1 >= first);
  if (shown.known || !continuous) onset_ = shown;
  culprit_ = culprit;
  confirmed_through_ = continuous ? std::max(confirmed_through_, last) : last;
  absent_ = false;
  return onset_;
}

void OnsetHold::Export(state::v1::OnsetState* out) const {
  out->set_culprit(culprit_);
  out->set_since_step(onset_.since_step);
  out->set_known(onset_.known);
  out->set_confirmed_through_step(confirmed_through_);
  out->set_absent(absent_);
}

void OnsetHold::Import(const state::v1::OnsetState& in) {
  culprit_ = in.culprit();
  onset_ = {in.since_step(), in.known()};
  confirmed_through_ = in.confirmed_through_step();
  absent_ = in.absent();
}

}  // namespace rankwatch::step_time
