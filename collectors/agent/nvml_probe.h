// NvmlProbe: GPU utilisation, memory, temperature and power through NVML, loaded at run time
// with dlopen (libnvidia-ml.so.1). No NVML on the machine is normal (CPU nodes, other
// accelerators): Open() then says so in one info line and the agent samples without devices.
//
// Not thread-safe: owned by the agent's sampling thread.
#pragma once

#include <memory>
#include <string>

#include "rankwatch/v1/telemetry.pb.h"

namespace rankwatch {

class NvmlProbe {
 public:
  // Loads NVML from `library` (default libnvidia-ml.so.1) and initialises it; nullptr when
  // it is absent or fails to initialise (logged once at info).
  static std::unique_ptr<NvmlProbe> Open(const std::string& library = "libnvidia-ml.so.1");
  ~NvmlProbe();
  NvmlProbe(const NvmlProbe&) = delete;
  NvmlProbe& operator=(const NvmlProbe&) = delete;

  // Appends one DeviceSample per GPU to `sample`; a device whose query fails keeps 0s.
  void Sample(v1::SystemSample* sample);
  unsigned device_count() const { return count_; }

 private:
  struct Api;
  NvmlProbe(void* handle, std::unique_ptr<Api> api, unsigned count);
  void* handle_;
  std::unique_ptr<Api> api_;
  unsigned count_;
};

}  // namespace rankwatch
