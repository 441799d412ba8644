// CUDA runtime probe: how many CUDA devices this process sees, or why none.
#pragma once
#include <string>

namespace variopath::cuda {

struct DeviceProbe {
  int device_count = 0;
  int driver_version = 0;   // as cudaDriverGetVersion reports it (e.g. 13000), 0 if no driver
  int runtime_version = 0;  // the CUDA runtime this module was linked against
  std::string error;        // empty when the query succeeded
};

DeviceProbe probe_devices();

}  // namespace variopath::cuda
