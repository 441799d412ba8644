// The nanobind module `variopath_jax._native`: the planner core, the catalog loader, the XLA FFI
// handlers (CPU) and their planner configurations, build facts and, when compiled with CUDA, a
// probe of the CUDA devices this process can see.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <stdexcept>
#include <memory>
#include <numeric>
#include <thread>
#include <type_traits>

#include "catalog.h"
#include "choice.h"
#include "collective.h"
#include "cuda/copy_split.h"
#include "cuda/peer_access.h"
#include "emulated_machine.h"
#include "ffi_cpu.h"
#include "layout.h"
#include "nccl/loader.h"
#include "nccl/p2p.h"
#include "planner.h"
#include "shm_transport.h"
#include "streams.h"

#include "xla/ffi/api/c_api.h"

#ifdef VARIOPATH_HAVE_CUDA
#include "cuda/device_probe.h"
#include "cuda/profile_cuda.h"
#include "cuda/cuda_streams.h"
#include "cuda/selftest.h"
#include "ffi_cuda.h"
#include "nccl/nccl_collective.h"
#endif
#ifdef VARIOPATH_CUDA_STANDIN  // the test module over the CPU stand-in for CUDA (CMakeLists.txt)
#include "standin/bindings.h"
#endif

namespace nb = nanobind;

