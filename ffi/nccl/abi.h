// The part of NCCL's C ABI the NCCL transport uses (issue 16, "Several processes"), declared here
// so that the build needs no nccl.h: the library is opened at run time (loader.h). Names, values
// and signatures follow NCCL's documented API ("NCCL API" / "Types" in the NCCL user guide):
// ncclComm_t is an opaque pointer, ncclUniqueId 128 bytes, ncclResult_t and ncclDataType_t are
// int enums with fixed values, and ncclConfig_t is versioned by its own size and version fields,
// so a library newer than the layout declared here reads only the fields we declare.
#pragma once

#include <climits>
#include <cstddef>

namespace variopath::nccl {

struct ncclComm;
using Comm = ncclComm*;       // ncclComm_t
using Stream = void*;         // cudaStream_t, passed through

constexpr size_t kUniqueIdBytes = 128;  // NCCL_UNIQUE_ID_BYTES
struct UniqueId {
  char internal[kUniqueIdBytes];
};

enum Result : int {  // ncclResult_t
  kSuccess = 0,
  kUnhandledCudaError = 1,
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

enum DataType : int {  // ncclDataType_t
  kUint8 = 1,
};

// The first fields of ncclConfig_t (their layout since NCCL 2.17; 2.14, the first release with
// non-blocking communicators, had `blocking` only): NCCL copies `size` bytes of a config over its
// defaults and, for a `version` below 2.17, resets cgaClusterSize, minCTAs, maxCTAs and netName to
// their defaults, so of this config it reads `blocking` alone (the others are left undefined).
struct Config {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char* netName;
};
constexpr unsigned int kApiMagic = 0xcafebeef;  // NCCL_API_MAGIC
constexpr int kUndefInt = INT_MIN;              // NCCL_CONFIG_UNDEF_INT
constexpr int kMinVersion = 21400;              // NCCL_VERSION(2, 14, 0): ncclCommInitRankConfig

// NCCL_CONFIG_INITIALIZER for the fields above, with blocking as given.
inline Config make_config(bool blocking) {
  return Config{sizeof(Config), kApiMagic, static_cast<unsigned int>(kMinVersion), blocking ? 1 : 0,
                kUndefInt, kUndefInt, kUndefInt, nullptr};
}

}  // namespace variopath::nccl
