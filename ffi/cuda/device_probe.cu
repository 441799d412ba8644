#include "cuda/device_probe.h"

#include <cuda_runtime.h>

namespace variopath::cuda {

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

}  // namespace variopath::cuda