namespace {

// The profiler's emulated machine (emulated_machine.h): built once, then one run per experiment.
void init_emulated_machine(variopath::emulated::Machine* self, std::vector<double> capacity,
                           std::vector<int32_t> link_class, const std::vector<double>& beta,
                           const std::vector<double>& floor, const std::vector<bool>& paced_lossless,
                           std::vector<std::vector<int32_t>> routes, std::vector<int32_t> route_source,
                           std::vector<double> route_latency, double issue_s, double signal_s, double barrier_s,
                           double jitter, uint64_t seed, std::vector<int32_t> root_complex, std::vector<bool> uplink,
                           std::vector<bool> route_pull, double trigger_factor) {
  if (beta.size() != floor.size() || beta.size() != paced_lossless.size())
    throw nb::value_error("emulated machine: beta, floor and paced_lossless need one entry per class");
  std::vector<variopath::emulated::LinkClass> classes;
  for (size_t c = 0; c < beta.size(); ++c) classes.push_back({beta[c], floor[c], paced_lossless[c]});
  auto* m = new (self) variopath::emulated::Machine{std::move(capacity), std::move(link_class), std::move(classes),
                                                    std::move(routes), std::move(route_source),
                                                    std::move(route_latency), issue_s, signal_s, barrier_s,
                                                    jitter, seed};
  m->root_complex = std::move(root_complex);
  m->uplink = std::move(uplink);
  m->route_pull = std::move(route_pull);
  m->trigger_factor = trigger_factor;
  try {
    variopath::emulated::validate(*m);
  } catch (...) {
    m->~Machine();
    throw;
  }
}

// An experiment's transfers from their fields as arrays (experiment.h).
std::vector<variopath::ExperimentTransfer> experiment_of(const std::vector<int32_t>& route,
                                                         const std::vector<int64_t>& nbytes,
                                                         const std::vector<double>& cap,
                                                         const std::vector<int32_t>& step,
                                                         const std::vector<int32_t>& after) {
  const size_t n = route.size();
  if (nbytes.size() != n || cap.size() != n || step.size() != n || after.size() != n)
    throw nb::value_error("experiment: route, nbytes, cap, step and after need one entry per transfer");
  std::vector<variopath::ExperimentTransfer> transfers(n);
  for (size_t i = 0; i < n; ++i) transfers[i] = {route[i], nbytes[i], cap[i], step[i], after[i]};
  return transfers;
}

std::vector<double> run_emulated_machine(const variopath::emulated::Machine& machine, const std::vector<int32_t>& route,
                                         const std::vector<int64_t>& nbytes, const std::vector<double>& cap,
                                         const std::vector<int32_t>& step, const std::vector<int32_t>& after,
                                         uint64_t experiment) {
  return variopath::emulated::run(machine, experiment_of(route, nbytes, cap, step, after), experiment);
}

nb::dict build_info() {
  nb::dict info;
  info["compiler"] = VARIOPATH_CXX_COMPILER;
  info["cxx_standard"] = static_cast<long>(__cplusplus);
  info["ffi_api_version"] =
      nb::make_tuple(static_cast<int>(XLA_FFI_API_MAJOR), static_cast<int>(XLA_FFI_API_MINOR));
  nb::list transports;  // what moves the op's bytes in this build (variopath info --json)
  transports.append("cpu");
  transports.append("shm");  // CPU processes of one host (shm_transport.h)
#ifdef VARIOPATH_HAVE_CUDA
  info["cuda"] = true;
  info["cuda_compiler_version"] = VARIOPATH_CUDA_VERSION;
  transports.append("cuda");
  transports.append("nccl");  // GPU processes across nodes; the library loads at run time (nccl_library)
  transports.append("cuda-ipc");  // GPU processes of one node with peer access (cuda/ipc.h)
  transports.append("cuda-host");  // GPU processes of one node without it (cuda/host_staging.h)
#else
  info["cuda"] = false;
  info["cuda_compiler_version"] = nb::none();
#endif
  info["transports"] = transports;
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

// The GPUs this process sees and which pairs have peer access (configure's choice between
// cuda-ipc and cuda-host, jax_ops/peers.py).
nb::dict cuda_peers() {
  nb::dict out;
  nb::list devices, access;
#ifdef VARIOPATH_HAVE_CUDA
  const auto probe = variopath::cuda::probe_peers();
  for (size_t d = 0; d < probe.uuids.size(); ++d) {
    nb::dict dev;
    dev["ordinal"] = static_cast<long>(d);
    dev["uuid"] = probe.uuids[d];
    dev["pci_bus_id"] = probe.bus_ids[d];
    dev["memory"] = static_cast<long long>(probe.memory[d]);
    devices.append(dev);
    nb::list row;
    for (bool can : probe.access[d]) row.append(can);
    access.append(row);
  }
  out["error"] = probe.error;
#else
  out["error"] = "variopath_jax was built without a CUDA compiler";
#endif
  out["devices"] = devices;
  out["access"] = access;
  return out;
}

// What moves configuration `id`'s bytes, why, and its staging budget (configure's choice).
nb::dict op_config_transport(int64_t id) {
  auto config = variopath::find_config(id);
  if (!config) throw nb::value_error(("no configuration " + std::to_string(id) + " is registered").c_str());
  nb::dict out;
  static const char* const names[] = {"memcpy", "emulated", "shm", "nccl", "cuda-ipc", "cuda-host"};
  out["transport"] = names[static_cast<int32_t>(config->transport)];
  out["reason"] = config->transport_reason;
  out["staging_budget"] = config->staging_budget;
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

std::unique_ptr<variopath::PlannerCore> make_core(nb::bytes catalog, const std::string& fingerprint,
                                                  const variopath::Deployment& dep) {
  std::vector<uint8_t> buf(catalog.size());
  std::memcpy(buf.data(), catalog.c_str(), catalog.size());
  try {
    const auto file = variopath::load_catalog_bytes(buf, "catalog", fingerprint);
    return std::make_unique<variopath::PlannerCore>(file, dep);
  } catch (const variopath::CatalogError& err) {
    throw nb::value_error(err.what());
  }
}

void check_params(const variopath::PlanParams& params) {
  try {
    params.check();
  } catch (const std::invalid_argument& err) {
    throw nb::value_error((std::string("planner parameters: ") + err.what()).c_str());
  }
}

// The C++ planner core, built from catalog bytes and the deployment (planner/native.py).
class Planner {
 public:
  Planner(nb::bytes catalog, const std::string& fingerprint, const variopath::Deployment& dep)
      : core_(make_core(catalog, fingerprint, dep)) {}

  nb::dict plan(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                const variopath::PlanParams& params) {
    const int32_t n = core_->ranks();
    if (demand.shape(0) != size_t(n) || demand.shape(1) != size_t(n))
      throw nb::value_error(("demand is " + std::to_string(demand.shape(0)) + "x" + std::to_string(demand.shape(1)) +
                             " but the planner's deployment has " + std::to_string(n) + " ranks")
                                .c_str());
    variopath::PlanResult r;
    try {
      nb::gil_scoped_release release;
      r = core_->plan(demand.data(), params);
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    } catch (const variopath::CatalogError& err) {
      throw nb::value_error(err.what());
    }
    nb::dict out;
    out["step_ptr"] = to_numpy(std::move(r.step_ptr));
    out["src"] = to_numpy(std::move(r.src));
    out["dst"] = to_numpy(std::move(r.dst));
    out["bytes"] = to_numpy(std::move(r.bytes));
    out["rate"] = to_numpy(std::move(r.rate));
    out["lane_kind"] = to_numpy(std::move(r.lane_kind));
    out["lane_inst"] = to_numpy(std::move(r.lane_inst));
    out["link_ptr"] = to_numpy(std::move(r.link_ptr));
    out["links"] = to_numpy(std::move(r.links));
    out["tau_s"] = r.tau_s;
    out["k"] = r.k;
    out["fallbacks"] = r.fallbacks;
    out["candidates"] = r.candidates;
    return out;
  }

 const variopath::PlannerCore& core() const { return *core_; }

 private:
  std::unique_ptr<variopath::PlannerCore> core_;
};

// variopath's model-aware choice in the C++ core (ffi/choice.h): Algorithm 2 by the Planner, then
// the other families, the analytic predictor and the robust choice (planner/native.py).
class Chooser {
 public:
  Chooser(const Planner& planner, const variopath::ChoiceDeployment& dep) : planner_(planner), core_(make(dep)) {}

  nb::dict choose(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                  const variopath::PlanParams& params, const std::vector<variopath::NetParams>& models,
                  const std::vector<double>& warm, int32_t rank, bool algorithm2, bool hybrid,
                  bool every) {
    check_demand(demand);
    check_rank(rank);
    variopath::Choice c;
    // Algorithm 2 timed with the choice (it runs inside it, where it may pay)
    const variopath::Algorithm2 paper = algorithm2_of(demand.data(), params, algorithm2);
    const double core_s = timed_in_core([&] {
      c = core_->choose(demand.data(), paper, models, warm, rank, hybrid, every);
    });
    auto& s = c.schedule;
    nb::dict out;
    out["candidates"] = c.candidates;
    out["predicted"] = c.predicted;
    out["regret"] = c.regret;
    out["fractions"] = to_numpy(std::move(c.fractions));
    out["split_iterations"] = c.split_iterations;
    out["endpoint_s"] = c.endpoint_s;
    // the call's time in C++ (what the op pays), and its parts
    out["core_s"] = core_s;
    out["paper_s"] = c.paper_s;
    out["build_s"] = c.build_s;
    out["split_s"] = c.split_s;
    out["hybrid_s"] = c.hybrid_s;
    out["predict_s"] = c.predict_s;
    put_schedule(std::move(s), out);
    return out;
  }

  // The op's decision made ahead from a demand (ChoiceCore::choose ahead), and the choice's record
  nb::tuple decide(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                   const variopath::PlanParams& params, const std::vector<variopath::NetParams>& models,
                   bool algorithm2, bool hybrid) {
    check_demand(demand);
    variopath::Choice c;
    const variopath::Algorithm2 paper = algorithm2_of(demand.data(), params, algorithm2);
    const double decide_s = timed_in_core(
        [&] { c = core_->choose(demand.data(), paper, models, {}, -1, hybrid, false, /*ahead=*/true); });
    nb::dict record;
    record["decide_s"] = decide_s;  // off the call path: on the decider's thread
    record["candidates"] = c.candidates;
    record["predicted"] = c.predicted;
    record["regret"] = c.regret;
    record["call_path_s"] = c.call_path_s;
    record["plan"] = c.schedule.plan;
    return nb::make_tuple(c.decision, record);
  }

  // What the op's call path does with a decision and the counts (layout.h critical_path): the
  // plan as the op executes it, checked, with (in the schedule's arrays) the applied ChoiceSchedule
  nb::dict apply(const variopath::Decision& decision,
                 nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                 const variopath::PlanParams& params, const std::vector<variopath::NetParams>& models,
                 bool algorithm2, int32_t rank) {
    check_demand(demand);
    check_rank(rank);
    variopath::ChoiceSchedule s;
    const variopath::Algorithm2 paper = algorithm2_of(demand.data(), params, algorithm2);
    const double apply_s = timed_in_core([&] { s = core_->apply(decision, demand.data(), paper, models, rank); });
    nb::dict out;
    out["apply_s"] = apply_s;
    // the whole plan's predicted time per model (ChoiceCore::predict, as the choice predicts it):
    // for the predictor-against-simulator checks
    std::vector<double> predicted;
    if (rank < 0)
      for (const auto& net : models) predicted.push_back(core_->predict(s, net));
    out["predicted"] = predicted;
    put_schedule(std::move(s), out);
    return out;
  }

  // What the choice estimates applying `decision` to `demand` costs on the call path, cold
  // (ChoiceCore::call_path_s, from the transfers of its whole plan): bench_call_path.py
  double apply_work_s(const variopath::Decision& decision,
                      nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                      const variopath::PlanParams& params, const std::vector<variopath::NetParams>& models) {
    check_demand(demand);
    try {
      nb::gil_scoped_release release;
      const int64_t* d = demand.data();
      const variopath::Algorithm2 paper = [&] { return planner_.core().plan(d, params); };
      const variopath::ChoiceSchedule s = core_->apply(decision, d, paper, models, -1, false);
      const variopath::DemandCells cells = core_->cells(d);
      const double work = s.plan == "chained" ? core_->chained_work_s(cells)
                          : s.plan == "barrier" || s.plan == "signal" ? core_->algorithm2_work_s(cells)
                                                                       : 0.0;
      return core_->call_path_s(s.plan, double(s.transfers()), work);
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    }
  }

  // Seconds of `repeats` calls of the op's call path (layout.h critical_path, for `rank`), each
  // after `flush_bytes` of other memory were written and read (a model step's traffic between
  // two calls: cold caches), timed in C++.
  std::vector<double> critical_path_s(const variopath::Decision& decision,
                                      nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                                      const variopath::PlanParams& params,
                                      const std::vector<variopath::NetParams>& models, bool algorithm2, int32_t rank,
                                      int32_t repeats, int64_t flush_bytes, double timeout_s) {
    check_demand(demand);
    check_rank(rank);
    if (repeats < 1) throw nb::value_error("repeats must be >= 1");
    if (flush_bytes < 0) throw nb::value_error("flush_bytes must be >= 0");
    std::vector<double> out;
    std::string err;
    {
      nb::gil_scoped_release release;
      const int32_t n = core_->deployment().ranks;
      const std::vector<int64_t> d(demand.data(), demand.data() + int64_t(n) * n);
      variopath::Algorithm2 paper;
      if (algorithm2) paper = [&] { return planner_.core().plan(d.data(), params); };
      std::vector<uint64_t> other(size_t(flush_bytes) / sizeof(uint64_t), 0);
      volatile uint64_t sink = 0;
      for (int32_t k = 0; k < repeats && err.empty(); ++k) {
        uint64_t acc = 0;
        for (size_t w = 0; w < other.size(); ++w) acc += (other[w] += w ^ uint64_t(k));
        sink = sink + acc;
        variopath::ExternalPlan made;
        const auto t0 = std::chrono::steady_clock::now();
        try {
          err = variopath::critical_path(*core_, decision, d, paper, models, rank, timeout_s, made);
        } catch (const std::exception& e) {
          err = e.what();
        }
        out.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
    }
    if (!err.empty()) throw nb::value_error(err.c_str());
    return out;
  }

  // What the gates expect building each costly candidate for `demand` to cost (s), and the counts
  // behind each estimate: bench_planner.py compares them with what building costs
  nb::dict planning_estimates(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand) {
    check_demand(demand);
    const variopath::DemandCells cells = core_->cells(demand.data());
    const variopath::Aggregate agg = core_->aggregate(cells);
    nb::dict out;
    out["split_s"] = core_->split_work_s(agg, cells, variopath::kSplitIterations);
    out["split_units"] = core_->split_units(agg, cells, variopath::kSplitIterations);
    variopath::Phased ph;
    out["rotation_s"] = core_->deployment().root_complexes > 1 && core_->phase_aggregate(cells, agg, ph)
                            ? nb::cast(core_->rotation_work_s(ph, cells, variopath::kSplitIterations))
                            : nb::none();
    out["chained_s"] = core_->chained_work_s(cells);
    out["chained_column_iterations"] = core_->chained_work_s(cells) / variopath::kChainedSPerColumnIteration;
    out["algorithm2_s"] = core_->algorithm2_work_s(cells);
    out["algorithm2_activations"] = core_->algorithm2_activations(cells);
    return out;
  }

  // The chained plan alone, under the gaps of `model` (None: it has none), and its call timed in
  // C++ (core_s): for the parity tests and bench_planner.py chained.
  nb::object chained(nb::ndarray<const int64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> demand,
                     const variopath::NetParams& model, double floor_s) {
    variopath::ChoiceSchedule s;
    bool found = false;
    double core_s = 0;
    try {
      nb::gil_scoped_release release;
      const auto t0 = std::chrono::steady_clock::now();
      found = core_->chained(demand.data(), model, s, floor_s);
      core_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    }
    if (!found) return nb::none();
    nb::dict out;
    out["core_s"] = core_s;
    put_schedule(std::move(s), out);
    return out;
  }

 private:
  // a ChoiceSchedule's flat arrays (planner/native.py NativeChooser._schedule reads them)
  static void put_schedule(variopath::ChoiceSchedule&& s, nb::dict& out) {
    out["plan"] = s.plan;
    out["horizon_s"] = s.horizon_s;
    out["step_ptr"] = to_numpy(std::move(s.step_ptr));
    out["step_overhead"] = to_numpy(std::move(s.step_overhead));
    out["step_chain"] = to_numpy(std::move(s.step_chain));
    out["src"] = to_numpy(std::move(s.src));
    out["dst"] = to_numpy(std::move(s.dst));
    out["route"] = to_numpy(std::move(s.route));
    out["carries_i"] = to_numpy(std::move(s.carries_i));
    out["carries_j"] = to_numpy(std::move(s.carries_j));
    out["bytes"] = to_numpy(std::move(s.bytes));
    out["rate"] = to_numpy(std::move(s.rate));
    out["staged"] = to_numpy(std::move(s.staged));
    out["cap_bps"] = to_numpy(std::move(s.cap_bps));
    out["lane_kind"] = to_numpy(std::move(s.lane_kind));
    out["lane_inst"] = to_numpy(std::move(s.lane_inst));
    out["link_ptr"] = to_numpy(std::move(s.link_ptr));
    out["links"] = to_numpy(std::move(s.links));
    out["after_ptr"] = to_numpy(std::move(s.after_ptr));
    out["after_step"] = to_numpy(std::move(s.after_step));
    out["after_index"] = to_numpy(std::move(s.after_index));
  }

  // Algorithm 2's plan of a demand by this chooser's planner (empty where `run` is false)
  variopath::Algorithm2 algorithm2_of(const int64_t* demand, const variopath::PlanParams& params, bool run) const {
    if (!run) return {};
    return [this, demand, &params] { return planner_.core().plan(demand, params); };
  }
  // Run `f` in the core without the GIL, its bad input a ValueError; its time in seconds
  template <class F>
  static double timed_in_core(F&& f) {
    double seconds = 0;
    try {
      nb::gil_scoped_release release;
      const auto t0 = std::chrono::steady_clock::now();
      f();
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    }
    return seconds;
  }

  template <class Demand>
  void check_demand(const Demand& demand) const {
    const int32_t n = core_->deployment().ranks;
    if (demand.shape(0) != size_t(n) || demand.shape(1) != size_t(n))
      throw nb::value_error(("demand is " + std::to_string(demand.shape(0)) + "x" + std::to_string(demand.shape(1)) +
                             " but the chooser's deployment has " + std::to_string(n) + " ranks")
                                .c_str());
  }
  void check_rank(int32_t rank) const {
    if (rank < -1 || rank >= core_->deployment().ranks)
      throw nb::value_error(("rank " + std::to_string(rank) + " is out of range").c_str());
  }

  static std::unique_ptr<variopath::ChoiceCore> make(const variopath::ChoiceDeployment& dep) {
    try {
      return std::make_unique<variopath::ChoiceCore>(dep);
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    }
  }
  const Planner& planner_;
  std::unique_ptr<variopath::ChoiceCore> core_;
};

// A Python callable kept by a configuration, released under the GIL (or leaked once the
// interpreter is gone: configurations live in a static map).
struct PyRef {
  nb::object fn;
  ~PyRef() {
    if (!Py_IsInitialized()) {
      fn.release();
      return;
    }
    nb::gil_scoped_acquire gil;
    fn.reset();
  }
};

// The op's model-aware planner: `fn(demand)` (int64 ranks x ranks) returns a dict of lists
// step_ptr, src, dst, bytes, after_ptr, after, pace_gbs (jax_ops/config.py `op_plan`). Called
// on an XLA thread with the GIL taken for the call only; Python errors become C++ ones.
variopath::ExternalPlanner external_planner(nb::object fn) {
  auto ref = std::make_shared<PyRef>();
  ref->fn = std::move(fn);
  return [ref](const std::vector<int64_t>& demand, int32_t ranks) {
    nb::gil_scoped_acquire gil;
    try {
      std::vector<int64_t> copy = demand;
      auto arr = to_numpy(std::move(copy));
      nb::dict out = nb::cast<nb::dict>(ref->fn(nb::cast(std::move(arr)).attr("reshape")(ranks, ranks)));
      variopath::ExternalPlan made;
      made.plan.step_ptr = nb::cast<std::vector<int64_t>>(out["step_ptr"]);
      made.plan.src = nb::cast<std::vector<int32_t>>(out["src"]);
      made.plan.dst = nb::cast<std::vector<int32_t>>(out["dst"]);
      made.plan.bytes = nb::cast<std::vector<int64_t>>(out["bytes"]);
      made.pace_gbs = nb::cast<std::vector<double>>(out["pace_gbs"]);
      const auto after_ptr = nb::cast<std::vector<int64_t>>(out["after_ptr"]);
      const auto after = nb::cast<std::vector<int32_t>>(out["after"]);
      if (after_ptr.size() != made.plan.src.size() + 1 || after_ptr.back() != static_cast<int64_t>(after.size()))
        throw std::runtime_error("after_ptr does not index after");
      for (size_t t = 0; t + 1 < after_ptr.size(); ++t)
        made.after.emplace_back(after.begin() + after_ptr[t], after.begin() + after_ptr[t + 1]);
      return made;
    } catch (nb::python_error& err) {
      throw std::runtime_error(err.what());
    } catch (nb::cast_error&) {
      throw std::runtime_error("the planner returned something other than op_plan's dict of lists");
    }
  };
}

// Register a planner configuration the FFI handlers plan with (jax_ops/config.py).
void register_op_config(int64_t id, nb::bytes catalog, const std::string& fingerprint,
                        const variopath::Deployment& dep, std::vector<int32_t> rank_map,
                        const variopath::PlanParams& params, variopath::Execution execution,
                        nb::object planner, const variopath::ChoiceDeployment& choice,
                        std::vector<variopath::NetParams> models, variopath::Transport transport,
                        uint64_t emulator_seed, double emulator_delay_s, double timeout_s, bool debug,
                        int64_t staging_budget, const std::string& transport_reason, bool algorithm2) {
  check_params(params);
  auto config = std::make_shared<variopath::OpConfig>();
  // one rank has nothing to plan (its rows stay with it): no catalog, no core
  if (dep.ranks != 1) config->planner = make_core(catalog, fingerprint, dep);
  config->params = params;
  config->ranks = dep.ranks;
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
  config->execution = execution;
  if (execution == variopath::Execution::kModelAware) {
    if (planner.is_none()) throw nb::value_error("a model-aware configuration needs its planner");
    config->external = external_planner(std::move(planner));
  }
  if (execution == variopath::Execution::kPlanned && dep.ranks != 1) {
    if (models.empty()) throw nb::value_error("a planned configuration needs the models it chooses for");
    try {
      config->chooser = std::make_unique<variopath::ChoiceCore>(choice);
    } catch (const std::invalid_argument& err) {
      throw nb::value_error(err.what());
    }
    config->models = std::move(models);
    config->algorithm2 = algorithm2;
    // each call site's next call applies what this decides from its previous demand (decider.h)
    config->decider = std::make_unique<variopath::Decider>([c = config.get()](const std::vector<int64_t>& demand) {
      variopath::Algorithm2 paper;
      if (c->algorithm2) paper = [&] { return c->planner->plan(demand.data(), c->params); };
      return c->chooser->choose(demand.data(), paper, c->models, {}, -1, true, false, /*ahead=*/true).decision;
    });
  }
  if (!(emulator_delay_s >= 0) || emulator_delay_s > timeout_s)
    throw nb::value_error("emulator_delay_s must be >= 0 and at most the timeout");
  if (staging_budget < 0) throw nb::value_error("staging_budget must be >= 0 (0: unbounded)");
  config->transport = transport;
  config->transport_reason = transport_reason;
  config->staging_budget = staging_budget;
  config->emulator_seed = emulator_seed;
  config->emulator_delay_s = emulator_delay_s;
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
  out["execution"] = log.execution;
  out["plan"] = log.plan;
  out["after_ptr"] = to_numpy(std::move(log.after_ptr));
  out["after"] = to_numpy(std::move(log.after));
  out["pace_gbs"] = to_numpy(std::move(log.pace_gbs));
  out["began"] = to_numpy(std::move(log.began));
  out["ended"] = to_numpy(std::move(log.ended));
  return out;
}

// The rendezvous fault tests (tests/test_op_rendezvous.py): one rank stalls before its n-th
// transfer for `seconds`; rank -1 clears the fault.
struct Stall {
  std::atomic<int32_t> rank{-1};
  std::atomic<int64_t> nth{0};
  std::atomic<double> seconds{0};
} g_stall;

void stall_hook(int32_t rank, int64_t nth) {
  if (rank == g_stall.rank.load() && nth == g_stall.nth.load())
    std::this_thread::sleep_for(std::chrono::duration<double>(g_stall.seconds.load()));
}

void inject_stall(int32_t rank, int64_t nth, double seconds) {
  g_stall.rank = rank;
  g_stall.nth = nth;
  g_stall.seconds = seconds;
  variopath::set_transfer_hook(rank < 0 ? nullptr : stall_hook);
}

using Bytes = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// all_to_all_v of byte rows on one thread per rank, outside XLA: rank r sends
// counts[r] rows of `row_bytes` from inputs[r] and receives into outputs[r]. As soon as a rank's
// call returns, its thread copies its output to snapshots[r] (if given: what the rank had when
// it returned) and fills its input and output with `poison` (as XLA would reuse them; -1: left
// as they are), so a test can check that nobody wrote there afterwards. Returns each rank's
// error ("" on success).
std::vector<std::string> exchange_on_threads(int64_t config, int64_t site, std::vector<Bytes> inputs,
                                             std::vector<Bytes> outputs, std::vector<std::vector<int32_t>> counts,
                                             int64_t row_bytes, int32_t poison, std::vector<Bytes> snapshots) {
  const size_t n = inputs.size();
  if (outputs.size() != n || counts.size() != n) throw nb::value_error("inputs, outputs and counts differ in length");
  if (!snapshots.empty() && snapshots.size() != n) throw nb::value_error("snapshots: one per rank, or none");
  for (size_t r = 0; r < snapshots.size(); ++r)
    if (snapshots[r].size() != outputs[r].size()) throw nb::value_error("snapshots must match the outputs' sizes");
  if (row_bytes <= 0) throw nb::value_error("row_bytes must be > 0");
  for (size_t r = 0; r < n; ++r) {
    if (counts[r].size() != n) throw nb::value_error(("counts[" + std::to_string(r) + "] needs one entry per rank").c_str());
    int64_t rows = 0;
    for (int32_t c : counts[r]) rows += c;
    if (std::any_of(counts[r].begin(), counts[r].end(), [](int32_t c) { return c < 0; }) || rows * row_bytes > static_cast<int64_t>(inputs[r].size()))
      throw nb::value_error(("counts[" + std::to_string(r) + "] do not fit inputs[" + std::to_string(r) + "]").c_str());
  }
  static std::atomic<int64_t> runs{1 << 30};  // run ids of their own, apart from XLA's
  const int64_t run = runs++;
  std::vector<std::string> errors(n);
  std::vector<std::vector<int32_t>> recv(n, std::vector<int32_t>(n, 0));
  {
    nb::gil_scoped_release release;
    std::vector<std::thread> threads;
    for (size_t r = 0; r < n; ++r)
      threads.emplace_back([&, r] {
        variopath::Contribution c;
        c.rank = static_cast<int32_t>(r);
        c.config = config;
        c.axis_size = static_cast<int64_t>(n);
        c.row_bytes = row_bytes;
        c.input = inputs[r].data();
        c.input_rows = static_cast<int64_t>(inputs[r].size()) / row_bytes;
        c.output = outputs[r].data();
        c.output_rows = static_cast<int64_t>(outputs[r].size()) / row_bytes;
        c.recv_counts = recv[r].data();
        int64_t row = 0;
        for (size_t j = 0; j < n; ++j) {
          c.slices.push_back({static_cast<int32_t>(j), row, counts[r][j], -1});
          row += counts[r][j];
        }
        errors[r] = variopath::run_collective(run, site, 0, std::move(c));
        if (!snapshots.empty()) std::memcpy(snapshots[r].data(), outputs[r].data(), outputs[r].size());
        if (poison >= 0) {
          std::memset(inputs[r].data(), poison, inputs[r].size());
          std::memset(outputs[r].data(), poison, outputs[r].size());
        }
      });
    for (auto& t : threads) t.join();
  }
  return errors;
}

// The NCCL library (nccl/loader.h): its version and path, or a RuntimeError naming what is wrong.
nb::dict nccl_library(const std::string& path) {
  std::string error;
  const variopath::nccl::Api* api = variopath::nccl::load(path, error);
  if (!api) throw std::runtime_error(error);
  nb::dict out;
  out["version"] = variopath::nccl::version_string(api->version);
  out["path"] = api->path;
  return out;
}

// Tests of the NCCL transport's plan side (nccl/p2p.h), no GPU: rank r's slices (dest,
// input_row, rows, output_row; output_row -1 for all_to_all_v) and, ragged, its recv_sizes go
// through the rows the ranks all-gather, the layout every rank computes and each rank's pieces
// per step. Returns the pieces ("steps": per rank, per step, "sends" and "recvs" as [peer,
// offset, nbytes]), the layout's copies ([src, dst, src_offset, dst_offset, nbytes]) and per
// rank the transfers its layout holds ("transfers"). local: each rank plans and lays out its own
// pieces as the transport does (lay_out_call's `me`), the copies being those each rank sends;
// else one whole plan and layout serve every rank. decision: the one each rank's process holds
// for the call where holds[r] (all, if holds is empty), else the safe one (a process that missed
// the call before: the ranks agree on the safe decision, layout.h agreed_decision).
nb::dict nccl_p2p_plan(int64_t config, std::vector<std::vector<std::vector<int64_t>>> slices,
                       std::vector<std::vector<int64_t>> recv_sizes, std::vector<int64_t> input_rows,
                       std::vector<int64_t> output_rows, int64_t row_bytes, bool ragged, bool local,
                       const variopath::Decision& decision, std::vector<bool> holds) {
  namespace nc = variopath::nccl;
  const auto n = static_cast<int32_t>(slices.size());
  if (n < 1 || input_rows.size() != size_t(n) || output_rows.size() != size_t(n) ||
      (ragged && recv_sizes.size() != size_t(n)))
    throw nb::value_error("slices, input_rows, output_rows (and recv_sizes, ragged) need one entry per rank");
  const int64_t slots = static_cast<int64_t>(slices[0].size());
  const int64_t words = nc::row_words(slots, ragged);
  std::vector<int64_t> rows(size_t(n) * words);
  if (!holds.empty() && holds.size() != size_t(n)) throw nb::value_error("holds needs one entry per rank");
  const variopath::Decision safe = variopath::safe_decision();
  const auto held = [&](int32_t r) -> const variopath::Decision& {
    return holds.empty() || holds[size_t(r)] ? decision : safe;
  };
  for (int32_t r = 0; r < n; ++r) {
    variopath::Contribution c;
    c.rank = r;
    c.config = config;
    c.axis_size = n;
    c.row_bytes = row_bytes;
    c.input_rows = input_rows[r];
    c.output_rows = output_rows[r];
    c.ragged = ragged;
    for (const auto& s : slices[r]) {
      if (s.size() != 4) throw nb::value_error("a slice is (dest, input_row, rows, output_row)");
      c.slices.push_back({static_cast<int32_t>(s[0]), s[1], s[2], s[3]});
    }
    if (ragged) c.recv_sizes = recv_sizes[r];
    c.decision = held(r).id;
    nc::encode_row(c, 0, slots, rows.data() + size_t(r) * words);
  }
  // what rank `me` lays out (every rank: me = -1), as the transport's lay_out_call does
  const auto laid_out = [&](int32_t me, variopath::Layout& layout, std::vector<int64_t>& step_ptr) {
    std::vector<variopath::Contribution> parts;
    std::vector<int32_t> comm_rank;
    std::string err = nc::decode_group(rows.data(), n, words, 0, n, parts, comm_rank);
    std::shared_ptr<variopath::OpConfig> used;
    if (err.empty()) err = nc::lay_out_call(parts, used, layout, step_ptr, me, held(me < 0 ? 0 : me));
    if (!err.empty()) throw nb::value_error(err.c_str());
  };
  std::vector<variopath::Layout> layouts(local ? n : 1);
  std::vector<std::vector<int64_t>> step_ptrs(layouts.size());
  for (size_t k = 0; k < layouts.size(); ++k) laid_out(local ? int32_t(k) : -1, layouts[k], step_ptrs[k]);
  nb::list steps, transfers;
  for (int32_t r = 0; r < n; ++r) {
    const size_t k = local ? size_t(r) : 0;
    transfers.append(layouts[k].transfers.size());
    nb::list mine;
    for (const auto& step : nc::p2p_steps(layouts[k], step_ptrs[k], r)) {
      nb::dict d;
      for (const char* side : {"sends", "recvs"}) {
        nb::list pieces;
        for (const auto& p : std::strcmp(side, "sends") == 0 ? step.sends : step.recvs)
          pieces.append(nb::make_tuple(p.peer, p.offset, p.nbytes));
        d[side] = pieces;
      }
      mine.append(d);
    }
    steps.append(mine);
  }
  nb::list copies;
  for (size_t k = 0; k < layouts.size(); ++k)
    for (const auto& t : layouts[k].transfers)
      if (!local || t.src == int32_t(k))
        for (size_t c = t.first_copy; c < t.end_copy; ++c)
          copies.append(nb::make_tuple(t.src, t.dst, layouts[k].copies[c].src_offset,
                                       layouts[k].copies[c].dst_offset, layouts[k].copies[c].nbytes));
  nb::dict out;
  out["steps"] = steps;
  out["copies"] = copies;
  out["transfers"] = transfers;
  return out;
}

// Tests (cuda/copy_split.h): the batched copy kernel's per-thread code run on the host for each of
// `threads` thread indices, copying `nbytes` of `src` from `src_offset` into a zeroed buffer of
// `dst_size` bytes at `dst_offset` (both buffers 64-byte aligned, with 64 bytes on either side
// that the copy may read but no byte of which it may write); the buffer and the segment's split.
nb::dict batched_copy_on_host(nb::bytes src, int64_t src_offset, int64_t dst_size, int64_t dst_offset,
                              int64_t nbytes, int64_t threads) {
  const int64_t src_size = static_cast<int64_t>(src.size());
  if (nbytes < 0 || threads < 1 || src_offset < 0 || dst_offset < 0 || src_offset + nbytes > src_size ||
      dst_offset + nbytes > dst_size)
    throw nb::value_error("the segment must lie inside both buffers, with threads >= 1");
  constexpr int64_t kGuard = 64;
  const auto aligned = [](std::vector<uint8_t>& v) {
    return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64 + kGuard;
  };
  std::vector<uint8_t> in(src_size + 3 * kGuard, 0xEE), out(dst_size + 3 * kGuard, 0);
  uint8_t* from = aligned(in);
  uint8_t* to = aligned(out);
  std::memcpy(from, src.c_str(), static_cast<size_t>(src_size));
  for (int64_t t = 0; t < threads; ++t) variopath::cuda::copy_part(from + src_offset, to + dst_offset, nbytes, t, threads);
  const auto split = variopath::cuda::split_segment(reinterpret_cast<uintptr_t>(from + src_offset),
                                                    reinterpret_cast<uintptr_t>(to + dst_offset), nbytes);
  const bool guards_intact = std::all_of(out.data(), to, [](uint8_t b) { return b == 0; }) &&
                             std::all_of(to + dst_size, out.data() + out.size(), [](uint8_t b) { return b == 0; });
  nb::dict result;
  result["dst"] = nb::bytes(reinterpret_cast<const char*>(to), static_cast<size_t>(dst_size));
  result["guards_intact"] = guards_intact;
  result["head"] = split.head;
  result["words"] = split.words;
  result["tail"] = split.tail;
  result["skew"] = split.skew;
  return result;
}

// Tests (cuda/peer_access.h): whether a kernel on `writer` may store into a buffer with these
// facts (kind: cudaMemoryType or -1; allocation: "unknown", "plain", "pool" or "vmm"; access: the
// writer's flags there, -1 unknown), given the writer's peer access to the buffer's device.
nb::dict peer_write_decision(int kind, int owner, const std::string& allocation, int access, int writer,
                             bool peer_enabled) {
  using variopath::cuda::Allocation;
  static const std::map<std::string, Allocation> kinds = {
      {"unknown", Allocation::kUnknown}, {"plain", Allocation::kPlain}, {"pool", Allocation::kPool}, {"vmm", Allocation::kVmm}};
  const auto it = kinds.find(allocation);
  if (it == kinds.end() || kind < -1 || kind > 3)
    throw nb::value_error("kind is -1..3 (cudaMemoryType) and allocation one of unknown, plain, pool, vmm");
  const variopath::cuda::BufferFacts facts{static_cast<variopath::cuda::MemoryKind>(kind), owner, it->second, access};
  const auto w = variopath::cuda::decide_peer_write(facts, writer, peer_enabled);
  nb::dict out;
  out["direct"] = w.direct;
  out["why"] = w.why;
  return out;
}

// Configuration `id`'s shared-memory transport in this process (ValueError if none).
std::shared_ptr<variopath::shm::Transport> shm_transport(int64_t id) {
  auto t = variopath::shm::find(id);
  if (!t) throw nb::value_error(("configuration " + std::to_string(id) + " has no shm transport").c_str());
  return t;
}

template <typename T>
nb::capsule ffi_capsule(T* fn) {
  static_assert(std::is_invocable_r_v<XLA_FFI_Error*, T, XLA_FFI_CallFrame*>, "not an XLA FFI handler");
  return nb::capsule(reinterpret_cast<void*>(fn));
}

// The FFI targets for a platform ("cpu" or "cuda"; none for CUDA in a build without it).
nb::dict registrations(const std::string& platform) {
  nb::dict out;
  if (platform == "cpu") {
    out["variopath_all_to_all_v"] = ffi_capsule(variopath::AllToAllVCpu);
    out["variopath_all_to_all_v_into"] = ffi_capsule(variopath::AllToAllVIntoCpu);
    out["variopath_ragged_all_to_all"] = ffi_capsule(variopath::RaggedAllToAllCpu);
  } else if (platform == "cuda") {
#ifdef VARIOPATH_HAVE_CUDA
    out["variopath_all_to_all_v"] = ffi_capsule(variopath::AllToAllVCuda);
    out["variopath_all_to_all_v_into"] = ffi_capsule(variopath::AllToAllVIntoCuda);
    out["variopath_ragged_all_to_all"] = ffi_capsule(variopath::RaggedAllToAllCuda);
#endif
  } else {
    throw nb::value_error(("no such platform: " + platform + " (cpu or cuda)").c_str());
  }
  return out;
}

#ifdef VARIOPATH_HAVE_CUDA
nb::dict cuda_exchange_on_one_gpu(int64_t config, int64_t site, std::vector<std::vector<int32_t>> counts,
                                  int64_t row_bytes, int device, uint64_t seed, double max_delay_s, int rounds) {
  if (row_bytes <= 0 || rounds < 1) throw nb::value_error("row_bytes and rounds must be > 0");
  for (const auto& row : counts)
    if (row.size() != counts.size() || std::any_of(row.begin(), row.end(), [](int32_t c) { return c < 0; }))
      throw nb::value_error("counts must be a square matrix of non-negative row counts");
  variopath::cuda::ThreadsResult r;
  {
    nb::gil_scoped_release release;
    r = variopath::cuda::exchange_on_one_gpu(config, site, counts, row_bytes, device, seed, max_delay_s, rounds);
  }
  nb::dict out;
  out["errors"] = r.errors;
  out["wrong_bytes"] = r.wrong_bytes;
  out["rounds"] = r.rounds;
  return out;
}

nb::bytes nccl_unique_id(const std::string& library) {
  const std::string id = variopath::nccl::unique_id(library);
  return nb::bytes(id.data(), id.size());
}

void nccl_init(int64_t config, const std::string& library, nb::bytes id, int32_t nranks, std::vector<int32_t> ranks,
               std::vector<int32_t> devices, double timeout_s) {
  const std::string uid(id.c_str(), id.size());
  nb::gil_scoped_release release;
  variopath::nccl::init(config, library, uid, nranks, ranks, devices, timeout_s);
}

nb::dict nccl_selftest(int device, const std::string& library, int64_t nbytes, double timeout_s) {
  std::string detail, error;
  {
    nb::gil_scoped_release release;
    error = variopath::nccl::selftest(device, library, nbytes, timeout_s, detail);
  }
  nb::dict out;
  out["error"] = error;
  out["detail"] = detail;
  return out;
}

nb::dict cuda_process_exchange(int64_t config, int64_t site, int32_t rank, std::vector<std::vector<int32_t>> counts,
                           int64_t row_bytes, int device, uint64_t seed, double max_delay_s, int rounds) {
  if (row_bytes <= 0 || rounds < 1) throw nb::value_error("row_bytes and rounds must be > 0");
  if (!(max_delay_s >= 0)) throw nb::value_error("max_delay_s must be >= 0");
  for (const auto& row : counts)
    if (row.size() != counts.size() || std::any_of(row.begin(), row.end(), [](int32_t c) { return c < 0; }))
      throw nb::value_error("counts must be a square matrix of non-negative row counts");
  variopath::cuda::ProcessResult r;
  {
    nb::gil_scoped_release release;
    r = variopath::cuda::process_exchange(config, site, rank, counts, row_bytes, device, seed, max_delay_s, rounds);
  }
  nb::dict out;
  out["error"] = r.error;
  out["wrong_bytes"] = r.wrong_bytes;
  out["rounds"] = r.rounds;
  return out;
}

nb::dict cuda_profile_run(const std::vector<int>& route_src, const std::vector<int>& route_dst,
                          const std::vector<bool>& route_staged, const std::vector<int32_t>& route,
                          const std::vector<int64_t>& nbytes, const std::vector<double>& cap,
                          const std::vector<int32_t>& step, const std::vector<int32_t>& after, double timeout_s) {
  if (route_dst.size() != route_src.size() || route_staged.size() != route_src.size())
    throw nb::value_error("route_src, route_dst and route_staged need one entry per route");
  std::vector<variopath::cuda::ProfileRoute> routes;
  for (size_t r = 0; r < route_src.size(); ++r) routes.push_back({route_src[r], route_dst[r], route_staged[r]});
  const auto transfers = experiment_of(route, nbytes, cap, step, after);
  variopath::cuda::ProfileRun r;
  {
    nb::gil_scoped_release release;
    r = variopath::cuda::profile_run(routes, transfers, timeout_s);
  }
  nb::dict out;
  out["ends"] = r.ends;
  out["error"] = r.error;
  return out;
}

nb::dict cuda_trigger_run(const std::vector<int>& src, const std::vector<int>& dst, const std::vector<bool>& pull,
                          const std::vector<int64_t>& nbytes, double timeout_s) {
  if (dst.size() != src.size() || pull.size() != src.size() || nbytes.size() != src.size())
    throw nb::value_error("src, dst, pull and nbytes need one entry per flow");
  std::vector<variopath::cuda::TriggerFlow> flows;
  for (size_t i = 0; i < src.size(); ++i) flows.push_back({src[i], dst[i], pull[i], nbytes[i]});
  variopath::cuda::ProfileRun r;
  {
    nb::gil_scoped_release release;
    r = variopath::cuda::trigger_run(flows, timeout_s);
  }
  nb::dict out;
  out["ends"] = r.ends;
  out["error"] = r.error;
  return out;
}

nb::dict cuda_copy_bandwidth(int device, int64_t nbytes, int segments, int iterations, int64_t row_bytes) {
  variopath::cuda::CopyBandwidth r;
  {
    nb::gil_scoped_release release;
    r = variopath::cuda::copy_bandwidth(device, nbytes, segments, iterations, row_bytes);
  }
  nb::dict out;
  out["batched_gbs"] = r.batched_gbs;
  out["memcpy_gbs"] = r.memcpy_gbs;
  out["nbytes"] = r.nbytes;
  out["error"] = r.error;
  return out;
}
#endif

}  // namespace

NB_MODULE(_native, m) {
  m.doc() = "variopath_jax native core (C++17, optional CUDA)";
#ifdef VARIOPATH_CUDA_STANDIN
  variopath::standin::bind(m);
#endif
  m.def("build_info", &build_info, "Compiler, FFI API version and CUDA status of this build.");
  m.def("catalog_info", &catalog_info, nb::arg("path"), nb::arg("fingerprint") = "",
        "Load a catalog file with the C++ loader; return its counts and checksums.");
  // The typed boundary (planner/native.py fills these once per planner or op configuration).
  using variopath::Granularity;
  using variopath::LaneKind;
  using variopath::LeavingPrice;
  nb::enum_<LaneKind>(m, "LaneKind", "What a planned lane is (planner/reference.py LaneKind).")
      .value("FLAT", LaneKind::kFlat)
      .value("INTRA", LaneKind::kIntra)
      .value("NET", LaneKind::kNet)
      .value("ROUTE", LaneKind::kRoute);
  nb::enum_<LeavingPrice>(m, "LeavingPrice").value("MAX", LeavingPrice::kMax).value("SUM", LeavingPrice::kSum);
  nb::enum_<variopath::Execution>(m, "Execution", "How the op executes planned activations (collective.h).")
      .value("BARRIER", variopath::Execution::kBarrier)
      .value("SIGNAL", variopath::Execution::kSignal)
      .value("CONCURRENT", variopath::Execution::kConcurrent)
      .value("MODEL_AWARE", variopath::Execution::kModelAware)
      .value("PLANNED", variopath::Execution::kPlanned);
  nb::enum_<variopath::Transport>(m, "Transport", "What moves the op's bytes (collective.h).")
      .value("MEMCPY", variopath::Transport::kMemcpy)
      .value("EMULATED", variopath::Transport::kEmulated)
      .value("SHM", variopath::Transport::kShm)
      .value("NCCL", variopath::Transport::kNccl)
      .value("CUDA_IPC", variopath::Transport::kCudaIpc)
      .value("CUDA_HOST", variopath::Transport::kCudaHost);
  m.def(
      "transport_direction",
      [](variopath::Transport transport) {
        return variopath::direction_of(transport) == variopath::Direction::kPull ? "pull" : "push";
      },
      nb::arg("transport"),
      "\"push\" where the transport's senders write into the receivers' memory, \"pull\" where "
      "its receivers read the senders' (collective.h direction_of).");
  nb::enum_<Granularity>(m, "Granularity").value("AUTO", Granularity::kAuto).value("FIXED", Granularity::kFixed);
  nb::class_<variopath::PlanParams>(m, "PlanParams", "Algorithm 2's knobs (PlannerParams, field for field).")
      .def(nb::init<>())
      .def_rw("lambda_s", &variopath::PlanParams::lambda_s)
      .def_rw("k_target", &variopath::PlanParams::k_target)
      .def_rw("starts", &variopath::PlanParams::starts)
      .def_rw("sweeps", &variopath::PlanParams::sweeps)
      .def_rw("seed", &variopath::PlanParams::seed)
      .def_rw("granularity", &variopath::PlanParams::granularity)
      .def_rw("max_candidates", &variopath::PlanParams::max_candidates)
      .def_rw("leaving_price", &variopath::PlanParams::leaving_price);
  nb::class_<variopath::LinkLayout>(m, "LinkLayout", "Link ids of the expanded graph (topology LinkLayout).")
      .def(nb::init<>())
      .def_rw("nodes", &variopath::LinkLayout::nodes)
      .def_rw("links_per_node", &variopath::LinkLayout::links_per_node)
      .def_rw("net_links_per_node", &variopath::LinkLayout::net_links_per_node);
  nb::class_<variopath::Deployment>(m, "Deployment", "The deployment beyond the catalog (planner/native.py).")
      .def(nb::init<>())
      .def_rw("ranks", &variopath::Deployment::ranks)
      .def_rw("n_groups", &variopath::Deployment::n_groups)
      .def_rw("group_size", &variopath::Deployment::group_size)
      .def_rw("group_ranks", &variopath::Deployment::group_ranks)
      .def_rw("group_of", &variopath::Deployment::group_of)
      .def_rw("endpoint_up", &variopath::Deployment::endpoint_up)
      .def_rw("endpoint_down", &variopath::Deployment::endpoint_down)
      .def_rw("endpoint_up_gbs", &variopath::Deployment::endpoint_up_gbs)
      .def_rw("endpoint_down_gbs", &variopath::Deployment::endpoint_down_gbs)
      .def_rw("layout", &variopath::Deployment::layout)
      .def_rw("near_ptr", &variopath::Deployment::near_ptr)
      .def_rw("near_links", &variopath::Deployment::near_links)
      .def_rw("near_rate", &variopath::Deployment::near_rate)
      .def_rw("near_via", &variopath::Deployment::near_via);
  nb::class_<variopath::ChoiceDeployment>(m, "ChoiceDeployment",
                                          "What the C++ choice needs of the deployment (planner/native.py).")
      .def(nb::init<>())
      .def_rw("ranks", &variopath::ChoiceDeployment::ranks)
      .def_rw("n_groups", &variopath::ChoiceDeployment::n_groups)
      .def_rw("group_of", &variopath::ChoiceDeployment::group_of)
      .def_rw("endpoint_up", &variopath::ChoiceDeployment::endpoint_up)
      .def_rw("endpoint_down", &variopath::ChoiceDeployment::endpoint_down)
      .def_rw("route_ptr", &variopath::ChoiceDeployment::route_ptr)
      .def_rw("memory_route", &variopath::ChoiceDeployment::memory_route)
      .def_rw("route_rate", &variopath::ChoiceDeployment::route_rate)
      .def_rw("route_root", &variopath::ChoiceDeployment::route_root)
      .def_rw("route_staged", &variopath::ChoiceDeployment::route_staged)
      .def_rw("route_via", &variopath::ChoiceDeployment::route_via)
      .def_rw("route_link_ptr", &variopath::ChoiceDeployment::route_link_ptr)
      .def_rw("route_links", &variopath::ChoiceDeployment::route_links)
      .def_rw("link_cap", &variopath::ChoiceDeployment::link_cap)
      .def_rw("link_class", &variopath::ChoiceDeployment::link_class)
      .def_rw("link_nic", &variopath::ChoiceDeployment::link_nic)
      .def_rw("inst_staged", &variopath::ChoiceDeployment::inst_staged)
      .def_rw("net_staged", &variopath::ChoiceDeployment::net_staged)
      .def_rw("near_staged", &variopath::ChoiceDeployment::near_staged)
      .def_rw("symmetric", &variopath::ChoiceDeployment::symmetric)
      .def_rw("algorithm2_cells", &variopath::ChoiceDeployment::algorithm2_cells)
      .def_rw("link_root_complex", &variopath::ChoiceDeployment::link_root_complex)
      .def_rw("link_uplink", &variopath::ChoiceDeployment::link_uplink)
      .def_rw("root_complexes", &variopath::ChoiceDeployment::root_complexes)
      .def_rw("trigger_factor", &variopath::ChoiceDeployment::trigger_factor);
  nb::class_<variopath::NetParams>(m, "NetParams", "One network model (sim/network.py NetworkModel).")
      .def(nb::init<>())
      .def_rw("name", &variopath::NetParams::name)
      .def_rw("barrier_s", &variopath::NetParams::barrier_s)
      .def_rw("issue_s", &variopath::NetParams::issue_s)
      .def_rw("latency_pcie_s", &variopath::NetParams::latency_pcie_s)
      .def_rw("latency_net_s", &variopath::NetParams::latency_net_s)
      .def_rw("signal_s", &variopath::NetParams::signal_s)
      .def_rw("serial_issue", &variopath::NetParams::serial_issue)
      .def_rw("beta", &variopath::NetParams::beta)
      .def_rw("floor", &variopath::NetParams::floor)
      .def_rw("paced_lossless", &variopath::NetParams::paced_lossless)
      .def_rw("trigger", &variopath::NetParams::trigger)
      .def_rw("trigger_factor", &variopath::NetParams::trigger_factor);
  nb::class_<Planner>(m, "Planner")
      .def(nb::init<nb::bytes, const std::string&, const variopath::Deployment&>(), nb::arg("catalog"),
           nb::arg("fingerprint"), nb::arg("deployment"))
      .def("plan", &Planner::plan, nb::arg("demand"), nb::arg("params"),
           "Plan one AlltoAllv demand (int64 N x N); returns the schedule as flat arrays.");
  nb::class_<variopath::Decision>(m, "Decision", "A decision made ahead of a call (ffi/choice.h)")
      .def(nb::init<>())
      .def(
          "__init__",
          [](variopath::Decision* d, const std::string& plan) {
            const auto& families = variopath::kFamilies;
            if (std::find(std::begin(families), std::end(families), plan) == std::end(families))
              throw nb::value_error(("no family the op runs is named '" + plan + "'").c_str());
            new (d) variopath::Decision{plan, {}, 0};
            d->id = variopath::decision_id(*d);
          },
          nb::arg("plan"), "A family's decision without a split (paced: the reference split; for measurements)")
      .def_ro("plan", &variopath::Decision::plan)
      .def_ro("id", &variopath::Decision::id)
      .def_prop_ro("route_frac", [](const variopath::Decision& d) { return d.route_frac; })
      .def("__repr__", [](const variopath::Decision& d) { return "Decision(" + d.plan + ", id=" + std::to_string(d.id) + ")"; });
  {
    nb::list families;
    for (const char* f : variopath::kFamilies) families.append(f);
    m.attr("FAMILIES") = nb::tuple(families);  // every family the op may run
  }
  m.def("safe_decision", &variopath::safe_decision, "The safe decision (staged): a call site's first call's");
  nb::class_<Chooser>(m, "Chooser")
      .def(nb::init<const Planner&, const variopath::ChoiceDeployment&>(), nb::arg("planner"), nb::arg("deployment"),
           nb::keep_alive<1, 2>())
      .def("choose", &Chooser::choose, nb::arg("demand"), nb::arg("params"), nb::arg("models"), nb::arg("warm"),
           nb::arg("rank") = -1, nb::arg("algorithm2") = true,
           nb::arg("hybrid") = true, nb::arg("every") = false,
           "variopath's choice: the chosen schedule, every candidate's predictions, the split")
      .def("decide", &Chooser::decide, nb::arg("demand"), nb::arg("params"), nb::arg("models"),
           nb::arg("algorithm2") = true, nb::arg("hybrid") = true,
           "The op's decision made ahead from a demand, and the choice's record")
      .def("apply", &Chooser::apply, nb::arg("decision"), nb::arg("demand"), nb::arg("params"), nb::arg("models"),
           nb::arg("algorithm2") = true, nb::arg("rank") = -1,
           "The plan of a demand under a decision made ahead (the op's call path), and apply_s")
      .def("apply_work_s", &Chooser::apply_work_s, nb::arg("decision"), nb::arg("demand"), nb::arg("params"),
           nb::arg("models"), "What the choice estimates applying a decision costs on the call path (s)")
      .def("critical_path_s", &Chooser::critical_path_s, nb::arg("decision"), nb::arg("demand"), nb::arg("params"),
           nb::arg("models"), nb::arg("algorithm2") = true, nb::arg("rank") = 0, nb::arg("repeats") = 25,
           nb::arg("flush_bytes") = int64_t(64) << 20, nb::arg("timeout_s") = 60.0,
           "Seconds of each call of the op's call path, cold (other memory traffic between calls)")
      .def("planning_estimates", &Chooser::planning_estimates, nb::arg("demand"),
           "What the gates expect each costly candidate's planning to cost for a demand (s), and its counts")
      .def("chained", &Chooser::chained, nb::arg("demand"), nb::arg("model"), nb::arg("floor_s") = 0.0,
           "The chained hybrid plan alone (ffi/chained.cc), or None where no reserved rate fits");
  nb::class_<variopath::emulated::Machine>(m, "EmulatedMachine",
                                          "The profiler's emulated machine: injected links, losses and costs on a "
                                          "virtual clock (ffi/emulated_machine.h).")
      .def("__init__", &init_emulated_machine, nb::arg("capacity"), nb::arg("link_class"), nb::arg("beta"),
           nb::arg("floor"), nb::arg("paced_lossless"), nb::arg("routes"), nb::arg("route_source"),
           nb::arg("route_latency"), nb::arg("issue_s"), nb::arg("signal_s"), nb::arg("barrier_s"), nb::arg("jitter"),
           nb::arg("seed"), nb::arg("root_complex") = std::vector<int32_t>(), nb::arg("uplink") = std::vector<bool>(),
           nb::arg("route_pull") = std::vector<bool>(), nb::arg("trigger_factor") = 1.0)
      .def("run", &run_emulated_machine, nb::arg("route"), nb::arg("nbytes"), nb::arg("cap"), nb::arg("step"),
           nb::arg("after"), nb::arg("experiment"),
           "When each transfer ends (seconds after the experiment began; the transfers' fields as arrays).");
  m.def("register_op_config", &register_op_config, nb::arg("id"), nb::arg("catalog"), nb::arg("fingerprint"),
        nb::arg("deployment"), nb::arg("rank_map"), nb::arg("params"), nb::arg("execution"),
        nb::arg("planner").none(), nb::arg("choice"), nb::arg("models"), nb::arg("transport"),
        nb::arg("emulator_seed"), nb::arg("emulator_delay_s"), nb::arg("timeout_s"), nb::arg("debug"),
        nb::arg("staging_budget") = 0, nb::arg("transport_reason") = "", nb::arg("algorithm2") = true,
        "Register a planner configuration for the FFI handlers.");
  m.def("op_config_transport", &op_config_transport, nb::arg("id"),
        "What moves configuration `id`'s bytes (transport), why configure chose it (reason) and its "
        "staging budget in bytes (0: unbounded).");
  m.def("cuda_peers", &cuda_peers,
        "The GPUs this process sees (ordinal, uuid, pci_bus_id, memory in bytes), access[a][b]: whether device a can "
        "access device b's memory (cudaDeviceCanAccessPeer), and the error of the probe (\"\": none).");
  m.def("inject_stall", &inject_stall, nb::arg("rank"), nb::arg("nth"), nb::arg("seconds"),
        "Tests: make `rank` stall before its n-th transfer (rank -1: no fault).");
  m.def("quiesce_handlers", &variopath::quiesce_handlers, nb::arg("timeout_s"), nb::call_guard<nb::gil_scoped_release>(),
        "Interpreter exit: fail the in-process calls in flight and wait (at most timeout_s) until no "
        "collective runs on the CPU handlers' threads; whether none does.");
  m.def("stall_emulated_stream", &variopath::stall_emulated_stream, nb::arg("stream"),
        "Tests: emulated streams made from now on never run stream `stream`'s ops (-1: none).");
  m.def("exchange_on_threads", &exchange_on_threads, nb::arg("config"), nb::arg("site"), nb::arg("inputs"),
        nb::arg("outputs"), nb::arg("counts"), nb::arg("row_bytes"), nb::arg("poison"),
        nb::arg("snapshots") = std::vector<Bytes>{},
        "Tests: all_to_all_v of byte rows on one thread per rank, buffers poisoned as each returns.");
  m.def("unregister_op_config", &variopath::unregister_config, nb::arg("id"));
  // The shared-memory transport's bootstrap (jax_ops/shm.py; ffi/shm_transport.h).
  m.def("shm_create", &variopath::shm::create, nb::arg("id"), nb::arg("processes"), nb::arg("timeout_s"),
        "Process 0: make configuration `id`'s control segment; returns its name.");
  m.def("shm_attach", &variopath::shm::attach, nb::arg("id"), nb::arg("name"), nb::arg("process"),
        nb::arg("processes"), "Processes 1..: attach to configuration `id`'s control segment.");
  m.def("shm_ready", &variopath::shm::ready, nb::arg("id"), nb::arg("cross_memory"),
        "Once every process attached: check them, remove the control segment's name and probe "
        "cross-memory attach to every peer (if `cross_memory`).");
  m.def("shm_agree", &variopath::shm::agree, nb::arg("id"),
        "Once every process is ready: read by cross-memory attach where every process can.");
  m.def(
      "shm_staged_because", [](int64_t id) { return shm_transport(id)->staged_because(); }, nb::arg("id"),
      "\"\" where receivers read senders' rows by cross-memory attach, else why they read staging.");
  m.def(
      "shm_segment_prefix", [](int64_t id) { return shm_transport(id)->segment_prefix(); }, nb::arg("id"),
      "What the names of configuration `id`'s segments in /dev/shm begin with.");
  m.def("shm_slots_in_use", &variopath::shm::slots_in_use, nb::arg("id"),
        nb::call_guard<nb::gil_scoped_release>(), "Tests: the control segment's call slots held by calls.");
  m.def("shm_pids", &variopath::shm::pids, nb::arg("id"), "The pid of each process of configuration `id`.");
  m.def("shm_hold_lock", &variopath::shm::hold_lock, nb::arg("id"), nb::arg("seconds"),
        "Tests: a thread takes configuration `id`'s shared lock and keeps it `seconds`.");
  m.def("shm_release", &variopath::shm::release, nb::arg("id"), nb::call_guard<nb::gil_scoped_release>(),
        "Leave configuration `id`'s transport and remove this process's segments.");
  m.def("shm_release_all", &variopath::shm::release_all, nb::call_guard<nb::gil_scoped_release>());
  m.def("debug_schedule", &debug_schedule, nb::arg("site"),
        "Demand and transfers of the last executed call of a site (configurations with debug=True).");
  m.def(  // issue 30: counting the op's planning (tests/test_layers.py)
      "plan_counts",
      [] {
        const auto c = variopath::plan_counts();
        return std::array<int64_t, 3>{c.planned, c.exact, c.transposed};
      },
      "How the op met its demands since the process started: (planned anew, served from the plan "
      "cache, served by a cached plan of the transposed demand reversed).");
  m.def("batched_copy_on_host", &batched_copy_on_host, nb::arg("src"), nb::arg("src_offset"), nb::arg("dst_size"),
        nb::arg("dst_offset"), nb::arg("nbytes"), nb::arg("threads"),
        "Tests: the batched copy kernel's per-thread code (cuda/copy_split.h) run on the host.");
  m.def("registrations", &registrations, nb::arg("platform") = "cpu",
        "XLA FFI targets of a platform (cpu, cuda): name -> capsule.");
  m.def("canonical_assignment", &variopath::canonical_assignment, nb::arg("weights"), nb::arg("rows"),
        nb::arg("cols"),
        "Lexicographically smallest max-weight assignment of the rows of a rows x cols integer matrix "
        "(row-major, rows <= cols) to distinct columns.");
  // The NCCL transport (nccl/): its library, its plan side (CPU tests) and, with CUDA, its
  // bootstrap (jax_ops/nccl.py) and the GPU check.
  m.def("nccl_library", &nccl_library, nb::arg("path"),
        "Load NCCL (path, or \"\" for the default search); its version and path, or RuntimeError.");
  m.def("nccl_p2p_plan", &nccl_p2p_plan, nb::arg("config"), nb::arg("slices"), nb::arg("recv_sizes"),
        nb::arg("input_rows"), nb::arg("output_rows"), nb::arg("row_bytes"), nb::arg("ragged"),
        nb::arg("local") = false, nb::arg("decision") = variopath::safe_decision(),
        nb::arg("holds") = std::vector<bool>(),
        "Tests: each rank's NCCL sends and receives per step for a call, and the layout's copies.");
  m.def("cuda_devices", &cuda_devices,
        "CUDA devices visible to this process (count, driver/runtime versions, error if none).");
  m.def("peer_write_decision", &peer_write_decision, nb::arg("kind"), nb::arg("owner"), nb::arg("allocation"),
        nb::arg("access"), nb::arg("writer"), nb::arg("peer_enabled"),
        "Tests: whether a kernel on `writer` may store into a buffer with these facts, or the CUDA backend "
        "copies with cudaMemcpyPeerAsync (cuda/peer_access.h): {direct, why}.");
#ifdef VARIOPATH_HAVE_CUDA
  m.def("cuda_transport_log", &variopath::cuda::transport_log,
        "The CUDA transport's decisions and fallbacks so far in this process (peer writes, pageable "
        "reads), oldest first (cuda/cuda_streams.h).");
  m.def(
      "cuda_release_scratch",
      [](double timeout_s) {
        nb::gil_scoped_release release;
        return variopath::cuda::release_scratch(timeout_s);
      },
      nb::arg("timeout_s") = 60.0,
      "Teardown: free the CUDA backend's per-stream scratch once the devices drained; \"\" or the error.");
  m.def("cuda_exchange_on_one_gpu", &cuda_exchange_on_one_gpu, nb::arg("config"), nb::arg("site"), nb::arg("counts"),
        nb::arg("row_bytes"), nb::arg("device"), nb::arg("seed"), nb::arg("max_delay_s"), nb::arg("rounds"),
        "GPU check: all_to_all_v between threads acting as ranks on one GPU (cuda/selftest.h).");
  m.def("cuda_process_exchange", &cuda_process_exchange, nb::arg("config"), nb::arg("site"), nb::arg("rank"),
        nb::arg("counts"), nb::arg("row_bytes"), nb::arg("device"), nb::arg("seed"), nb::arg("max_delay_s"),
        nb::arg("rounds"),
        "GPU check: this process's rank of an all_to_all_v over the configuration's cuda-ipc or cuda-host "
        "transport (cuda/selftest.h).");
  m.def("cuda_profile_run", &cuda_profile_run, nb::arg("route_src"), nb::arg("route_dst"), nb::arg("route_staged"),
        nb::arg("route"), nb::arg("nbytes"), nb::arg("cap"), nb::arg("step"), nb::arg("after"), nb::arg("timeout_s"),
        "The profiler's CUDA backend: one experiment on this process's GPUs (cuda/profile_cuda.h); never ran on a "
        "GPU.");
  m.def("cuda_trigger_run", &cuda_trigger_run, nb::arg("src"), nb::arg("dst"), nb::arg("pull"), nb::arg("nbytes"),
        nb::arg("timeout_s"),
        "The profiler's trigger probe: concurrent pushed (source writes) or pulled (destination reads) peer copies, "
        "released together (cuda/profile_cuda.h); never ran on a GPU.");
  m.def("cuda_copy_bandwidth", &cuda_copy_bandwidth, nb::arg("device"), nb::arg("nbytes"), nb::arg("segments"),
        nb::arg("iterations"), nb::arg("row_bytes") = 0,
        "GPU check: the batched copy kernel (aligned segments, or whole rows of row_bytes) beside a "
        "device-to-device copy (GB/s).");
  m.def("nccl_unique_id", &nccl_unique_id, nb::arg("library"), "Process 0: a new NCCL unique id (128 bytes).");
  m.def("nccl_init", &nccl_init, nb::arg("config"), nb::arg("library"), nb::arg("id"), nb::arg("nranks"),
        nb::arg("ranks"), nb::arg("devices"), nb::arg("timeout_s"),
        "Make configuration `config`'s NCCL communicators, one per local device (RuntimeError on failure).");
  m.def("nccl_release", &variopath::nccl::release, nb::arg("config"), nb::call_guard<nb::gil_scoped_release>(),
        "Free configuration `config`'s NCCL communicators.");
  m.def("nccl_selftest", &nccl_selftest, nb::arg("device"), nb::arg("library"), nb::arg("nbytes"),
        nb::arg("timeout_s"), "GPU check: a one-rank NCCL communicator on `device` ({error, detail}).");
#endif
}
