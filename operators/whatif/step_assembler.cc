#include "operators/whatif/step_assembler.h"

#include <algorithm>
#include <limits>

namespace rankwatch::whatif {
namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

uint32_t Size(uint32_t s) { return s == 0 ? 1 : s; }

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

bool IsFinding(const WhatIfVerdict& v) {
  return v.verdict != Verdict::kNone && v.verdict != Verdict::kBalanced &&
         !(v.verdict == Verdict::kUnattributed && v.severity == Severity::kInfo);
}

StepAssembler::StepAssembler(AssemblerOptions options)
    : options_(std::move(options)), hold_(options_.verdict.hold_steps) {}
StepAssembler::~StepAssembler() = default;

bool StepAssembler::Accepts(const v1::ParallelLayout& l) const {
  return Size(l.data_size()) == layout_.dp && Size(l.pipeline_size()) == layout_.pp &&
         l.data_rank() < layout_.dp && l.pipeline_rank() < layout_.pp;
}

void StepAssembler::Activate(const Layout& layout) {
  layout_ = layout;
  analyzer_ = std::make_unique<Analyzer>(layout_, options_.analyzer);
  stats_ = std::make_unique<OpStats>(layout_, options_.analyzer.window_steps);
  worker_ranks_.assign(layout_.workers(), {});
}

StepAssembler::Pending StepAssembler::NewPending(int64_t origin_unix_ns) const {
  Pending p;
  p.workers.assign(layout_.workers(), {});
  p.shift_ns.assign(layout_.workers(), 0);
  p.worker_tp.assign(layout_.workers(), kNoRank);
  p.gc.assign(layout_.workers(), {});
  p.origin_unix_ns = origin_unix_ns;
  return p;
}

void StepAssembler::Add(uint32_t rank, const v1::ParallelLayout& l, const v1::StepRecord& record) {
  if (analyzer_ == nullptr) {
    if (Size(l.pipeline_size()) < 2) return;  // flat data parallel: no what-if
    Activate({.dp = Size(l.data_size()),
              .pp = Size(l.pipeline_size()),
              .tp = Size(l.tensor_size()),
              .vpp = Size(l.virtual_stages())});
  }
  if (!Accepts(l)) return;
  const uint32_t worker = l.pipeline_rank() * layout_.dp + l.data_rank();
  std::vector<uint32_t>& ranks = worker_ranks_[worker];
  if (!std::binary_search(ranks.begin(), ranks.end(), rank)) {
    ranks.insert(std::upper_bound(ranks.begin(), ranks.end(), rank), rank);
  }
  if (record.ops_size() == 0) return;
  auto it = pending_.find(record.step());
  if (it == pending_.end()) {
    it = pending_.emplace(record.step(), NewPending(record.ops_origin_unix_ns())).first;
    while (pending_.size() > options_.max_pending_steps) pending_.erase(pending_.begin());
    if (pending_.find(record.step()) == pending_.end()) return;  // the oldest: dropped
  }
  Pending& p = it->second;
  const int64_t shift_ns = record.ops_origin_unix_ns() - p.origin_unix_ns;
  auto raw_of = [](const v1::OpRecord& r) {
    RawOp op;
    op.kind = static_cast<uint8_t>(r.type() < kOpKindCount ? r.type() : 0);
    op.microbatch = static_cast<uint16_t>(std::min<uint32_t>(r.microbatch(), 0xffff));
    op.chunk = static_cast<uint16_t>(std::min<uint32_t>(r.model_chunk(), 0xffff));
    op.start_offset_us = r.start_offset_us();
    op.duration_us = r.duration_us();
    return op;
  };
  for (const v1::OpRecord& r : record.ops()) {
    if (r.type() == v1::OP_GC) p.gc[worker].push_back({shift_ns, raw_of(r)});
  }
  if (l.tensor_rank() >= p.worker_tp[worker]) return;  // a lower tensor rank holds it
  if (p.worker_tp[worker] == kNoRank) ++p.filled;
  p.worker_tp[worker] = l.tensor_rank();
  p.shift_ns[worker] = shift_ns;
  std::vector<RawOp>& ops = p.workers[worker];
  ops.clear();
  ops.reserve(record.ops_size());
  for (const v1::OpRecord& r : record.ops()) {
    const RawOp op = raw_of(r);
    const auto kind = static_cast<OpKind>(op.kind);
    if (kind != OpKind::kUnspecified && kind != OpKind::kGc) ops.push_back(op);
  }
}

StepOps StepAssembler::Assemble(uint64_t step, const Pending& p) const {
  auto op_of = [](const RawOp& r, int64_t shift_ns) {
    Op op;
    op.kind = static_cast<OpKind>(r.kind);
    op.microbatch = r.microbatch;
    op.chunk = r.chunk;
    op.start_us = static_cast<double>(shift_ns) / 1e3 + static_cast<double>(r.start_offset_us);
    op.duration_us = static_cast<double>(r.duration_us);
    return op;
  };
  StepOps ops;
  ops.step = step;
  ops.workers.resize(p.workers.size());
  for (size_t w = 0; w < p.workers.size(); ++w) {
    ops.workers[w].reserve(p.workers[w].size() + p.gc[w].size());
    for (const RawOp& r : p.workers[w]) ops.workers[w].push_back(op_of(r, p.shift_ns[w]));
    std::vector<Op> gc;
    gc.reserve(p.gc[w].size());
    for (const RawGc& g : p.gc[w]) gc.push_back(op_of(g.op, g.shift_ns));
    MergeGc(std::move(gc), &ops.workers[w]);
  }
  return ops;
}

absl::Status StepAssembler::Analyse(const StepOps& ops) {
  absl::Status s = analyzer_->AddStep(ops);
  if (!s.ok()) return s;
  stats_->Add(ops);
  window_steps_.push_back(ops.step);
  const size_t window = std::max<uint32_t>(1, options_.analyzer.window_steps);
  if (window_steps_.size() > window) {
    window_steps_.erase(
        window_steps_.begin(),
        window_steps_.begin() + static_cast<std::ptrdiff_t>(window_steps_.size() - window));
  }
  return absl::OkStatus();
}

bool StepAssembler::Aligned(uint64_t step, state::v1::WhatIfStepOps* stored) {
  if (analyzer_ == nullptr) return false;
  bool analysed = false;
  auto it = pending_.find(step);
  if (it == pending_.end()) {
    ++skipped_;
    last_error_ = "step " + std::to_string(step) + ": no rank sent ops";
  } else if (it->second.filled < layout_.workers()) {
    ++skipped_;
    last_error_ = "step " + std::to_string(step) + ": " +
                  std::to_string(layout_.workers() - it->second.filled) + " of " +
                  std::to_string(layout_.workers()) + " workers sent no ops";
  } else if (absl::Status s = Analyse(Assemble(step, it->second)); s.ok()) {
    ++analysed_;
    analysed = true;
    if (stored != nullptr) Encode(step, it->second, /*pending=*/false, stored);
  } else {
    ++skipped_;
    last_error_ = "step " + std::to_string(step) + ": " + std::string(s.message());
  }
  pending_.erase(pending_.begin(), pending_.upper_bound(step));
  return analysed;
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
  if (IsFinding(s->verdict) && s->result.steps > 0) {
    // Where the per-step slowdown stepped up, held while the same finding holds.
    const WhatIfVerdict& v = s->verdict;
    const std::string finding = std::string(VerdictName(v.verdict)) + ":" +
                                std::to_string(v.data_rank) + "/" + std::to_string(v.stage) + "/" +
                                v.op_group;
    std::vector<uint64_t> steps;
    std::vector<double> excess;
    for (const StepResult& r : s->result.per_step) {
      steps.push_back(r.step);
      excess.push_back(r.slowdown - 1);
    }
    const step_time::Onset onset = onset_.Apply(finding, step_time::StepChangeOnset(steps, excess),
                                                s->result.first_step, s->result.last_step);
    s->since_step = onset.since_step;
    s->onset_known = onset.known;
  } else if (s->verdict.verdict != Verdict::kNone) {
    onset_.Absent();  // judged, and nothing found: the finding's episode may have ended
  }
  analysed_at_evaluation_ = analysed_;
  snapshot_ = std::move(s);
}

// ---- Checkpoints ----

namespace {

void ExportVerdict(const WhatIfVerdict& v, state::v1::WhatIfVerdictState* out) {
  out->set_verdict(static_cast<uint32_t>(v.verdict));
  out->set_severity(static_cast<uint32_t>(v.severity));
  out->set_slowdown(v.slowdown);
  out->set_lost_rank_seconds(v.lost_rank_seconds);
  out->set_data_rank(v.data_rank);
  out->set_stage(v.stage);
  for (uint32_t r : v.ranks) out->add_ranks(r);
  out->set_op_group(v.op_group);
  out->set_explained(v.explained);
  out->set_move_fraction(v.move_fraction);
  out->set_moving_replicas(v.moving_replicas);
  out->set_note(v.note);
  out->set_next_step(v.next_step);
}

// Values out of range (a damaged or newer state) read as no verdict, info.
WhatIfVerdict ImportVerdict(const state::v1::WhatIfVerdictState& in) {
  WhatIfVerdict v;
  if (in.verdict() < static_cast<uint32_t>(kVerdictCount)) {
    v.verdict = static_cast<Verdict>(in.verdict());
  }
  if (in.severity() <= static_cast<uint32_t>(Severity::kCrit)) {
    v.severity = static_cast<Severity>(in.severity());
  }
  v.slowdown = in.slowdown();
  v.lost_rank_seconds = in.lost_rank_seconds();
  v.data_rank = in.data_rank();
  v.stage = in.stage();
  v.ranks.assign(in.ranks().begin(), in.ranks().end());
  v.op_group = in.op_group();
  v.explained = in.explained();
  v.move_fraction = in.move_fraction();
  v.moving_replicas = in.moving_replicas();
  v.note = in.note();
  v.next_step = in.next_step();
  return v;
}

}  // namespace

void StepAssembler::Encode(uint64_t step, const Pending& p, bool pending,
                           state::v1::WhatIfStepOps* out) const {
  out->set_step(step);
  bool any_mb = false, any_chunk = false, any_gc = false, any_gc_mb = false, any_gc_chunk = false;
  size_t n = 0;
  for (size_t w = 0; w < p.workers.size(); ++w) {
    n += p.workers[w].size();
    for (const RawOp& r : p.workers[w]) {
      any_mb |= r.microbatch != 0;
      any_chunk |= r.chunk != 0;
    }
    any_gc |= !p.gc[w].empty();
    for (const RawGc& g : p.gc[w]) {
      any_gc_mb |= g.op.microbatch != 0;
      any_gc_chunk |= g.op.chunk != 0;
    }
  }
  std::string* kinds = out->mutable_kind();
  kinds->reserve(n);
  for (size_t w = 0; w < p.workers.size(); ++w) {
    out->add_shift_ns(p.shift_ns[w]);
    out->add_op_count(static_cast<uint32_t>(p.workers[w].size()));
    uint64_t previous = 0;
    for (const RawOp& r : p.workers[w]) {
      kinds->push_back(static_cast<char>(r.kind));
      if (any_mb) out->add_microbatch(r.microbatch);
      if (any_chunk) out->add_chunk(r.chunk);
      out->add_start_us_delta(static_cast<int64_t>(r.start_offset_us - previous));
      previous = r.start_offset_us;
      out->add_duration_us(r.duration_us);
    }
    if (any_gc) out->add_gc_count(static_cast<uint32_t>(p.gc[w].size()));
    for (const RawGc& g : p.gc[w]) {
      out->add_gc_shift_ns(g.shift_ns);
      out->add_gc_start_us(g.op.start_offset_us);
      out->add_gc_duration_us(g.op.duration_us);
      if (any_gc_mb) out->add_gc_microbatch(g.op.microbatch);
      if (any_gc_chunk) out->add_gc_chunk(g.op.chunk);
    }
  }
  if (pending) {
    out->set_origin_unix_ns(p.origin_unix_ns);
    for (uint32_t tp : p.worker_tp) out->add_worker_tp_plus_one(tp == kNoRank ? 0 : tp + 1);
  }
}

absl::Status StepAssembler::Decode(const state::v1::WhatIfStepOps& in, bool pending,
                                   Pending* p) const {
  const auto bad = [&](const char* what) {
    return absl::DataLossError("stored what-if ops of step " + std::to_string(in.step()) + ": " +
                               what);
  };
  const size_t workers = layout_.workers();
  if (static_cast<size_t>(in.shift_ns_size()) != workers ||
      static_cast<size_t>(in.op_count_size()) != workers) {
    return bad("not one entry per worker");
  }
  size_t n = 0, gcs = 0;
  for (uint32_t c : in.op_count()) n += c;
  if (in.gc_count_size() != 0 && static_cast<size_t>(in.gc_count_size()) != workers) {
    return bad("GC counts not one per worker");
  }
  for (uint32_t c : in.gc_count()) gcs += c;
  const auto fits = [](int size, size_t want) {
    return size == 0 || static_cast<size_t>(size) == want;
  };
  if (in.kind().size() != n || static_cast<size_t>(in.start_us_delta_size()) != n ||
      static_cast<size_t>(in.duration_us_size()) != n || !fits(in.microbatch_size(), n) ||
      !fits(in.chunk_size(), n)) {
    return bad("columns of different lengths");
  }
  if (static_cast<size_t>(in.gc_shift_ns_size()) != gcs ||
      static_cast<size_t>(in.gc_start_us_size()) != gcs ||
      static_cast<size_t>(in.gc_duration_us_size()) != gcs || !fits(in.gc_microbatch_size(), gcs) ||
      !fits(in.gc_chunk_size(), gcs)) {
    return bad("GC columns of different lengths");
  }
  if (pending && static_cast<size_t>(in.worker_tp_plus_one_size()) != workers) {
    return bad("no tensor rank per worker");
  }
  *p = NewPending(in.origin_unix_ns());
  size_t i = 0, g = 0;
  for (size_t w = 0; w < workers; ++w) {
    p->shift_ns[w] = in.shift_ns(static_cast<int>(w));
    uint64_t start = 0;
    for (uint32_t k = 0; k < in.op_count(static_cast<int>(w)); ++k, ++i) {
      const int at = static_cast<int>(i);
      RawOp r;
      r.kind = static_cast<uint8_t>(in.kind()[i]);
      if (r.kind >= kOpKindCount) return bad("an unknown op kind");
      r.microbatch = static_cast<uint16_t>(
          std::min<uint32_t>(in.microbatch_size() ? in.microbatch(at) : 0, 0xffff));
      r.chunk =
          static_cast<uint16_t>(std::min<uint32_t>(in.chunk_size() ? in.chunk(at) : 0, 0xffff));
      start += static_cast<uint64_t>(in.start_us_delta(at));
      r.start_offset_us = start;
      r.duration_us = in.duration_us(at);
      p->workers[w].push_back(r);
    }
    const uint32_t worker_gcs = in.gc_count_size() ? in.gc_count(static_cast<int>(w)) : 0;
    for (uint32_t k = 0; k < worker_gcs; ++k, ++g) {
      const int at = static_cast<int>(g);
      RawGc r;
      r.shift_ns = in.gc_shift_ns(at);
      r.op.kind = static_cast<uint8_t>(OpKind::kGc);
      r.op.microbatch = static_cast<uint16_t>(
          std::min<uint32_t>(in.gc_microbatch_size() ? in.gc_microbatch(at) : 0, 0xffff));
      r.op.chunk = static_cast<uint16_t>(
          std::min<uint32_t>(in.gc_chunk_size() ? in.gc_chunk(at) : 0, 0xffff));
      r.op.start_offset_us = in.gc_start_us(at);
      r.op.duration_us = in.gc_duration_us(at);
      p->gc[w].push_back(r);
    }
    if (pending) {
      const uint32_t tp = in.worker_tp_plus_one(static_cast<int>(w));
      p->worker_tp[w] = tp == 0 ? kNoRank : tp - 1;
      if (tp != 0) ++p->filled;
    } else {
      p->worker_tp[w] = 0;
      ++p->filled;
    }
  }
  return absl::OkStatus();
}

bool StepAssembler::ExportState(state::v1::WhatIfState* out) const {
  if (analyzer_ == nullptr) return false;
  out->set_data_parallel(layout_.dp);
  out->set_pipeline(layout_.pp);
  out->set_tensor(layout_.tp);
  out->set_virtual_stages(layout_.vpp);
  for (const std::vector<uint32_t>& ranks : worker_ranks_) {
    out->add_worker_rank_counts(static_cast<uint32_t>(ranks.size()));
    for (uint32_t r : ranks) out->add_worker_ranks(r);
  }
  out->set_analysed_steps(analysed_);
  out->set_skipped_steps(skipped_);
  out->set_last_error(last_error_);
  for (const auto& [step, p] : pending_) Encode(step, p, /*pending=*/true, out->add_pending());
  onset_.Export(out->mutable_onset());
  state::v1::VerdictHoldState* hold = out->mutable_hold();
  if (hold_.held() != nullptr) ExportVerdict(*hold_.held(), hold->mutable_held());
  ExportVerdict(hold_.candidate(), hold->mutable_candidate());
  hold->set_candidate_since(hold_.candidate_since());
  // The analyzer's cached decompositions (only where the window was decomposed).
  const std::vector<StepCache> cache = analyzer_->ExportCache();
  const bool any =
      std::any_of(cache.begin(), cache.end(), [](const StepCache& c) { return c.cached; });
  const std::vector<double>* previous = nullptr;
  for (size_t i = 0; any && i < cache.size(); ++i) {
    const StepCache& c = cache[i];
    state::v1::WhatIfStepCache* o = out->add_cache();
    o->set_cached(c.cached);
    if (!c.cached) continue;
    if (previous == nullptr || *previous != c.typical) {
      o->mutable_typical()->Add(c.typical.begin(), c.typical.end());
    }
    previous = &c.typical;
    o->mutable_dp_t()->Add(c.dp_t.begin(), c.dp_t.end());
    o->mutable_stage_t()->Add(c.stage_t.begin(), c.stage_t.end());
    o->mutable_group_t()->Add(c.group_t.begin(), c.group_t.end());
    for (const auto& [w, t] : c.worker_t) {
      o->add_worker(w);
      o->add_worker_t(t);
    }
    for (const auto& [stage, t] : c.stage_rem_t) {
      o->add_stage_rem(stage);
      o->add_stage_rem_t(t);
    }
    o->mutable_rem_workers()->Add(c.rem_workers.begin(), c.rem_workers.end());
    o->set_rem_workers_t(c.rem_workers_t);
  }
  return true;
}

uint64_t StepAssembler::window_first_step() const {
  return window_steps_.empty() ? 0 : window_steps_.front();
}

absl::Status StepAssembler::Restore(const state::v1::WhatIfState& state,
                                    const std::vector<state::v1::WhatIfStepOps>& steps,
                                    uint32_t world_size) {
  const Layout layout{.dp = Size(state.data_parallel()),
                      .pp = Size(state.pipeline()),
                      .tp = Size(state.tensor()),
                      .vpp = Size(state.virtual_stages())};
  const uint64_t workers = uint64_t{layout.dp} * layout.pp;
  if (layout.pp < 2 || layout.dp > world_size || layout.pp > world_size || layout.tp > world_size ||
      layout.vpp > 0xffff || workers * layout.tp > world_size ||
      static_cast<uint64_t>(state.worker_rank_counts_size()) != workers) {
    return absl::DataLossError("stored what-if state does not fit the job's layout");
  }
  Activate(layout);
  int at = 0;
  for (uint64_t w = 0; w < workers; ++w) {
    const uint32_t count = state.worker_rank_counts(static_cast<int>(w));
    if (count > static_cast<uint32_t>(state.worker_ranks_size() - at)) {
      return absl::DataLossError("stored what-if worker ranks are incomplete");
    }
    for (uint32_t k = 0; k < count; ++k) {
      const uint32_t r = state.worker_ranks(at++);
      if (r >= world_size) return absl::DataLossError("stored what-if rank out of range");
      worker_ranks_[w].push_back(r);
    }
    std::sort(worker_ranks_[w].begin(), worker_ranks_[w].end());
  }
  Pending p;
  for (const state::v1::WhatIfStepOps& stored : steps) {
    if (stored.world_size() != 0 && stored.world_size() != world_size) continue;
    if (absl::Status s = Decode(stored, /*pending=*/false, &p); !s.ok()) return s;
    // A step the analyzer took before takes it again; one it rejects now is left out.
    Analyse(Assemble(stored.step(), p)).IgnoreError();
  }
  for (const state::v1::WhatIfStepOps& stored : state.pending()) {
    if (absl::Status s = Decode(stored, /*pending=*/true, &p); !s.ok()) return s;
    pending_[stored.step()] = std::move(p);
  }
  analysed_ = state.analysed_steps();
  skipped_ = state.skipped_steps();
  last_error_ = state.last_error();
  onset_.Import(state.onset());
  // The analyzer's cached decompositions; without them (or when they do not fit) Window()
  // recomputes them, within the recompute tolerance of the original's.
  if (state.cache_size() > 0) {
    std::vector<StepCache> cache;
    bool fits = true;
    for (const state::v1::WhatIfStepCache& o : state.cache()) {
      StepCache& c = cache.emplace_back();
      c.cached = o.cached();
      if (!c.cached) continue;
      if (o.typical_size() > 0) {
        c.typical.assign(o.typical().begin(), o.typical().end());
      } else {
        // The previous cached step's (the encoder writes them out when they change).
        for (size_t i = cache.size() - 1; i-- > 0;) {
          if (cache[i].cached) {
            c.typical = cache[i].typical;
            break;
          }
        }
      }
      c.dp_t.assign(o.dp_t().begin(), o.dp_t().end());
      c.stage_t.assign(o.stage_t().begin(), o.stage_t().end());
      c.group_t.assign(o.group_t().begin(), o.group_t().end());
      fits = fits && o.worker_size() == o.worker_t_size() &&
             o.stage_rem_size() == o.stage_rem_t_size();
      for (int i = 0; fits && i < o.worker_size(); ++i) {
        c.worker_t.emplace_back(o.worker(i), o.worker_t(i));
      }
      for (int i = 0; fits && i < o.stage_rem_size(); ++i) {
        c.stage_rem_t.emplace_back(o.stage_rem(i), o.stage_rem_t(i));
      }
      c.rem_workers.assign(o.rem_workers().begin(), o.rem_workers().end());
      c.rem_workers_t = o.rem_workers_t();
    }
    if (fits) analyzer_->ImportCache(cache).IgnoreError();
  }
  if (state.has_hold()) {
    const state::v1::VerdictHoldState& hold = state.hold();
    const WhatIfVerdict held = ImportVerdict(hold.held());
    hold_.Restore(hold.has_held() ? &held : nullptr, ImportVerdict(hold.candidate()),
                  hold.candidate_since());
  }
  // The window as the checkpointed pipeline last evaluated it.
  snapshot_ = nullptr;
  Evaluate();
  return absl::OkStatus();
}

}  // namespace rankwatch::whatif
