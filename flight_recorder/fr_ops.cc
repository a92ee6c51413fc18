// Operations: their names, PyTorch's rules comparing two members' records (CompareOps), and
// the FrOp a verdict reports (fr_analysis_internal.h).
#include <fmt/format.h>

#include <charconv>
#include <limits>
#include <set>
#include <string_view>

#include "flight_recorder/fr_analysis.h"
#include "flight_recorder/fr_analysis_internal.h"

namespace rankwatch::fr {
namespace internal {
namespace {

bool ParseInt(std::string_view s, int64_t* out) {
  while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
  while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
  const auto r = std::from_chars(s.data(), s.data() + s.size(), *out);
  return r.ec == std::errc() && r.ptr == s.data() + s.size();
}

}  // namespace

OpName ParseOpName(std::string_view profiling_name) {
  OpName n;
  const size_t colon = profiling_name.find(':');
  std::string_view name =
      colon == std::string_view::npos ? profiling_name : profiling_name.substr(colon + 1);
  const size_t space = name.find(' ');
  n.type = name.substr(0, space);
  if (space == std::string_view::npos) return n;
  const std::string_view meta = name.substr(space + 1);
  if (n.type == "send") {
    const size_t arrow = meta.find("->");
    if (arrow != std::string_view::npos) {
      ParseInt(meta.substr(0, arrow), &n.src);
      ParseInt(meta.substr(arrow + 2), &n.dst);
    }
  } else if (n.type == "recv") {
    const size_t arrow = meta.find("<-");
    if (arrow != std::string_view::npos) {
      ParseInt(meta.substr(0, arrow), &n.dst);
      ParseInt(meta.substr(arrow + 2), &n.src);
    }
  }
  return n;
}

bool IsCoalescedMarker(std::string_view type) {
  return type == "coalesced" || type == "ALLGATHER_coalesced" || type == "REDUCE_SCATTER_coalesced";
}

bool IsP2p(const FrEntry& e) {
  if (e.is_p2p) return true;
  const std::string_view t = ParseOpName(e.profiling_name).type;
  return t == "send" || t == "recv";
}

int64_t SeqOf(const FrEntry& e) { return IsP2p(e) ? e.p2p_seq_id : e.collective_seq_id; }

std::string Shapes(const std::vector<std::vector<int64_t>>& sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    out += i ? ", [" : "[";
    for (size_t j = 0; j < sizes[i].size(); ++j)
      out += (j ? ", " : "") + std::to_string(sizes[i][j]);
    out += "]";
  }
  return out + "]";
}

std::string Dtypes(const std::vector<std::string>& d) {
  std::set<std::string> s(d.begin(), d.end());
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out;
}

FrOp MakeOp(const FrEntry& e, const std::vector<uint32_t>& group_ranks) {
  FrOp op;
  const OpName n = ParseOpName(e.profiling_name);
  op.name = std::string(n.type);
  op.p2p = IsP2p(e);
  op.seq = SeqOf(e);
  if (op.p2p) {
    const int64_t peer_local = n.type == "send" ? n.dst : n.src;
    if (peer_local >= 0 && static_cast<size_t>(peer_local) < group_ranks.size())
      op.peer = group_ranks[static_cast<size_t>(peer_local)];
  }
  op.input_sizes = e.input_sizes;
  op.input_dtypes = e.input_dtypes;
  op.record_id = e.record_id;
  op.time_created_ns = e.time_created_ns;
  op.frames = e.frames;
  return op;
}

// An operation's time for ordering across ranks: its creation time (wall clock), else none.
int64_t When(const FrOp& op) {
  return op.time_created_ns >= 0 ? op.time_created_ns : std::numeric_limits<int64_t>::max();
}

namespace {

// Elements of a shape; -1 when it overflows (sizes come from outside input).
int64_t Numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, d, &n)) return -1;
  return n;
}

// x * n, or -1 on overflow.
int64_t Times(int64_t x, int64_t n) {
  int64_t out;
  return __builtin_mul_overflow(x, n, &out) ? -1 : out;
}

