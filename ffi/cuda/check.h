// The one wrapper every CUDA runtime call of ffi/cuda, ffi/nccl and ffi/ffi_cuda.cc goes through
// (issue 52; tests/test_cuda_rules.py lints for it): VP_CUDA(call) runs the call and returns its
// Status, whose message names the call (its source text) and the current device. Whatever the
// caller does with a failure, the wrapper clears the thread's last error first: CUDA keeps a
// non-sticky error (a poll's cudaErrorNotReady, a refused peer access, a failed registration)
// in the thread's last error, and a kernel launch checked by cudaGetLastError would report it as
// its own failure. For the same reason a kernel launch goes through VP_LAUNCH only, which clears
// the last error before the launch and reads it after.
//
// Only this header calls the CUDA runtime without the wrapper (the wrapper itself).
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace variopath::cuda {

struct Status {
  cudaError_t code = cudaSuccess;
  std::string message;  // "" on success (and for cudaErrorNotReady, a state): else what failed, where

  bool ok() const { return code == cudaSuccess; }
  bool not_ready() const { return code == cudaErrorNotReady; }
};

// "call on device d: cudaErrorName (its description)".
inline std::string describe(cudaError_t code, const char* call) {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) device = -1;
  return std::string(call) + " on device " + std::to_string(device) + ": " + cudaGetErrorName(code) + " (" +
         cudaGetErrorString(code) + ")";
}

inline Status status_of(cudaError_t code, const char* call) {
  Status s;
  s.code = code;
  if (code == cudaSuccess) return s;
  (void)cudaGetLastError();  // a non-sticky error must not outlive its call (a sticky one cannot be cleared)
  if (code != cudaErrorNotReady) s.message = describe(code, call);
  return s;
}

// Clear the thread's last error before a launch; read it after (the launch's own failure).
inline void clear_last_error() { (void)cudaGetLastError(); }
inline Status launched(const char* kernel) { return status_of(cudaGetLastError(), kernel); }

}  // namespace variopath::cuda

#define VP_CUDA(call) ::variopath::cuda::status_of((call), #call)

// VP_LAUNCH(kernel, grid, block, stream, args...): launch `kernel` on `stream` with the last error
// cleared first; its Status (nvcc only: the launch syntax).
#define VP_LAUNCH(kernel, grid, block, stream, ...)                                                   \
  (::variopath::cuda::clear_last_error(), kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__), \
   ::variopath::cuda::launched(#kernel))
