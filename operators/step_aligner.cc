#include "operators/step_aligner.h"

#include <cassert>

#include "operators/step_codec.h"

namespace rankwatch {

StepAligner::StepAligner(uint32_t world_size, StepAlignerOptions options)
    : world_size_(world_size), options_(options), last_step_by_rank_(world_size, -1) {
  assert(world_size > 0);
}

AlignOutcome StepAligner::Add(const StepSample& sample, TimePoint now,
                              std::vector<AlignedStep>* closed) {
  if (sample.rank >= world_size_) return AlignOutcome::kRankOutOfRange;
  int64_t& last_of_rank = last_step_by_rank_[sample.rank];
  const auto step = static_cast<int64_t>(sample.step);
  if (has_closed_ && sample.step <= last_closed_step_) {
    return step <= last_of_rank ? AlignOutcome::kDuplicate : AlignOutcome::kLate;
  }

  // Records of one batch are consecutive steps of one rank: try the last slot and its
  // successor before searching the map.
  auto it = hint_;
  if (it == pending_.end() || it->first != sample.step) {
    if (it != pending_.end()) ++it;
    if (it == pending_.end() || it->first != sample.step) {
      it = pending_.try_emplace(sample.step).first;
    }
  }
  hint_ = it;
  Pending& slot = it->second;
  if (slot.by_rank.empty()) {
    slot.by_rank.resize(world_size_);
    slot.seen.assign(world_size_, false);
    slot.first_seen = now;
  }
  if (slot.seen[sample.rank]) return AlignOutcome::kDuplicate;
  slot.seen[sample.rank] = true;
  slot.by_rank[sample.rank] = sample;
  ++slot.count;
  if (last_of_rank < 0) ++ranks_seen_;
  if (step > last_of_rank) last_of_rank = step;

  Drain(now, closed);
  return AlignOutcome::kAccepted;
}

void StepAligner::Expire(TimePoint now, std::vector<AlignedStep>* closed) { Drain(now, closed); }

void StepAligner::Delay(Duration by) {
  for (auto& [step, p] : pending_) p.first_seen += by;
}

void StepAligner::Drain(TimePoint now, std::vector<AlignedStep>* closed) {
  while (!pending_.empty()) {
    const Pending& front = pending_.begin()->second;
    if (front.count == world_size_) {
      CloseFront(/*timed_out=*/false, closed);
    } else if (now - front.first_seen >= options_.align_timeout ||
               pending_.size() > options_.max_pending_steps) {
      CloseFront(/*timed_out=*/true, closed);
    } else {
      break;
    }
  }
}

void StepAligner::CloseFront(bool timed_out, std::vector<AlignedStep>* closed) {
  hint_ = pending_.end();  // the hint may point at the node being extracted
  auto node = pending_.extract(pending_.begin());
  Pending& p = node.mapped();
  AlignedStep out;
  out.step = node.key();
  out.world_size = world_size_;
  out.timed_out = timed_out;
  if (p.count == world_size_) {
    out.samples = std::move(p.by_rank);
  } else {
    out.samples.reserve(p.count);
    for (uint32_t r = 0; r < world_size_; ++r) {
      if (p.seen[r]) out.samples.push_back(p.by_rank[r]);
    }
  }
  has_closed_ = true;
  last_closed_step_ = out.step;
  closed->push_back(std::move(out));
}

state::v1::AlignerState StepAligner::ExportState(TimePoint now, int64_t wall_now_unix_ns) const {
  state::v1::AlignerState out;
  out.set_world_size(world_size_);
  out.set_has_closed(has_closed_);
  out.set_last_closed_step(last_closed_step_);
  for (int64_t s : last_step_by_rank_) out.add_last_step_by_rank(s);
  for (const auto& [step, p] : pending_) {
    AlignedStep partial;
    partial.step = step;
    partial.world_size = world_size_;
    for (uint32_t r = 0; r < world_size_; ++r) {
      if (p.seen[r]) partial.samples.push_back(p.by_rank[r]);
    }
    state::v1::PendingStep* ps = out.add_pending();
    *ps->mutable_samples() = EncodeStep(partial);
    ps->set_first_seen_unix_ns(wall_now_unix_ns - (now - p.first_seen).count());
  }
  return out;
}

absl::StatusOr<std::unique_ptr<StepAligner>> StepAligner::FromState(
    const state::v1::AlignerState& in, StepAlignerOptions options, TimePoint now,
    int64_t wall_now_unix_ns) {
  if (in.world_size() == 0 || in.last_step_by_rank_size() != static_cast<int>(in.world_size())) {
    return absl::DataLossError("stored aligner state is inconsistent");
  }
  auto a = std::make_unique<StepAligner>(in.world_size(), options);
  a->has_closed_ = in.has_closed();
  a->last_closed_step_ = in.last_closed_step();
  for (uint32_t r = 0; r < in.world_size(); ++r) {
    a->last_step_by_rank_[r] = in.last_step_by_rank(r);
    if (in.last_step_by_rank(r) >= 0) ++a->ranks_seen_;
  }
  for (const state::v1::PendingStep& ps : in.pending()) {
    AlignedStep partial;
    if (absl::Status s = DecodeStep(ps.samples(), &partial); !s.ok()) return s;
    if (partial.world_size != in.world_size()) {
      return absl::DataLossError("stored pending step of another world size");
    }
    Pending& p = a->pending_[partial.step];
    p.by_rank.resize(in.world_size());
    p.seen.assign(in.world_size(), false);
    p.first_seen = now - Duration(wall_now_unix_ns - ps.first_seen_unix_ns());
    for (StepSample& sample : partial.samples) {
      p.seen[sample.rank] = true;
      p.by_rank[sample.rank] = sample;
      ++p.count;
    }
  }
  a->hint_ = a->pending_.end();
  return a;
}

}  // namespace rankwatch
