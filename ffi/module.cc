// The nanobind module `variopath_jax._native`: build facts and, when compiled with CUDA, a probe
// of the CUDA devices this process can see. Later parts (planner core, FFI handlers) register here.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <numeric>

#include "catalog.h"

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

// What the C++ loader reads from a catalog file: counts and sums the tests compare with Python's.
nb::dict catalog_info(const std::string& path, const std::string& fingerprint) {
  try {
    const auto file = variopath::load_catalog_file(path, fingerprint);
    nb::dict out;
    out["version"] = file.version;
    out["fingerprint"] = file.fingerprint();
    const auto& groups = file.at("groups");
    out["groups"] = static_cast<long>(groups.shape.at(0));
    out["group_size"] = static_cast<long>(groups.shape.at(1));
    out["instances"] = static_cast<long>(file.at("inst_src").size());
    out["shapes"] = static_cast<long>(file.at("shapes").shape.at(0));
    out["families"] = static_cast<long>(file.at("fam_shape").size());
    const auto fam_inst = file.at("fam_inst").as<int32_t>();
    const auto fam_count = file.at("fam_count").as<int32_t>();
    const auto links = file.at("route_links").as<int32_t>();
    const auto rates = file.at("inst_rate").as<double>();
    const auto shapes = file.at("shapes").as<int16_t>();
    out["sum_fam_inst"] = std::accumulate(fam_inst.begin(), fam_inst.end(), 0L);
    out["sum_fam_count"] = std::accumulate(fam_count.begin(), fam_count.end(), 0L);
    out["sum_route_links"] = std::accumulate(links.begin(), links.end(), 0L);
    out["sum_shapes"] = std::accumulate(shapes.begin(), shapes.end(), 0L);
    out["sum_rates"] = std::accumulate(rates.begin(), rates.end(), 0.0);
    return out;
  } catch (const variopath::CatalogError& err) {
    throw nb::value_error(err.what());
  }
}

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "variopath_jax native core (C++17, optional CUDA)";
  m.def("build_info", &build_info, "Compiler, FFI API version and CUDA status of this build.");
  m.def("catalog_info", &catalog_info, nb::arg("path"), nb::arg("fingerprint") = "",
        "Load a catalog file with the C++ loader; return its counts and checksums.");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible to this process (count, driver/runtime versions, error if none).");
}
