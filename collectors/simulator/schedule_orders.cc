#include "collectors/simulator/schedule_orders.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <utility>

namespace rankwatch {
namespace {

constexpr std::array<std::pair<PipelineScheduleKind, std::string_view>, 5> kNames = {{
    {PipelineScheduleKind::k1F1B, "1f1b"},
    {PipelineScheduleKind::kInterleaved1F1B, "interleaved"},
    {PipelineScheduleKind::kZeroBubble, "zb"},
    {PipelineScheduleKind::kZbv, "zbv"},
    {PipelineScheduleKind::kDualPipeV, "dualpipev"},
}};

// Per model chunk: how many forwards, backwards (input or full) and weight backwards it ran.
struct Counters {
  std::vector<uint32_t> forward, backward, weight;
  explicit Counters(uint32_t chunks) : forward(chunks), backward(chunks), weight(chunks) {}
};

// Interleaved 1F1B and ZB1P: warm-up forwards, then one forward and one backward at a time,
// then the remaining backwards. Chunks take turns in rounds of `per_round` microbatches,
// forwards from the first chunk up, backwards from the last down. ZB1P splits each backward
// and runs a weight backward after each backward once the stage is `stage` backwards in
// (the deeper the stage, the later), the rest at the end; its warm-up grows by one forward
// per stage from the last, interleaved 1F1B's by two.
std::vector<ComputeAction> LoopedOneForwardOneBackward(bool zero_bubble, uint32_t pp,
                                                       uint32_t chunks, uint32_t microbatches,
                                                       uint32_t stage) {
  const uint32_t rounds = std::max(1u, microbatches / pp);
  const uint32_t per_round = microbatches / rounds;
  const uint32_t total = chunks * microbatches;
  const uint32_t warmup =
      std::min((chunks - 1) * per_round + (zero_bubble ? 1 : 2) * (pp - 1 - stage), total);
  auto forward_chunk = [&](uint32_t op) { return (op / per_round) % chunks; };
  auto backward_chunk = [&](uint32_t op) {
    return chunks - 1 - ((op - warmup) / per_round) % chunks;
  };
  Counters n(chunks);
  std::vector<ComputeAction> out;
  std::deque<uint32_t> weights_due;  // chunks of the backwards whose weight part is pending
  const uint32_t lag = zero_bubble ? stage : 0;
  auto forward = [&](uint32_t op) {
    const uint32_t c = forward_chunk(op);
    out.push_back({ComputeWork::kForward, c, n.forward[c]++});
  };
  auto backward = [&](uint32_t op) {
    const uint32_t c = backward_chunk(op);
    out.push_back(
        {zero_bubble ? ComputeWork::kBackwardInput : ComputeWork::kBackward, c, n.backward[c]++});
    if (!zero_bubble) return;
    weights_due.push_back(c);
    if (op - warmup >= lag) {
      const uint32_t w = weights_due.front();
      weights_due.pop_front();
      out.push_back({ComputeWork::kBackwardWeight, w, n.weight[w]++});
    }
  };
  for (uint32_t op = 0; op < warmup; ++op) forward(op);
  for (uint32_t op = warmup; op < total; ++op) {
    forward(op);
    backward(op);
  }
  for (uint32_t op = total; op < total + warmup; ++op) backward(op);
  for (const uint32_t w : weights_due)
    out.push_back({ComputeWork::kBackwardWeight, w, n.weight[w]++});
  return out;
}

// ZB-V: chunk 0 forwards down the V, then chunk 1's come back, each chunk's backward split in
// two with the weight part right after (the tail defers them to fill the cool-down). Needs
// 2 * pp - 1 microbatches to fill the V; with fewer, the extra ones are dropped.
std::vector<ComputeAction> Zbv(uint32_t pp, uint32_t microbatches, uint32_t stage) {
  const uint32_t fill = std::max(2 * pp - 1, microbatches);
  uint32_t f0 = 0, f1 = 0, b0 = 0, b1 = 0;
  std::vector<ComputeAction> out;
  auto add = [&](ComputeWork work, uint32_t chunk, uint32_t mb) {
    if (mb < microbatches) out.push_back({work, chunk, mb});
  };
  for (uint32_t i = 0; i < 2 * (pp - stage) - 1; ++i) add(ComputeWork::kForward, 0, f0++);
  for (uint32_t i = 0; i < stage; ++i) {
    add(ComputeWork::kForward, 1, f1++);
    add(ComputeWork::kForward, 0, f0++);
  }
  for (uint32_t i = 0; i < pp - stage; ++i) {
    add(ComputeWork::kForward, 1, f1++);
    add(ComputeWork::kBackwardInput, 1, b1);
    add(ComputeWork::kBackwardWeight, 1, b1++);
  }
  while (f1 < f0 || f0 < fill) {
    if (f0 < fill) add(ComputeWork::kForward, 0, f0++);
    add(ComputeWork::kBackwardInput, 0, b0);
    add(ComputeWork::kBackwardWeight, 0, b0++);
    add(ComputeWork::kForward, 1, f1++);
    add(ComputeWork::kBackwardInput, 1, b1);
    add(ComputeWork::kBackwardWeight, 1, b1++);
  }
  uint32_t w0 = b0, w1 = b1;
  for (uint32_t i = 0; i < stage; ++i) {
    add(ComputeWork::kBackwardInput, 0, b0++);
    add(ComputeWork::kBackwardInput, 1, b1++);
  }
  for (uint32_t i = 0; i < pp - stage; ++i) {
    add(ComputeWork::kBackwardInput, 0, b0++);
    add(ComputeWork::kBackwardWeight, 0, w0++);
  }
  while (w1 < b1) add(ComputeWork::kBackwardWeight, 1, w1++);
  while (w0 < b0) add(ComputeWork::kBackwardWeight, 0, w0++);
  return out;
}

// DualPipeV: forwards of chunk 0 fill the V, chunk 1's start while chunk 0's still arrive;
// in the main phase each forward of one chunk runs beside a full backward of the other (torch
// runs the pair one after the other); the first and last backwards are split, their weight
// parts queued and run where the pipeline would idle.
std::vector<ComputeAction> DualPipeV(uint32_t pp, uint32_t microbatches, uint32_t stage) {
  Counters n(2);
  std::deque<std::pair<uint32_t, uint32_t>> weights_due;  // (chunk, microbatch)
  std::vector<ComputeAction> out;
  auto forward = [&](uint32_t c) { out.push_back({ComputeWork::kForward, c, n.forward[c]++}); };
  auto backward = [&](uint32_t c, bool split) {
    const uint32_t mb = n.backward[c]++;
    out.push_back({split ? ComputeWork::kBackwardInput : ComputeWork::kBackward, c, mb});
    if (split) weights_due.emplace_back(c, mb);
  };
  auto weight = [&] {
    if (weights_due.empty()) return;
    const auto [c, mb] = weights_due.front();
    weights_due.pop_front();
    out.push_back({ComputeWork::kBackwardWeight, c, mb});
  };
  for (uint32_t i = 0; i < 2 * (pp - stage - 1); ++i) forward(0);
  for (uint32_t i = 0; i < stage + 1; ++i) {
    forward(0);
    forward(1);
  }
  for (uint32_t i = 0; i < pp - stage - 1; ++i) {
    backward(1, true);
    weight();
    forward(1);
  }
  for (uint32_t i = 0; i < microbatches - 2 * pp + stage + 1; ++i) {
    forward(0);  // beside chunk 1's backward (on the last stage, the first pair is not overlapped)
    backward(1, false);
    forward(1);  // beside chunk 0's backward
    backward(0, false);
  }
  for (uint32_t i = 0; i < pp - stage - 1; ++i) {
    backward(1, false);
    forward(1);
    backward(0, false);
  }
  const uint32_t tail = stage + 1;
  bool split = false;
  for (uint32_t i = 0; i < tail; ++i) {
    if (i == tail / 2 && stage % 2 == 1) split = true;
    backward(1, split);
    if (i == tail / 2 && stage % 2 == 0) split = true;
    backward(0, split);
  }
  for (uint32_t i = 0; i < pp - stage - 1; ++i) {
    weight();
    backward(0, split);
  }
  for (uint32_t i = 0; i < stage + 1; ++i) weight();
  return out;
}

}  // namespace

std::string_view PipelineScheduleName(PipelineScheduleKind kind) {
  for (const auto& [k, name] : kNames) {
    if (k == kind) return name;
  }
  return "unknown";
}

bool ParsePipelineScheduleName(std::string_view name, PipelineScheduleKind* kind) {
  for (const auto& [k, n] : kNames) {
    if (n == name) {
      *kind = k;
      return true;
    }
  }
  return false;
}

bool IsVShaped(PipelineScheduleKind kind) {
  return kind == PipelineScheduleKind::kZbv || kind == PipelineScheduleKind::kDualPipeV;
}

std::vector<ComputeAction> RankComputeOrder(PipelineScheduleKind kind, uint32_t pp, uint32_t chunks,
                                            uint32_t microbatches, uint32_t stage) {
  switch (kind) {
    case PipelineScheduleKind::kInterleaved1F1B:
      return LoopedOneForwardOneBackward(false, pp, chunks, microbatches, stage);
    case PipelineScheduleKind::kZeroBubble:
      return LoopedOneForwardOneBackward(true, pp, chunks, microbatches, stage);
    case PipelineScheduleKind::kZbv: return Zbv(pp, microbatches, stage);
    case PipelineScheduleKind::kDualPipeV: return DualPipeV(pp, microbatches, stage);
    case PipelineScheduleKind::k1F1B: break;
  }
  std::fprintf(stderr, "RankComputeOrder: 1F1B has no torch order here (StageProgram's own)\n");
  std::abort();
}

}  // namespace rankwatch
