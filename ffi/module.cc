// The nanobind module `variopath_jax._native`: build facts and, when compiled with CUDA, a probe
// of the CUDA devices this process can see. Later parts (planner core, FFI handlers) register here.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <numeric>

#include "catalog.h"
#include "planner.h"

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

template <typename T>
using Array1 = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

template <typename T>
std::vector<T> to_vector(const Array1<T>& a) {
  return std::vector<T>(a.data(), a.data() + a.shape(0));
}

template <typename T>
nb::ndarray<nb::numpy, T, nb::ndim<1>> to_numpy(std::vector<T> v) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T, nb::ndim<1>>(heap->data(), {heap->size()}, owner);
}

// The C++ planner core, built from catalog bytes and the deployment's arrays (planner/native.py).
class Planner {
 public:
  Planner(nb::bytes catalog, const std::string& fingerprint, nb::dict dep) {
    std::vector<uint8_t> buf(catalog.size());
    std::memcpy(buf.data(), catalog.c_str(), catalog.size());
    try {
      const auto file = variopath::load_catalog_bytes(buf, "catalog", fingerprint);
      variopath::DeploymentView view;
      view.ranks = nb::cast<int32_t>(dep["ranks"]);
      view.nodes = nb::cast<int32_t>(dep["nodes"]);
      view.n_groups = nb::cast<int32_t>(dep["n_groups"]);
      view.group_size = nb::cast<int32_t>(dep["group_size"]);
      view.group_ranks = nb::cast<std::vector<int32_t>>(dep["group_ranks"]);
      view.group_of = nb::cast<std::vector<int32_t>>(dep["group_of"]);
      view.endpoint_up = nb::cast<std::vector<int32_t>>(dep["endpoint_up"]);
      view.endpoint_down = nb::cast<std::vector<int32_t>>(dep["endpoint_down"]);
      view.endpoint_up_gbs = nb::cast<std::vector<double>>(dep["endpoint_up_gbs"]);
      view.endpoint_down_gbs = nb::cast<std::vector<double>>(dep["endpoint_down_gbs"]);
      view.links_per_node = nb::cast<int64_t>(dep["links_per_node"]);
      view.net_links_per_node = nb::cast<int64_t>(dep["net_links_per_node"]);
      view.near_ptr = nb::cast<std::vector<int64_t>>(dep["near_ptr"]);
      view.near_links = nb::cast<std::vector<int32_t>>(dep["near_links"]);
      view.near_rate = nb::cast<std::vector<double>>(dep["near_rate"]);
      view.near_via = nb::cast<std::vector<uint8_t>>(dep["near_via"]);
      core_ = std::make_unique<variopath::PlannerCore>(file, std::move(view));
    } catch (const variopath::CatalogError& err) {
      throw nb::value_error(err.what());
    }
  }

  nb::dict plan(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand, double lambda_s,
                int64_t k_target, int32_t starts, int32_t sweeps, uint64_t seed, bool auto_granularity,
                int32_t max_candidates) {
    variopath::PlanParams params{lambda_s, k_target, starts, sweeps, seed, auto_granularity, max_candidates};
    variopath::PlanResult r;
    {
      nb::gil_scoped_release release;
      r = core_->plan(demand.data(), params);
    }
    nb::dict out;
    out["step_ptr"] = to_numpy(std::move(r.step_ptr));
    out["src"] = to_numpy(std::move(r.src));
    out["dst"] = to_numpy(std::move(r.dst));
    out["bytes"] = to_numpy(std::move(r.bytes));
    out["rate"] = to_numpy(std::move(r.rate));
    out["lane_kind"] = to_numpy(std::move(r.lane_kind));
    out["link_ptr"] = to_numpy(std::move(r.link_ptr));
    out["links"] = to_numpy(std::move(r.links));
    out["tau_s"] = r.tau_s;
    out["k"] = r.k;
    out["fallbacks"] = r.fallbacks;
    out["candidates"] = r.candidates;
    return out;
  }

 private:
  std::unique_ptr<variopath::PlannerCore> core_;
};

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "variopath_jax native core (C++17, optional CUDA)";
  m.def("build_info", &build_info, "Compiler, FFI API version and CUDA status of this build.");
  m.def("catalog_info", &catalog_info, nb::arg("path"), nb::arg("fingerprint") = "",
        "Load a catalog file with the C++ loader; return its counts and checksums.");
  nb::class_<Planner>(m, "Planner")
      .def(nb::init<nb::bytes, const std::string&, nb::dict>(), nb::arg("catalog"), nb::arg("fingerprint"),
           nb::arg("deployment"))
      .def("plan", &Planner::plan, nb::arg("demand"), nb::arg("lambda_s"), nb::arg("k_target"), nb::arg("starts"),
           nb::arg("sweeps"), nb::arg("seed"), nb::arg("auto_granularity"), nb::arg("max_candidates"),
           "Plan one AlltoAllv demand (int64 N x N); returns the schedule as flat arrays.");
  m.def("canonical_assignment", &variopath::canonical_assignment, nb::arg("weights"), nb::arg("n"),
        "Lexicographically smallest max-weight assignment of an n x n integer matrix (row-major).");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible to this process (count, driver/runtime versions, error if none).");
}
