#include "cuda/device_probe.h"

#include <cuda_runtime.h>

#include <cstdio>

namespace variopath::cuda {

namespace {

std::string describe(cudaError_t status, const char* what) {
  cudaGetLastError();  // clear a sticky error so later calls start clean
  return std::string(what) + ": " + cudaGetErrorName(status) + " (" + cudaGetErrorString(status) + ")";
}

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
  cudaRuntimeGetVersion(&probe.runtime_version);
  cudaDriverGetVersion(&probe.driver_version);
  cudaError_t status = cudaGetDeviceCount(&probe.device_count);
  if (status != cudaSuccess) {
    probe.device_count = 0;
    probe.error = std::string(cudaGetErrorName(status)) + ": " + cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later calls start clean
  }
  return probe;
}

PeerProbe probe_peers() {
  PeerProbe probe;
  int count = 0;
  if (const cudaError_t status = cudaGetDeviceCount(&count); status != cudaSuccess) {
    probe.error = describe(status, "cudaGetDeviceCount");
    return probe;
  }
  probe.access.assign(count, std::vector<bool>(count, false));
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    char bus[64] = {0};
    if (const cudaError_t status = cudaGetDeviceProperties(&prop, d); status != cudaSuccess) {
      probe.error = describe(status, "cudaGetDeviceProperties");
      return probe;
    }
    if (const cudaError_t status = cudaDeviceGetPCIBusId(bus, sizeof bus, d); status != cudaSuccess) {
      probe.error = describe(status, "cudaDeviceGetPCIBusId");
      return probe;
    }
    probe.uuids.push_back(uuid_text(prop.uuid));
    probe.bus_ids.push_back(bus);
    probe.memory.push_back(prop.totalGlobalMem);
    for (int p = 0; p < count; ++p) {
      int can = d == p;
      if (d != p)
        if (const cudaError_t status = cudaDeviceCanAccessPeer(&can, d, p); status != cudaSuccess) {
          probe.error = describe(status, "cudaDeviceCanAccessPeer");
          return probe;
        }
      probe.access[d][p] = can != 0;
    }
  }
  return probe;
}

}  // namespace variopath::cuda
