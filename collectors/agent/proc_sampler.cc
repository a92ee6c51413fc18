#include "collectors/agent/proc_sampler.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace rankwatch {
namespace {

bool ReadFile(const std::string& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

}  // namespace

ProcSampler::ProcSampler(ProcSamplerOptions options)
    : options_(std::move(options)),
      self_pid_(static_cast<uint32_t>(getpid())),
      ticks_per_second_(sysconf(_SC_CLK_TCK)),
      page_size_(sysconf(_SC_PAGESIZE)) {}

bool ProcSampler::ReadHostCpu(CpuTimes* out) const {
  std::string text;
  if (!ReadFile(options_.proc_root + "/stat", &text) || text.compare(0, 4, "cpu ") != 0)
    return false;
  std::istringstream line(text.substr(4, text.find('\n') - 4));
  uint64_t v[10] = {};
  for (uint64_t& x : v) line >> x;
  // user nice system idle iowait irq softirq steal (guest time is already in user/nice)
  const uint64_t idle = v[3] + v[4];
  out->total = v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
  out->busy = out->total - idle;
  return true;
}

void ProcSampler::ReadMemory(v1::SystemSample* s) const {
  std::string text;
  if (!ReadFile(options_.proc_root + "/meminfo", &text)) return;
  uint64_t total_kib = 0, available_kib = 0;
  std::istringstream in(text);
  std::string key;
  uint64_t value;
  std::string unit;
  while (in >> key >> value) {
    std::getline(in, unit);
    if (key == "MemTotal:") total_kib = value;
    if (key == "MemAvailable:") available_kib = value;
  }
  s->set_memory_total_bytes(total_kib * 1024);
  s->set_memory_used_bytes((total_kib - std::min(total_kib, available_kib)) * 1024);
}

std::vector<uint32_t> ProcSampler::TrainingPids() const {
  std::vector<uint32_t> pids;
  if (options_.process_match.empty()) return pids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(options_.proc_root, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const auto pid = static_cast<uint32_t>(std::stoul(name));
    if (pid == self_pid_) continue;
    std::string cmdline;
    if (!ReadFile(entry.path().string() + "/cmdline", &cmdline)) continue;
    for (char& c : cmdline) {
      if (c == '\0') c = ' ';
    }
    if (cmdline.find(options_.process_match) != std::string::npos) pids.push_back(pid);
  }
  std::sort(pids.begin(), pids.end());
  if (pids.size() > options_.max_processes) pids.resize(options_.max_processes);
  return pids;
}

v1::SystemSample ProcSampler::Sample(int64_t unix_ns) {
  v1::SystemSample s;
  s.set_unix_ns(unix_ns);
  CpuTimes host;
  if (ReadHostCpu(&host)) {
    if (last_host_.total > 0 && host.total > last_host_.total) {
      s.set_cpu_utilization(static_cast<double>(host.busy - last_host_.busy) /
                            static_cast<double>(host.total - last_host_.total));
    }
    last_host_ = host;
  }
  ReadMemory(&s);
  const double seconds = last_unix_ns_ > 0 ? (unix_ns - last_unix_ns_) * 1e-9 : 0;
  std::map<uint32_t, uint64_t> ticks_now;
  for (uint32_t pid : TrainingPids()) {
    std::string stat;
    if (!ReadFile(options_.proc_root + "/" + std::to_string(pid) + "/stat", &stat)) continue;
    // Fields after the command name, which may contain spaces: skip past the last ')'.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream in(stat.substr(close + 2));
    std::string field;
    uint64_t utime = 0, stime = 0, rss_pages = 0;
    for (int i = 3; i <= 24 && in >> field; ++i) {
      if (i == 14) utime = std::stoull(field);
      if (i == 15) stime = std::stoull(field);
      if (i == 24) rss_pages = std::stoull(field);
    }
    v1::ProcessSample* p = s.add_processes();
    p->set_pid(pid);
    p->set_rss_bytes(rss_pages * static_cast<uint64_t>(page_size_));
    const uint64_t ticks = utime + stime;
    ticks_now[pid] = ticks;
    auto last = last_process_ticks_.find(pid);
    if (last != last_process_ticks_.end() && seconds > 0 && ticks >= last->second) {
      p->set_cpu_utilization(static_cast<double>(ticks - last->second) /
                             static_cast<double>(ticks_per_second_) / seconds);
    }
  }
  last_process_ticks_ = std::move(ticks_now);
  last_unix_ns_ = unix_ns;
  return s;
}

}  // namespace rankwatch
