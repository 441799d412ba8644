// The nanobind module `variopath_jax._native`: build facts and, when compiled with CUDA, a probe
// of the CUDA devices this process can see. Later parts (planner core, FFI handlers) register here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "xla/ffi/api/c_api.h"

#ifdef VARIOPATH_HAVE_CUDA
#include "cuda/device_probe.h"
#endif

namespace nb = nanobind;

namespace {

nb::dict build_info() {
  nb::dict info;
  info["compiler"] = VARIOPATH_CXX_COMPILER;
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  info["ffi_api_version"] =
      nb::make_tuple(static_cast<int>(XLA_FFI_API_MAJOR), static_cast<int>(XLA_FFI_API_MINOR));
#ifdef VARIOPATH_HAVE_CUDA
  info["cuda"] = true;
  info["cuda_compiler_version"] = VARIOPATH_CUDA_VERSION;
#else
  info["cuda"] = false;
  info["cuda_compiler_version"] = nb::none();
#endif
  return info;
}

nb::dict cuda_devices() {
  nb::dict out;
#ifdef VARIOPATH_HAVE_CUDA
  const auto probe = variopath::cuda::probe_devices();
  out["compiled"] = true;
  out["device_count"] = probe.device_count;
  out["driver_version"] = probe.driver_version;
  out["runtime_version"] = probe.runtime_version;
  out["error"] = probe.error;
#else
  out["compiled"] = false;
  out["device_count"] = 0;
  out["driver_version"] = 0;
  out["runtime_version"] = 0;
  out["error"] = "variopath_jax was built without a CUDA compiler";
#endif
  return out;
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "variopath_jax native core (C++17, optional CUDA)";
  m.def("build_info", &build_info, "Compiler, FFI API version and CUDA status of this build.");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible to this process (count, driver/runtime versions, error if none).");
}
