#include "cuda/device_probe.h"

#include <cuda_runtime.h>

#include <cstdio>

#include "cuda/check.h"

namespace variopath::cuda {

namespace {

std::string uuid_text(const cudaUUID_t& u) {
  const auto* b = reinterpret_cast<const unsigned char*>(u.bytes);
  char out[64];
  std::snprintf(out, sizeof out, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
                b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  return out;
}

}  // namespace

DeviceProbe probe_devices() {
  DeviceProbe probe;
  VP_CUDA(cudaRuntimeGetVersion(&probe.runtime_version));
  VP_CUDA(cudaDriverGetVersion(&probe.driver_version));
  if (const Status s = VP_CUDA(cudaGetDeviceCount(&probe.device_count)); !s.ok()) {
    probe.device_count = 0;
    probe.error = s.message;
  }
  return probe;
}

PeerProbe probe_peers() {
  PeerProbe probe;
  int count = 0;
  if (const Status s = VP_CUDA(cudaGetDeviceCount(&count)); !s.ok()) {
    probe.error = s.message;
    return probe;
  }
  probe.access.assign(count, std::vector<bool>(count, false));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    char bus[64] = {0};
    if (const Status s = VP_CUDA(cudaGetDeviceProperties(&prop, d)); !s.ok()) {
      probe.error = s.message;
      return probe;
    }
    if (const Status s = VP_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, d)); !s.ok()) {
      probe.error = s.message;
      return probe;
    }
    probe.uuids.push_back(uuid_text(prop.uuid));
    probe.bus_ids.push_back(bus);
    probe.memory.push_back(prop.totalGlobalMem);
    for (int p = 0; p < count; ++p) {
      int can = d == p;
      if (d != p)
        if (const Status s = VP_CUDA(cudaDeviceCanAccessPeer(&can, d, p)); !s.ok()) {
          probe.error = s.message;
          return probe;
        }
      probe.access[d][p] = can != 0;
    }
  }
  return probe;
}

}  // namespace variopath::cuda
