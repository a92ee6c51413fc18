#include "operators/whatif/step_assembler.h"

#include <algorithm>
#include <limits>

namespace rankwatch::whatif {
namespace {

uint32_t Size(uint32_t s) { return s == 0 ? 1 : s; }

}  // namespace

StepAssembler::StepAssembler(AssemblerOptions options)
    : options_(std::move(options)), hold_(options_.verdict.hold_steps) {}
StepAssembler::~StepAssembler() = default;

bool StepAssembler::Accepts(const v1::ParallelLayout& l) const {
  return Size(l.data_size()) == layout_.dp && Size(l.pipeline_size()) == layout_.pp &&
         l.data_rank() < layout_.dp && l.pipeline_rank() < layout_.pp;
}

void StepAssembler::Add(uint32_t rank, const v1::ParallelLayout& l, const v1::StepRecord& record) {
  if (analyzer_ == nullptr) {
    if (Size(l.pipeline_size()) < 2) return;  // flat data parallel: no what-if
    layout_.dp = Size(l.data_size());
    layout_.pp = Size(l.pipeline_size());
    layout_.tp = Size(l.tensor_size());
    layout_.vpp = Size(l.virtual_stages());
    analyzer_ = std::make_unique<Analyzer>(layout_, options_.analyzer);
    stats_ = std::make_unique<OpStats>(layout_, options_.analyzer.window_steps);
    worker_ranks_.assign(layout_.workers(), {});
  }
  if (!Accepts(l)) return;
  const uint32_t worker = l.pipeline_rank() * layout_.dp + l.data_rank();
  std::vector<uint32_t>& ranks = worker_ranks_[worker];
  if (!std::binary_search(ranks.begin(), ranks.end(), rank)) {
    ranks.insert(std::upper_bound(ranks.begin(), ranks.end(), rank), rank);
  }
  if (record.ops_size() == 0) return;
  auto [it, inserted] = pending_.try_emplace(record.step());
  Pending& p = it->second;
  if (inserted) {
    p.workers.assign(layout_.workers(), {});
    p.worker_tp.assign(layout_.workers(), std::numeric_limits<uint32_t>::max());
    p.gc.assign(layout_.workers(), {});
    p.origin_unix_ns = record.ops_origin_unix_ns();
    while (pending_.size() > options_.max_pending_steps) pending_.erase(pending_.begin());
    if (pending_.find(record.step()) == pending_.end()) return;  // the oldest: dropped
  }
  const double shift_us = static_cast<double>(record.ops_origin_unix_ns() - p.origin_unix_ns) / 1e3;
  auto op_of = [&](const v1::OpRecord& r) {
    Op op;
    op.kind = static_cast<OpKind>(r.type() < kOpKindCount ? r.type() : 0);
    op.microbatch = static_cast<uint16_t>(std::min<uint32_t>(r.microbatch(), 0xffff));
    op.chunk = static_cast<uint16_t>(std::min<uint32_t>(r.model_chunk(), 0xffff));
    op.start_us = shift_us + static_cast<double>(r.start_offset_us());
    op.duration_us = static_cast<double>(r.duration_us());
    return op;
  };
  for (const v1::OpRecord& r : record.ops()) {
    if (r.type() == v1::OP_GC) p.gc[worker].push_back(op_of(r));
  }
  if (l.tensor_rank() >= p.worker_tp[worker]) return;  // a lower tensor rank holds it
  if (p.worker_tp[worker] == std::numeric_limits<uint32_t>::max()) ++p.filled;
  p.worker_tp[worker] = l.tensor_rank();
  std::vector<Op>& ops = p.workers[worker];
  ops.clear();
  ops.reserve(record.ops_size());
  for (const v1::OpRecord& r : record.ops()) {
    const Op op = op_of(r);
    if (op.kind != OpKind::kUnspecified && op.kind != OpKind::kGc) ops.push_back(op);
  }
}

namespace {

// Adds a worker's GC pauses (from all its tensor ranks; overlapping ones merged) to its ops and
// sorts them by start.
void MergeGc(std::vector<Op> gc, std::vector<Op>* ops) {
  std::sort(gc.begin(), gc.end(), [](const Op& a, const Op& b) { return a.start_us < b.start_us; });
  Op* last = nullptr;
  std::vector<Op> merged;
  for (const Op& g : gc) {
    if (last != nullptr && g.start_us <= last->start_us + last->duration_us) {
      last->duration_us = std::max(last->duration_us, g.start_us + g.duration_us - last->start_us);
      continue;
    }
    merged.push_back(g);
    last = &merged.back();
  }
  ops->insert(ops->end(), merged.begin(), merged.end());
  std::stable_sort(ops->begin(), ops->end(),
                   [](const Op& a, const Op& b) { return a.start_us < b.start_us; });
}

}  // namespace

void StepAssembler::Aligned(uint64_t step) {
  if (analyzer_ == nullptr) return;
  auto it = pending_.find(step);
  if (it == pending_.end()) {
    ++skipped_;
    last_error_ = "step " + std::to_string(step) + ": no rank sent ops";
  } else if (it->second.filled < layout_.workers()) {
    ++skipped_;
    last_error_ = "step " + std::to_string(step) + ": " +
                  std::to_string(layout_.workers() - it->second.filled) + " of " +
                  std::to_string(layout_.workers()) + " workers sent no ops";
  } else {
    StepOps ops;
    ops.step = step;
    ops.workers = std::move(it->second.workers);
    for (size_t w = 0; w < ops.workers.size(); ++w)
      MergeGc(std::move(it->second.gc[w]), &ops.workers[w]);
    if (absl::Status s = analyzer_->AddStep(ops); s.ok()) {
      stats_->Add(ops);
      ++analysed_;
    } else {
      ++skipped_;
      last_error_ = "step " + std::to_string(step) + ": " + std::string(s.message());
    }
  }
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
}

void StepAssembler::Evaluate() {
  if (analyzer_ == nullptr) return;
  if (snapshot_ != nullptr && analysed_ == analysed_at_evaluation_ &&
      snapshot_->skipped_steps == skipped_) {
    return;
  }
  auto s = std::make_shared<WhatIfSnapshot>();
  s->layout = layout_;
  if (analyzer_->steps() > 0) s->result = analyzer_->Window();
  // Judged with the held verdict's exit thresholds, then held (hysteresis, minimum duration).
  s->verdict = hold_.Update(
      JudgeWhatIf(s->result, layout_, worker_ranks_, *stats_, options_.verdict, hold_.held()),
      analysed_);
  s->worker_ranks = worker_ranks_;
  s->analysed_steps = analysed_;
  s->skipped_steps = skipped_;
  s->last_error = last_error_;
  analysed_at_evaluation_ = analysed_;
  snapshot_ = std::move(s);
}

}  // namespace rankwatch::whatif
