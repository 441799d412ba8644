// Loading NCCL at run time (issue 16, "Several processes"; research/cuda-transport.md): the
// library is opened with dlopen from the path configure() found (VARIOPATH_NCCL_LIBRARY, else
// the nvidia-nccl-cu12/13 wheel's nvidia/nccl/lib/libnccl.so.2, else "" for the loader's default
// search of libnccl.so.2), and the few functions the transport calls are resolved by name. Needs
// neither nccl.h nor CUDA: built into every module.
#pragma once

#include <string>

#include "nccl/abi.h"

namespace variopath::nccl {

// The resolved functions (NCCL's names without the `nccl` prefix).
struct Api {
  Result (*GetVersion)(int*);
  Result (*GetUniqueId)(UniqueId*);
  Result (*CommInitRankConfig)(Comm*, int, UniqueId, int, Config*);
  Result (*CommDestroy)(Comm);
  Result (*CommAbort)(Comm);
  Result (*CommGetAsyncError)(Comm, Result*);
  const char* (*GetErrorString)(Result);
  const char* (*GetLastError)(Comm);
  Result (*GroupStart)();
  Result (*GroupEnd)();
  Result (*Send)(const void*, size_t, DataType, int, Comm, Stream);
  Result (*Recv)(void*, size_t, DataType, int, Comm, Stream);
  Result (*AllGather)(const void*, void*, size_t, DataType, Comm, Stream);
  int version = 0;   // ncclGetVersion's code, e.g. 23203
  std::string path;  // what was opened ("libnccl.so.2": the default search)
};

// The library, opened and resolved once per process (later calls return the first success,
// whatever path they name); null with `error` naming the library, the missing symbol or the
// version found when it cannot be used. Thread-safe.
const Api* load(const std::string& path, std::string& error);

// The library already loaded, or null.
const Api* loaded();

// "2.32.3" for a version code.
std::string version_string(int code);

// "what: ncclInvalidUsage (its description)[: NCCL's last error message]".
std::string describe(const Api& api, Result result, const char* what, Comm comm = nullptr);

}  // namespace variopath::nccl