bool HasData(const std::vector<std::vector<int64_t>>& sizes) {
  return !sizes.empty() && !sizes.front().empty();
}

}  // namespace
}  // namespace internal

using internal::Dtypes;
using internal::HasData;
using internal::IsCoalescedMarker;
using internal::Numel;
using internal::OpName;
using internal::ParseOpName;
using internal::Shapes;
using internal::Times;

bool CompareOps(const FrEntry& a, const FrEntry& b, size_t group_size, FrMismatch* m) {
  const OpName na = ParseOpName(a.profiling_name), nb = ParseOpName(b.profiling_name);
  auto fail = [&](MismatchKind kind, std::string expected, std::string found) {
    if (m) *m = FrMismatch{0, kind, std::move(expected), std::move(found)};
    return false;
  };
  if (na.type != nb.type)
    return fail(MismatchKind::kOpType, std::string(na.type), std::string(nb.type));
  const std::string_view t = na.type;
  if (t == "send" || t == "recv" || IsCoalescedMarker(t)) return true;
  const bool all_to_all = t == "all_to_all";
  if (!all_to_all && t != "scatter" && a.input_sizes != b.input_sizes)
    return fail(MismatchKind::kSize, "input " + Shapes(a.input_sizes),
                "input " + Shapes(b.input_sizes));
  if (!all_to_all && t != "gather" && a.output_sizes != b.output_sizes)
    return fail(MismatchKind::kSize, "output " + Shapes(a.output_sizes),
                "output " + Shapes(b.output_sizes));
  if ((t == "all_reduce" || t == "allreduce_coalesced") && a.input_sizes != b.output_sizes)
    return fail(MismatchKind::kSize, "input " + Shapes(a.input_sizes) + " = output",
                "output " + Shapes(b.output_sizes));
  const auto gs = static_cast<int64_t>(group_size);
  if ((t == "all_gather" || t == "_all_gather_base" || t == "all_gather_into_tensor_coalesced") &&
      HasData(a.input_sizes) && HasData(b.output_sizes) &&
      Numel(b.output_sizes.front()) != Times(Numel(a.input_sizes.front()), gs))
    return fail(MismatchKind::kSize,
                fmt::format("output numel {} (input x {} ranks)",
                            Times(Numel(a.input_sizes.front()), gs), gs),
                fmt::format("output numel {}", Numel(b.output_sizes.front())));
  if ((t == "reduce_scatter" || t == "_reduce_scatter_base" ||
       t == "reduce_scatter_tensor_coalesced") &&
      HasData(a.output_sizes) && HasData(b.input_sizes) &&
      Numel(b.input_sizes.front()) != Times(Numel(a.output_sizes.front()), gs))
    return fail(MismatchKind::kSize,
                fmt::format("input numel {} (output x {} ranks)",
                            Times(Numel(a.output_sizes.front()), gs), gs),
                fmt::format("input numel {}", Numel(b.input_sizes.front())));
  // Dtypes: each side's inputs and outputs agree, and the two sides agree (where they hold data).
  const bool bcast = t == "broadcast" || t == "scatter";
  if (t != "gather" && !bcast && Dtypes(a.input_dtypes) != Dtypes(a.output_dtypes) &&
      HasData(a.input_sizes) && HasData(a.output_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.input_dtypes), Dtypes(a.output_dtypes));
  if (!bcast && Dtypes(a.input_dtypes) != Dtypes(b.input_dtypes) && HasData(a.input_sizes) &&
      HasData(b.input_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.input_dtypes), Dtypes(b.input_dtypes));
  if (t != "gather" && Dtypes(a.output_dtypes) != Dtypes(b.output_dtypes) &&
      HasData(a.output_sizes) && HasData(b.output_sizes))
    return fail(MismatchKind::kDtype, Dtypes(a.output_dtypes), Dtypes(b.output_dtypes));
  if (a.state != b.state)
    return fail(MismatchKind::kState, FrStateName(a.state), FrStateName(b.state));
  return true;
}

}  // namespace rankwatch::fr
