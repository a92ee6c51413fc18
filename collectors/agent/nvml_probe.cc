#include "collectors/agent/nvml_probe.h"

#include <dlfcn.h>
#include <spdlog/spdlog.h>

namespace rankwatch {
namespace {

// The few NVML declarations used (nvml.h is not needed at build time).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
struct nvmlUtilization_t {
  unsigned gpu, memory;
};
struct nvmlMemory_t {
  unsigned long long total, free, used;
};
constexpr int kNvmlTemperatureGpu = 0;

}  // namespace

struct NvmlProbe::Api {
  nvmlReturn_t (*init)();
  nvmlReturn_t (*shutdown)();
  nvmlReturn_t (*count)(unsigned*);
  nvmlReturn_t (*handle)(unsigned, nvmlDevice_t*);
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*);
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*);
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned*);
  nvmlReturn_t (*power)(nvmlDevice_t, unsigned*);
};

std::unique_ptr<NvmlProbe> NvmlProbe::Open(const std::string& library) {
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    spdlog::info("agent: NVML not found ({}): sampling without GPU metrics", library);
    return nullptr;
  }
  auto api = std::make_unique<Api>();
  auto sym = [h](const char* name) { return dlsym(h, name); };
  api->init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
  api->shutdown = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
  api->count = reinterpret_cast<nvmlReturn_t (*)(unsigned*)>(sym("nvmlDeviceGetCount_v2"));
  api->handle = reinterpret_cast<nvmlReturn_t (*)(unsigned, nvmlDevice_t*)>(
      sym("nvmlDeviceGetHandleByIndex_v2"));
  api->utilization = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlUtilization_t*)>(
      sym("nvmlDeviceGetUtilizationRates"));
  api->memory = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, nvmlMemory_t*)>(
      sym("nvmlDeviceGetMemoryInfo"));
  api->temperature = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, int, unsigned*)>(
      sym("nvmlDeviceGetTemperature"));
  api->power =
      reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned*)>(sym("nvmlDeviceGetPowerUsage"));
  unsigned count = 0;
  if (api->init == nullptr || api->count == nullptr || api->handle == nullptr || api->init() != 0 ||
      api->count(&count) != 0) {
    spdlog::info("agent: NVML present but not usable: sampling without GPU metrics");
    dlclose(h);
    return nullptr;
  }
  spdlog::info("agent: NVML loaded, {} GPU(s)", count);
  return std::unique_ptr<NvmlProbe>(new NvmlProbe(h, std::move(api), count));
}

NvmlProbe::NvmlProbe(void* handle, std::unique_ptr<Api> api, unsigned count)
    : handle_(handle), api_(std::move(api)), count_(count) {}

NvmlProbe::~NvmlProbe() {
  if (api_->shutdown != nullptr) api_->shutdown();
  dlclose(handle_);
}

void NvmlProbe::Sample(v1::SystemSample* sample) {
  for (unsigned i = 0; i < count_; ++i) {
    v1::DeviceSample* d = sample->add_devices();
    d->set_index(i);
    nvmlDevice_t dev = nullptr;
    if (api_->handle(i, &dev) != 0) continue;
    nvmlUtilization_t u{};
    if (api_->utilization != nullptr && api_->utilization(dev, &u) == 0) {
      d->set_utilization(u.gpu / 100.0);
    }
    nvmlMemory_t m{};
    if (api_->memory != nullptr && api_->memory(dev, &m) == 0) {
      d->set_memory_used_bytes(m.used);
      d->set_memory_total_bytes(m.total);
    }
    unsigned t = 0;
    if (api_->temperature != nullptr && api_->temperature(dev, kNvmlTemperatureGpu, &t) == 0) {
      d->set_temperature_celsius(t);
    }
    unsigned mw = 0;
    if (api_->power != nullptr && api_->power(dev, &mw) == 0) d->set_power_watts(mw / 1000.0);
  }
}

}  // namespace rankwatch
