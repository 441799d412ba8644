// The nanobind module `variopath_jax._native`: the planner core, the catalog loader, the XLA FFI
// handlers (CPU) and their planner configurations, build facts and, when compiled with CUDA, a
// probe of the CUDA devices this process can see.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstring>
#include <memory>
#include <type_traits>
#include <numeric>

#include "catalog.h"
#include "collective.h"
#include "ffi_cpu.h"
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

variopath::DeploymentView deployment_view(nb::dict dep) {
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
  return view;
}

std::unique_ptr<variopath::PlannerCore> make_core(nb::bytes catalog, const std::string& fingerprint, nb::dict dep) {
  std::vector<uint8_t> buf(catalog.size());
  std::memcpy(buf.data(), catalog.c_str(), catalog.size());
  try {
    const auto file = variopath::load_catalog_bytes(buf, "catalog", fingerprint);
    return std::make_unique<variopath::PlannerCore>(file, deployment_view(dep));
  } catch (const variopath::CatalogError& err) {
    throw nb::value_error(err.what());
  }
}

variopath::PlanParams plan_params(nb::dict p) {
  variopath::PlanParams params;
  params.lambda_s = nb::cast<double>(p["lambda_s"]);
  params.k_target = nb::cast<int64_t>(p["k_target"]);
  params.starts = nb::cast<int32_t>(p["starts"]);
  params.sweeps = nb::cast<int32_t>(p["sweeps"]);
  params.seed = nb::cast<uint64_t>(p["seed"]);
  params.auto_granularity = nb::cast<bool>(p["auto_granularity"]);
  params.max_candidates = nb::cast<int32_t>(p["max_candidates"]);
  return params;
}

// The C++ planner core, built from catalog bytes and the deployment's arrays (planner/native.py).
class Planner {
 public:
  Planner(nb::bytes catalog, const std::string& fingerprint, nb::dict dep) : core_(make_core(catalog, fingerprint, dep)) {}

  nb::dict plan(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand, double lambda_s,
                int64_t k_target, int32_t starts, int32_t sweeps, uint64_t seed, bool auto_granularity,
                int32_t max_candidates) {
    const int32_t n = core_->ranks();
    if (demand.shape(0) != size_t(n) || demand.shape(1) != size_t(n))
      throw std::invalid_argument("demand is " + std::to_string(demand.shape(0)) + "x" +
                                  std::to_string(demand.shape(1)) + " but the planner's deployment has " +
                                  std::to_string(n) + " ranks");
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

// Register a planner configuration the FFI handlers plan with (jax_ops/config.py).
void register_op_config(int64_t id, nb::bytes catalog, const std::string& fingerprint, nb::dict dep,
                        std::vector<int32_t> rank_map, nb::dict params, double timeout_s, bool debug) {
  auto config = std::make_shared<variopath::OpConfig>();
  config->planner = make_core(catalog, fingerprint, dep);
  config->params = plan_params(params);
  config->ranks = nb::cast<int32_t>(dep["ranks"]);
  if (rank_map.size() != static_cast<size_t>(config->ranks))
    throw nb::value_error("rank_map must give a topology rank for every mesh-axis position");
  config->axis_of_rank.assign(config->ranks, -1);
  for (size_t p = 0; p < rank_map.size(); ++p) {
    const int32_t r = rank_map[p];
    if (r < 0 || r >= config->ranks || config->axis_of_rank[r] != -1)
      throw nb::value_error("rank_map must be a permutation of the topology's ranks");
    config->axis_of_rank[r] = static_cast<int32_t>(p);
  }
  config->rank_map = std::move(rank_map);
  config->timeout_s = timeout_s;
  config->debug = debug;
  variopath::register_config(id, std::move(config));
}

nb::object debug_schedule(int64_t site) {
  variopath::ExecutedSchedule log;
  if (!variopath::last_schedule(site, log)) return nb::none();
  nb::dict out;
  out["ranks"] = log.ranks;
  out["demand"] = to_numpy(std::move(log.demand));
  out["step_ptr"] = to_numpy(std::move(log.step_ptr));
  out["src"] = to_numpy(std::move(log.src));
  out["dst"] = to_numpy(std::move(log.dst));
  out["bytes"] = to_numpy(std::move(log.bytes));
  return out;
}

template <typename T>
nb::capsule ffi_capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>, "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

nb::dict registrations() {
  nb::dict out;
  out["variopath_all_to_all_v"] = ffi_capsule(variopath::AllToAllVCpu);
  out["variopath_ragged_all_to_all"] = ffi_capsule(variopath::RaggedAllToAllCpu);
  return out;
}

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
  m.def("register_op_config", &register_op_config, nb::arg("id"), nb::arg("catalog"), nb::arg("fingerprint"),
        nb::arg("deployment"), nb::arg("rank_map"), nb::arg("params"), nb::arg("timeout_s"), nb::arg("debug"),
        "Register a planner configuration for the FFI handlers.");
  m.def("unregister_op_config", &variopath::unregister_config, nb::arg("id"));
  m.def("debug_schedule", &debug_schedule, nb::arg("site"),
        "Demand and transfers of the last executed call of a site (configurations with debug=True).");
  m.def("registrations", &registrations, "XLA FFI targets (CPU): name -> capsule.");
  m.def("canonical_assignment", &variopath::canonical_assignment, nb::arg("weights"), nb::arg("rows"),
        nb::arg("cols"),
        "Lexicographically smallest max-weight assignment of the rows of a rows x cols integer matrix "
        "(row-major, rows <= cols) to distinct columns.");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible to this process (count, driver/runtime versions, error if none).");
}
