// CUDA runtime probe: how many CUDA devices this process sees, or why none; and, for configure's
// choice between cuda-ipc and cuda-host (issue 29), which GPUs these are and which pairs of them
// have peer access.
#pragma once
#include <string>
#include <vector>

namespace variopath::cuda {

struct DeviceProbe {
  int device_count = 0;
  int driver_version = 0;   // as cudaDriverGetVersion reports it (e.g. 13000), 0 if no driver
  int runtime_version = 0;  // the CUDA runtime this module was linked against
  std::string error;        // empty when the query succeeded
};

DeviceProbe probe_devices();

// The devices this process sees, by ordinal: their UUIDs ("GPU-…", as nvidia-smi writes them),
// PCI bus ids and memory (bytes), and access[a][b]: whether device a can access device b's memory
// (cudaDeviceCanAccessPeer; true on the diagonal).
struct PeerProbe {
  std::vector<std::string> uuids, bus_ids;
  std::vector<size_t> memory;
  std::vector<std::vector<bool>> access;
  std::string error;  // empty when every query succeeded
};

PeerProbe probe_peers();

}  // namespace variopath::cuda
