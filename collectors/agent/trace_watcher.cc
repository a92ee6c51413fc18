#include "collectors/agent/trace_watcher.h"

#include "traces/iteration_trace.h"

namespace rankwatch {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

bool TraceWatcher::Classify(const std::filesystem::path& file, TraceKind* kind) {
  const std::string name = file.filename().string();
  if (EndsWith(name, ".pt.trace.json") || EndsWith(name, ".pt.trace.json.gz")) {
    *kind = TraceKind::kKineto;
    return true;
  }
  if (DetectIterationTraceFormat(file).has_value()) {
    *kind = TraceKind::kAscendIteration;
    return true;
  }
  return false;
}

std::vector<FoundTrace> TraceWatcher::Poll() {
  std::vector<FoundTrace> ready;
  std::error_code ec;
  std::filesystem::recursive_directory_iterator it(options_.directory, ec), end;
  std::map<std::filesystem::path, Seen> now;
  for (; !ec && it != end; it.increment(ec)) {
    TraceKind kind;
    if (!it->is_regular_file(ec) || !Classify(it->path(), &kind)) continue;
    if (published_.count(it->path()) > 0) continue;
    Seen s;
    s.bytes = it->file_size(ec);
    s.mtime = static_cast<int64_t>(it->last_write_time(ec).time_since_epoch().count());
    if (ec) {
      ec.clear();
      continue;
    }
    if (first_poll_ && !options_.include_existing) {
      published_.insert(it->path());
      continue;
    }
    auto before = candidates_.find(it->path());
    if (before != candidates_.end() && before->second.bytes == s.bytes &&
        before->second.mtime == s.mtime && published_.size() < options_.max_tracked) {
      published_.insert(it->path());
      ready.push_back({it->path(), kind, s.bytes});
    } else {
      now[it->path()] = s;
    }
  }
  first_poll_ = false;
  candidates_ = std::move(now);
  return ready;
}

}  // namespace rankwatch
