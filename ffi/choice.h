// variopath's model-aware choice (docs/planner.md "The choice"): every family the op may run,
// the analytic predictor, the paced split, the gates on what planning may cost, the robust choice,
// and the op's decisions made ahead and applied. The only implementation of the choice; its
// sources by job:
//   choice.cc    the deployment's tables, the gates, robust_choice and choose
//   families.cc  barrier and signal-driven activations (from Algorithm 2's PlanResult) and the
//                concurrent families (concurrent, multipath, staged, staged-balanced)
//   split.cc     the paced split (mirror prox, its bounds, the reference split) and its expansion
//   rotation.cc  rot-paced: the paced split over (link, phase) resources, expanded in phases
//   predict.cc   the analytic predictor
//   chained.cc   the chained hybrid plan
//   decision.cc  decisions made ahead (Decision) and applied to a call's counts (apply)
// `cells` reads the demand once into per-rank, per-group sums and `shared_tally` tallies from them
// the rank pairs that the concurrent families and the paced plan send alike.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "planner.h"

namespace variopath {

constexpr int kMaxRootComplexes = 64;  // a link's write targets are a uint64_t bitmask (LinkSums::targets)
constexpr int kLinkClasses = 5;  // sim/network.py LINK_CLASSES: root_p2p, root_dma, switch, nic_out, nic_in
constexpr int kPacedRoutes = 4;  // the most candidate routes a pair's bytes are split over (paced, chained)
constexpr int kMultipathRoutes = 4;  // the most paths multipath splits one pair's bytes over
constexpr int64_t kPacedMinBytes = 4096;  // a split piece smaller than this joins the pair's largest
constexpr int kSplitIterations = 150;  // the most mirror prox iterations from a cold start
constexpr int kWarmIterations = 30;  // from a warm start
constexpr double kSplitTolerance = 0.01;  // the split stops once within 1% of its best lower bound
constexpr double kChainRates[] = {8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0};  // chained's reserved rates (GB/s)
// What planning costs, from above of what benchmarks/bench_planner.py measured on this project's
// shared 2-core machine (each a gate's estimate: planning that may not pay is not done):
// chained per column and mirror prox iteration at the iteration caps (`bench_planner.py chained`:
// 6.5-37.1 ns on 16 points, with room for a busier machine); the paced split per unit of work
// (`bench_planner.py split`: the full split at 0.17-0.69 of its estimate); rot-paced per unit of
// its phase aggregate's split (`bench_planner.py split`, the `rot µs` column: at most 3.7x the
// paced split's cost per unit on l20-cx7 x 1 and 2 and r5080-cx8 x 1, with room); Algorithm 2 per
// activation, per rank and per shape cell scored (`bench_planner.py algorithm2`: at most 3.2 µs per
// rank and 0.37 ns per cell, each with 13% of room).
constexpr double kChainedSPerColumnIteration = 42e-9;
constexpr double kSplitSPerUnit = 3e-9;
constexpr double kRotationSPerUnit = 13e-9;
constexpr double kAlgorithm2SPerRank = 3.6e-6;
constexpr double kAlgorithm2SPerScoredCell = 0.42e-9;
// What applying a decision costs on the op's call path, cold (ChoiceCore::call_path_s; measured by
// benchmarks/bench_call_path.py, each a bound from above of what it measured on this project's
// 2-core machine after 64 MiB of other memory traffic): every call, per demand cell read (a
// concurrent family scans the demand once; paced reads it twice, summing), per transfer built,
// and the fixed parts of paced and of the rotation
constexpr double kCallPathFloorS = 20e-6;
constexpr double kCallPathSPerScannedCell = 1.5e-9;
constexpr double kCallPathSPerSummedCell = 8e-9;
constexpr double kCallPathSPerTransfer = 95e-9;
constexpr double kPacedFloorS = 12e-6;
constexpr double kRotationFloorS = 60e-6;

// every family the op may run (a Decision names one; _native.FAMILIES)
constexpr const char* kFamilies[] = {"concurrent", "multipath", "staged", "staged-balanced", "paced",
                                     "rot-paced",  "barrier",   "signal", "chained"};

// the concurrent families, in the order of the choice's candidates
struct ConcurrentFamily {
  const char* plan;
  int paths;
  bool staged, balanced;
};
constexpr ConcurrentFamily kConcurrentFamilies[] = {{"concurrent", 1, false, false},
                                                    {"multipath", kMultipathRoutes, false, false},
                                                    {"staged", 1, true, false},
                                                    {"staged-balanced", kMultipathRoutes, true, true}};

// What the choice needs of the deployment (planner/native.py native_choice_deployment builds it
// from the PathModel). Routes of group pair (a, d) are route_ptr[a*G+d] .. route_ptr[a*G+d+1],
// every candidate route of the pair fastest first (stable), then memory_route[a*G+d] (or -1).
struct ChoiceDeployment {
  int32_t ranks = 0;
  int32_t n_groups = 0;
  std::vector<int32_t> group_of;
  std::vector<int32_t> endpoint_up, endpoint_down;
  std::vector<int64_t> route_ptr;  // G*G + 1
  std::vector<int64_t> memory_route;  // G*G, a route index or -1
  std::vector<double> route_rate;  // GB/s
  std::vector<uint8_t> route_root;  // class in ROOT_CLASSES (PHB, NODE, SYS)
  std::vector<uint8_t> route_staged, route_via;
  std::vector<int64_t> route_link_ptr;
  std::vector<int32_t> route_links;
  std::vector<double> link_cap;  // B/s
  std::vector<int32_t> link_class;  // index in LINK_CLASSES, -1: never loses
  std::vector<uint8_t> link_nic;  // crossing it pays the network latency
  // whether Algorithm 2's lanes bounce through host memory (planner/native.py: staged_class of
  // the lane's class): per catalog instance, for network lanes, per group pair's nearest route
  std::vector<uint8_t> inst_staged;
  uint8_t net_staged = 0;
  std::vector<uint8_t> near_staged;
  // every link's reverse has its capacity (topology/model.py Graph.symmetric): only then does the
  // op serve the transposed demand with a cached plan reversed, its pacing caps kept
  uint8_t symmetric = 1;
  // the shape cells Algorithm 2 scores per activation
  int64_t algorithm2_cells = 0;
  // the posted-write trigger (sim/network.py RootPorts): per link, the local index of the root
  // complex of the CPU root port it goes up into or comes down from (-1: neither) and whether it
  // goes up into one (an uplink, where the trigger is watched); a node's root complexes (at most
  // kMaxRootComplexes: a link's write targets are a bitmask); the topology's measured factor, else
  // sim/network.py DEFAULT_TRIGGER_FACTOR (planner/native.py native_choice_deployment), which a
  // model without its own factor takes (NetworkModel.trigger_factor_for)
  std::vector<int32_t> link_root_complex;
  std::vector<uint8_t> link_uplink;
  int32_t root_complexes = 1;
  double trigger_factor = 2.0 / 32;

  void check() const;
};

// Algorithm 2's plan of the call's demand, run by the choice only where its plans may pay for
// their planning (empty: its plans are no candidates)
using Algorithm2 = std::function<PlanResult()>;

// One network model (sim/network.py NetworkModel), field for field.
struct NetParams {
  std::string name;
  double barrier_s = 20e-6, issue_s = 1e-6, latency_pcie_s = 1e-6, latency_net_s = 0, signal_s = 1e-6;
  bool serial_issue = true;
  std::array<double, kLinkClasses> beta{}, floor{};
  std::array<uint8_t, kLinkClasses> paced_lossless{};
  // the posted-write trigger (NetworkModel.trigger) and the model's own factor (0: none, the
  // deployment's applies)
  bool trigger = false;
  double trigger_factor = 0;

  double efficiency(int cls, double k) const;
};

// A schedule as flat arrays (the IR of variopath_jax/schedule.py): transfers grouped by step;
// route is an index into ChoiceDeployment's routes (-1 for Algorithm 2's lanes, whose path is
// given, with its lane kind and instance); rate is the cap in GB/s; after lists (step, index) pairs. step_overhead < 0: λ;
// step_chain: the step waits for the previous one (else for none).
struct ChoiceSchedule {
  std::string plan;
  std::vector<int64_t> step_ptr{0};
  std::vector<double> step_overhead;
  std::vector<uint8_t> step_chain;
  std::vector<int32_t> src, dst, route, carries_i, carries_j;
  std::vector<int32_t> lane_kind, lane_inst;  // Algorithm 2's lanes (planner.h PlanResult), else -1
  std::vector<int64_t> bytes;
  std::vector<double> rate;
  std::vector<uint8_t> staged;
  std::vector<int64_t> link_ptr{0};
  std::vector<int32_t> links;
  std::vector<int64_t> after_ptr{0};
  std::vector<int32_t> after_step, after_index;
  double horizon_s = 0;  // paced plans
  // no link ever carries two transfers at once (contention-free activations, and their
  // link-exclusive signal-driven form): no contention parameter changes its prediction
  bool link_exclusive = false;
  // for an executor (filled for the chosen schedule): per transfer its pacing cap in B/s (the
  // paced families, paced and chained: every transfer its planned rate), or 0 where it runs as
  // fast as it can (Algorithm 2's lanes, the unpaced plans)
  std::vector<double> cap_bps;
  // whether add() lists each transfer's path in links (the op's call path needs none: it keeps
  // link_ptr, every transfer's list empty)
  bool with_links = true;

  size_t transfers() const { return src.size(); }
  void reserve(size_t transfers, size_t path_links);  // room for this many transfers and path links
  void add(int32_t i, int32_t j, int32_t r, int64_t x, double rate, const ChoiceDeployment& dep);
};

// Rank-level columns of the hybrid plans: every pair with demand, in
// row-major order, on each of its kPacedRoutes fastest candidate routes; per column its rank
// pair, route, pair index and full path (endpoint links included); per pair its volume and first
// column.
struct Columns {
  std::vector<int32_t> src, dst, route, pair_of;
  std::vector<int64_t> link_ptr{0};
  std::vector<int32_t> links;
  std::vector<int64_t> volume, pair_first;

  size_t size() const { return src.size(); }
};

// The root entries (columns crossing a root-complex link) coloured into phases: entry[e] is a
// column, phase[e] its phase, root_of[e] its root-complex links, sorted.
struct Phases {
  std::vector<int32_t> entry, phase;
  int32_t count = 0;
  std::vector<std::vector<int32_t>> root_of;
};

// Some transfers' sums as a link's tally adds them: count, bytes, summed caps (B/s), peer-to-peer
// count, kinds (bit 0: one through a NIC crosses the link, bit 1: one not), and on an uplink the
// root complexes its transfers push writes toward (bit c: root complex c).
struct LinkSums {
  double flows = 0, load = 0, cap_sum = 0, p2p = 0;
  int kinds = 0;
  uint64_t targets = 0;

  void add(double count, double bytes, double cap, bool staged, bool nic) {
    flows += count;
    load += bytes;
    cap_sum += count * cap;
    p2p += staged ? 0.0 : count;
    kinds |= nic ? 1 : 2;
  }
  void add(const LinkSums& o) {
    flows += o.flows;
    load += o.load;
    cap_sum += o.cap_sum;
    p2p += o.p2p;
    kinds |= o.kinds;
    targets |= o.targets;
  }
};

// Where transfers push writes (sim/network.py RootPorts.writes): per route, (uplink, target root
// complex) pairs (ptr[r] .. ptr[r + 1]), the same for every rank pair unless the route is
// per_transfer (it crosses endpoint links of which one is a root port's: a GPU directly on a root
// port), whose transfers' writes are found path by path.
struct RouteWrites {
  std::vector<int64_t> ptr{0};
  std::vector<int32_t> link, target;
  std::vector<uint8_t> per_transfer;
};

// A one-step plan without signals as its prediction needs it, under any model:
// per link its transfers' sums (LinkSums, one struct a link: the prediction reads them together);
// the largest own time of each kind (-inf: none); the step's overhead (< 0: λ). add_links takes
// one transfer (choice.cc's RouteTally fills it per route, so a family is tallied without
// building its schedule).
struct Tally {
  std::vector<LinkSums> link;
  double own_nic = -std::numeric_limits<double>::infinity();
  double own_pcie = -std::numeric_limits<double>::infinity();
  double overhead = -1.0;

  explicit Tally(size_t n_links = 0) : link(n_links) {}
  void add_links(const int32_t* links, size_t count, int64_t x, double rate, bool staged, const ChoiceDeployment& dep);
  void merge(const Tally& other);  // adds other's transfers (same links)
};

// The paced plan before it is a schedule: each route's segment of
// its group pair's bytes (route_bounds), the horizon, and every rank's pieces tallied, not kept,
// at their routes' rates (their count, loads, flows and kinds; those caps and own times are
// replaced by paced_tally: each piece runs at bytes / horizon, below its route's rate, since the
// horizon is at least every piece's time at that rate); expand walks the pieces again for the
// ranks it is asked for.
struct PacedPieces {
  std::vector<int64_t> bounds;
  double horizon_s = 0;
  size_t count = 0;
  Tally at_route_rates;
};

// The demand read once (choice.cc ChoiceCore::cells): per rank i and destination group d, i's
// nonzero entries towards d's ranks (count, bytes, the largest: out_*[i*G + d]); per source
// group a and rank j, a's ranks' entries towards j (in_*[a*N + j]). The steps that sum the demand
// per rank, per group pair or per rank and group (the concurrent families' and the paced plan's
// tallies of one-route group pairs, aggregate, the endpoint bound, chained's work) read these
// instead of the N x N matrix: integer sums, exact in any order.
struct DemandCells {
  std::vector<int64_t> out_count, out_bytes, out_top;
  std::vector<int64_t> in_count, in_bytes;
  int64_t nonzero = 0;  // entries with demand
};
// Per rank of n, its G out_* cells summed (sent[i]) and its G in_* cells summed (received[j]):
// rank_totals(cells.out_bytes, cells.in_bytes, ...) gives each rank's bytes out and in.
void rank_totals(const std::vector<int64_t>& out_cells, const std::vector<int64_t>& in_cells, int32_t n, int32_t G,
                 std::vector<int64_t>& sent, std::vector<int64_t>& received);

// Some routes numbered compactly: route[k] is the k-th, of_route[r] its number (-1: not one).
struct RouteSlots {
  std::vector<int32_t> of_route, route;
};

// A decision made ahead of a call (issue 51; docs/planner.md "Deciding ahead"): the family the op
// runs and, for the paced families, their split per (group pair, candidate route), made from a
// previous demand; ChoiceCore::apply makes the plan of the current demand from it, doing work
// proportional to the transfers it builds. route_frac[(a*G + d)*kPacedRoutes + r] is the
// fraction of group pair (a, d)'s bytes on its r-th candidate route (-1: none decided; the
// paced split's for paced, the phase split's for rot-paced; empty: the deployment's reference
// split for paced, by route rate for rot-paced). id: a hash of plan and fractions, what the
// ranks compare to agree on one decision.
struct Decision {
  std::string plan = "staged";
  std::vector<double> route_frac;
  uint64_t id = 0;
};
// The safe decision: NCCL's own plan (staged), which needs no planning, for a call site's first
// call and wherever the ranks do not hold one decision.
Decision safe_decision();
uint64_t decision_id(const Decision& decision);  // a hash of its plan and fractions (FNV-1a)
// every transfer of the paced families (paced, rot-paced, chained) capped at its rate (cap_bps),
// the others at none
void set_caps(ChoiceSchedule& s);

// The choice: every candidate's predicted time per model, the regret, the chosen schedule.
struct Choice {
  std::vector<std::string> candidates;
  std::vector<std::vector<double>> predicted;  // [model][candidate]
  std::vector<double> regret;
  int32_t chosen = 0;
  ChoiceSchedule schedule;
  std::vector<double> fractions;  // the paced split's, to warm-start the next call
  Decision decision;  // the chosen family and its split, for the next call to apply
  int split_iterations = -1;  // the most mirror prox iterations it was given (-1: not solved)
  double endpoint_s = 0;  // the endpoint bound: no plan moves the data faster
  // where the call's time went (reported by benchmarks; no decision depends on it): Algorithm 2
  // (0 where it did not pay), building the other candidates but paced, the paced split
  // (aggregate, solve, expand), the chained plan, predicting
  double paper_s = 0, build_s = 0, split_s = 0, hybrid_s = 0, predict_s = 0;
  // ahead: per candidate, what applying it costs on the call path (call_path_s), which the choice
  // adds to its predicted time under every model
  std::vector<double> call_path_s;
};

// The group-level paced split problem: resources (the links, or the
// chained plan's resources, chain_problem) with their capacity (B/s) and fixed load;
// per column its pair, route, and resources with the share of its bytes each takes (col_coef).
// Start: where mirror prox starts, per column its fraction, per link its weight
struct SplitStart {
  std::vector<double> frac, weight;
};

// Split: what mirror prox returns, the fractions, the mean link weights and the lower
// bound it proved on every split's max_time (s)
struct Split {
  std::vector<double> frac, weight;
  double bound_s = 0;
};

struct Aggregate {
  std::vector<int32_t> pair_a, pair_d;
  std::vector<double> volume;
  std::vector<double> base;
  std::vector<double> cap;
  std::vector<int32_t> col_pair, col_route;
  std::vector<int64_t> col_ptr;
  std::vector<int32_t> col_links;
  std::vector<double> col_coef;
  std::vector<int64_t> first_col;  // per pair, its first column or -1
  std::vector<int64_t> pair_of_group;  // a*G+d -> pair index or -1
};

// The rotation's split problem: an Aggregate over (link l, phase k) resources
// (index (k - 1) L + l, capacity C_l / K, K = R - 1 phases), per column its column in the paced
// aggregate (source), per group pair its one kept route where it has no columns (-1: it has)
struct Phased {
  Aggregate agg;
  int32_t phases = 0;
  std::vector<int64_t> source;
  std::vector<int32_t> pair_route;
};

// How the rotation cuts each group pair (a*G + d): its routes kept (a phase other than kOwn; at
// most kPacedRoutes, candidate order) and, where it keeps two or more, their fractions, summing
// to 1 (count 0: the pair has no route the rotation may take)
struct RotationSplit {
  std::vector<int32_t> count;  // G*G
  std::vector<int32_t> route;  // G*G*kPacedRoutes
  std::vector<double> frac;    // G*G*kPacedRoutes
};

// The entry point for an executor (the op): ChoiceCore::choose, once per call with the gathered
// demand and Algorithm 2's plan of it; every rank derives the same Choice. Its schedule lists, per
// step, each transfer's src, dst, route (an index into ChoiceDeployment's routes, or -1 with its
// path in links), bytes, carries (i, j), cap_bps and after (step, index) pairs; plan names it;
// predicted holds every candidate's time under every model.
class ChoiceCore {
 public:
  explicit ChoiceCore(ChoiceDeployment dep);

  // The candidate of least regret over models (one model: its fastest); the paced plan,
  // Algorithm 2's plans (algorithm2 empty: none) and the chained plan (hybrid false: none) are
  // candidates where they may pay for their planning; hybrid: the chained plan is one
  // (gaps of gap_network's model); warm: a previous call's paced fractions (or empty). rank >= 0: the
  // chosen plan holds only the transfers that rank sends or receives if it is the paced plan
  // (decisions are every rank's; the multi-host transport lays out only its own pieces).
  // ahead: the choice is a Decision made ahead of the call that applies it (Choice::decision;
  // apply): the paced split, which apply reuses, runs whatever it costs, while Algorithm 2's plans
  // and chained, which apply plans anew on the call path, are candidates only where that pays.
  Choice choose(const int64_t* demand, const Algorithm2& algorithm2, const std::vector<NetParams>& models,
                const std::vector<double>& warm, int32_t rank, bool hybrid = true, bool every = false,
                bool ahead = false) const;

  // The plan of `demand` under a decision made ahead (decision.cc): the decided family built for
  // this demand, the paced families with the decided split (a group pair it does not cover takes
  // the deployment's reference split); Algorithm 2's plans and chained are planned anew (their
  // structure follows the demand), algorithm2 empty or chained not found: staged. rank >= 0: the
  // concurrent families and paced hold only the transfers that rank sends or receives. Valid for
  // any demand and deterministic: every rank applying one decision to one demand gets one plan.
  // with_links: the transfers' paths listed (the op's call path lists none; ChoiceSchedule)
  ChoiceSchedule apply(const Decision& decision, const int64_t* demand, const Algorithm2& algorithm2,
                       const std::vector<NetParams>& models, int32_t rank, bool with_links = true) const;

  // The steps, exposed for the parity tests.
  ChoiceSchedule barrier(const PlanResult& paper) const;
  ChoiceSchedule signal_driven(const ChoiceSchedule& s) const;
  // rank >= 0: only the transfers that rank sends or receives, in row-major order
  // with_links: ChoiceSchedule::with_links
  ChoiceSchedule concurrent(const int64_t* demand, int paths, bool staged, bool balanced, int32_t rank = -1,
                            bool with_links = true) const;
  DemandCells cells(const int64_t* demand) const;
  // the tally of the rank pairs of shared group pairs (shared_cells_), which every concurrent family and
  // the paced plan send alike (that route, all the bytes, at its rate): from the cells, once for
  // the five
  Tally shared_tally(const DemandCells& cells) const;
  // the four concurrent families' tallies (concurrent, multipath, staged, staged-balanced): each
  // family's other pairs, and the shared ones
  std::vector<Tally> concurrent_tallies(const int64_t* demand, const DemandCells& cells, const Tally& shared) const;
  Aggregate aggregate(const DemandCells& cells) const;
  std::vector<double> initial_fractions(const Aggregate& agg) const;
  std::vector<double> link_loads(const Aggregate& agg, const std::vector<double>& frac) const;
  double max_time(const Aggregate& agg, const std::vector<double>& frac) const;
  // lower_bound; per_link and cheapest are scratch
  double lower_bound(const Aggregate& agg, const std::vector<double>& weight, std::vector<double>& per_link,
                     std::vector<double>& cheapest) const;
  // solve: from start (reference_start) if given, else from warm (a previous call's
  // fractions) if not empty, else cold; certified against the dual bound or floor_s
  // uniform_weight, mirror_prox
  std::vector<double> uniform_weight(const Aggregate& agg) const;
  Split mirror_prox(const Aggregate& agg, std::vector<double> frac, std::vector<double> weight, int iterations,
                    double floor_s, double tolerance) const;
  // cut_bound: the bound of the most loaded links' cuts
  double cut_bound(const Aggregate& agg, const std::vector<double>& frac) const;
  // (at most `iterations` either way)
  Split solve(const Aggregate& agg, const std::vector<double>& warm, const SplitStart* start = nullptr,
              double floor_s = 0, int iterations = kSplitIterations) const;
  // reference_start: the start from the deployment's reference split
  SplitStart reference_start(const Aggregate& agg) const;
  // expand in two halves: every rank's pieces summed and the horizon, then the schedule
  // (rank >= 0: the pieces it sends or receives); paced_tally: the sums as the plan's tally
  PacedPieces paced_pieces(const int64_t* demand, const DemandCells& cells, const Aggregate& agg,
                           const std::vector<double>& frac, const Tally& shared) const;
  ChoiceSchedule expand(const int64_t* demand, const Aggregate& agg, const PacedPieces& pieces, int32_t rank) const;
  Tally paced_tally(const PacedPieces& pieces) const;
  // the chained hybrid plan: false where no column crosses a
  // root complex (it would be paced) or no reserved rate leaves every link room; gap_net gives the
  // gaps; floor_s: a data time no plan over the same routes beats (the
  // paced split's bound), the rates tried stopping once a plan is within kSplitTolerance of it
  bool chained(const int64_t* demand, const NetParams& gap_net, ChoiceSchedule& out, double floor_s = 0) const;
  // chained_work_s / endpoint_bound_s: what building chained is expected to cost (s),
  // and no plan's data time is shorter than the endpoint bound (s)
  double chained_work_s(const DemandCells& cells) const;
  // split_iterations: the most iterations of the paced split (split_work_s: solving it
  // and summing its pieces) a planning slack (s) pays for (-1: not even none)
  int split_iterations(const Aggregate& agg, const DemandCells& cells, double slack_s) const;
  // what rot-paced's split (over the phase aggregate's resources, `iterations` at most), its
  // expansion and prediction are expected to cost (s), at kRotationSPerUnit per unit of work
  double rotation_work_s(const Phased& ph, const DemandCells& cells, int iterations) const;
  // algorithm2_work_s: what Algorithm 2 is expected to cost (s), from a lower bound on its
  // activations (a channel serves a rank once: the most peers a rank sends to or receives from)
  double algorithm2_work_s(const DemandCells& cells) const;
  int64_t algorithm2_activations(const DemandCells& cells) const;
  // what the paced split (`iterations` at most) and its pieces are expected to cost (s), and its
  // units of work (per iteration every column's links and every link; beside them the cold
  // start's check and every rank pair with demand)
  double split_work_s(const Aggregate& agg, const DemandCells& cells, int iterations) const;
  double split_units(const Aggregate& agg, const DemandCells& cells, int iterations) const;
  // what applying a decision for `plan` costs on the op's call path (s, cold; the k*CallPath*
  // constants), given the transfers of its whole plan: a rank builds its own share (2/N of them)
  // of a rank-local family's, every one of the rotation's; Algorithm 2's plans and chained, planned
  // anew on the call path, their planning estimates (work_s)
  double call_path_s(const std::string& plan, double transfers, double work_s = 0) const;
  double endpoint_bound_s(const DemandCells& cells) const;
  Columns route_columns(const int64_t* demand) const;
  Phases colour(const Columns& col) const;
  std::vector<double> gaps(const Columns& col, const Phases& ph, const NetParams& net) const;
  std::vector<int64_t> concurrent_entries(const Columns& col, const Phases& ph) const;
  void slots(const Phases& ph, std::vector<int32_t>& slot, std::vector<int32_t>& slot_group) const;
  bool chain_problem(const Columns& col, const Phases& ph, const std::vector<double>& gap,
                     const std::vector<int64_t>& held, const std::vector<int32_t>& slot,
                     const std::vector<int32_t>& slot_group, double rate, Aggregate& out) const;
  // _chain_split: one rate's split, cold or from the previous rate's (warm.frac empty: cold)
  SplitStart chain_split(const Aggregate& agg, const SplitStart& warm) const;
  std::vector<int64_t> chain_bytes(const Columns& col, const Aggregate& agg, const std::vector<double>& frac) const;
  double chain_time(const Columns& col, const Phases& ph, const std::vector<double>& gap,
                    const std::vector<int64_t>& held, double rate, const std::vector<int64_t>& nbytes) const;
  double free_horizon(const Columns& col, const std::vector<int64_t>& held, double rate,
                      const std::vector<double>& x) const;
  ChoiceSchedule emit_chains(const Columns& col, const Phases& ph, const std::vector<int64_t>& held, double rate,
                             const std::vector<int64_t>& nbytes) const;
  std::vector<std::vector<double>> data_times(const ChoiceSchedule& s, const NetParams& net) const;
  double predict(const ChoiceSchedule& s, const NetParams& net) const;
  // tally / predict_tally: a one-step plan without signals in closed form
  bool tally(const ChoiceSchedule& s, Tally& out) const;
  double predict_tally(const Tally& t, const NetParams& net) const;
  // the fraction of its capacity a triggered uplink keeps under net (NetworkModel
  // trigger_factor_for), 0 where nothing triggers (no trigger, or one root complex a node)
  double trigger_factor(const NetParams& net) const;
  // the paced plan in R - 1 equal phases: its split over
  // phase_aggregate's resources from the paced split's fractions (paced_frac, columns of
  // paced_agg), certified against floor_s, iterations at most, expanded by expand_rotated; false
  // where it is not built (one root complex, a group pair of dropped routes only, a transfer
  // writing toward its own root complex or on two uplinks, no uplink writing toward two)
  // route_frac (if given): the phase split as a Decision's table (route_table). ph: the phase
  // aggregate (phase_aggregate of cells and paced_agg), which the gate sizes first
  bool rot_paced(const int64_t* demand, const Phased& ph, const std::vector<double>& paced_frac, double floor_s,
                 int iterations, ChoiceSchedule& out, std::vector<double>* route_frac = nullptr) const;
  // a split's fractions as a Decision's table (per group pair and candidate route; decision.cc)
  std::vector<double> route_table(const Aggregate& agg, const std::vector<double>& frac) const;
  // a table completed for every group pair of several routes: its fractions where it has them,
  // else the reference split's, else by route rate, each pair's normalized, so that applying it
  // reads fractions alone
  std::vector<double> complete_table(const std::vector<double>& table) const;
  // the paced plan of a demand from a complete table (apply's paced; the same plan as expand of
  // paced_pieces with the table's fractions): two passes over the demand, the horizon from
  // per-route loads, only `rank`'s pieces kept (rank < 0: all)
  ChoiceSchedule apply_paced(const int64_t* demand, const std::vector<double>& table, int32_t rank,
                             bool with_links = true) const;
  // phase_aggregate / expand_rotated
  bool phase_aggregate(const DemandCells& cells, const Aggregate& paced_agg, Phased& out) const;
  bool expand_rotated(const int64_t* demand, const RotationSplit& split, ChoiceSchedule& out,
                      bool with_links = true) const;
  // the rotation's split of a phase split (phase_aggregate's columns) or of a decided table
  // (Decision::route_frac over the same routes; a pair it does not cover: by route rate)
  RotationSplit rotation_split(const Phased& ph, const std::vector<double>& frac) const;
  RotationSplit rotation_split(const std::vector<double>& table) const;

  const ChoiceDeployment& deployment() const { return dep_; }

 private:
  // concurrent: rank pair (i, j)'s transfers (total bytes, group pair `pair`)
  // under a concurrent family, and every rank pair's
  template <class Sink>
  void concurrent_pair(int32_t i, int32_t j, int64_t total, int64_t pair, int paths, bool staged, bool balanced,
                       Sink& out) const;
  template <class Sink>
  void concurrent_into(const int64_t* demand, int paths, bool staged, bool balanced, Sink& out) const;
  void link_loads_into(const Aggregate& agg, const std::vector<double>& frac, std::vector<double>& load) const;
  std::vector<int64_t> route_bounds(const Aggregate& agg, const std::vector<double>& frac) const;
  // expand's walk: visit(i, j, route, bytes) for every piece of every rank pair in
  // row-major order, each pair cut by segment at its offset in its group pair
  template <class Visit>
  void for_each_piece(const int64_t* demand, const Aggregate& agg, const std::vector<int64_t>& bounds,
                      Visit&& visit) const;
  // the rank pairs with demand of group pairs with several routes, each group pair's in
  // row-major order (the order of expand's offsets): visit(i, j, pair index, offset, bytes)
  template <class Visit>
  void for_each_split_pair(const int64_t* demand, const Aggregate& agg, Visit&& visit) const;
  // a rank pair's pieces (segment of its bytes at its offset, or its one route's)
  template <class Visit>
  void pieces_of(int32_t i, int32_t j, int64_t volume, int64_t offset, const Aggregate& agg,
                 const std::vector<int64_t>& bounds, Visit&& visit) const;
  // sim/fluid.py delivered_capacity for link l; targets: the root complexes its writes go to,
  // factor: trigger_factor(net)
  double delivered(const NetParams& net, size_t link, double flows, double cap_sum, double p2p, uint64_t targets,
                   double factor) const;
  void solve_reference();  // the reference split, once per deployment
  // route_phase: route r's phase for group pair (a, d), from its first ranks' transfer
  int32_t route_phase(int32_t a, int32_t d, size_t r) const;

  ChoiceDeployment dep_;
  std::vector<uint8_t> route_nic_;  // per route: one of its links pays the network latency
  RouteWrites writes_;  // per route, where its transfers push writes
  size_t max_path_links_ = 0;  // the most links of one transfer's path, endpoint links included
  std::vector<int64_t> fastest_end_;  // per group pair (a*G+d): the end of its fastest routes' run
  // per group pair and concurrent family (pair*4 + f, kConcurrentFamilies' order): the first
  // family that sends the pair's rank pairs alike (itself, or concurrent for staged and multipath
  // for staged-balanced where no root-complex route makes them differ)
  std::vector<uint8_t> family_of_;
  size_t most_routes_ = 0, most_members_ = 0;  // the most candidate routes of a group pair, ranks of a group
  // per group pair, whether it is a shared pair (route >= 0): one route, not through a root
  // complex, so every concurrent family and the paced plan send its rank pairs alike (the same
  // transfer: that route, all the bytes, its rate), and every one of them through a NIC or none
  // (RouteTally::add's rule), so that shared_tally takes them from the cells; and then its route,
  // the route's rate in B/s and whether a transfer on it crosses its endpoint links (via), bounces
  // through host memory (staged) and goes through a NIC (nic)
  struct SharedCell {
    double cap = 0;
    int32_t route = -1;
    uint8_t via = 0, staged = 0, nic = 0;
  };
  std::vector<SharedCell> shared_cells_;
  // the ranks of each group, ascending (members_ptr_[g] .. members_ptr_[g + 1]), and per group a
  // the groups d of its group pairs with several routes (split_ptr_[a] .. split_ptr_[a + 1]) and
  // of those with one route that are not shared (root_ptr_, root_dest_: through a root
  // complex, or a NIC rule that varies between their rank pairs)
  std::vector<int32_t> members_ptr_, members_, split_ptr_, split_dest_, root_ptr_, root_dest_;
  // and the groups d of its group pairs that are not shared, ascending (other_ptr_, other_dest_)
  std::vector<int32_t> other_ptr_, other_dest_;
  // the routes a rank pair of a group pair that is not shared may take (its candidate
  // routes and its memory route): the tallies of those pairs (the concurrent families' own,
  // paced_pieces') keep per-route sums for these alone
  RouteSlots other_routes_;
  // the reference split: per group pair (a*G+d)*kPacedRoutes + its r-th
  // candidate route, the fraction (-1: none), and the reference solve's mean link weights
  std::vector<double> reference_frac_, reference_weight_;
  std::vector<double> reference_table_;  // complete_table of the reference split alone
  // per group pair, the routes the rotation keeps (RotationSplit's count and route; two or more
  // root complexes a node only)
  std::vector<int32_t> rotation_count_, rotation_route_;
};

// schedule.py signal_driven's rule: each transfer, in step order, waits for its sender's sends of
// the last step it sent in, its receiver's receives of the last step it received in and the
// transfers of the last step that crossed each of its links (none where link_ptr does not have
// one entry more than the transfers; links below n_links); per transfer t its waits, transfer
// indices ascending and once each, are after[ptr[t] .. ptr[t + 1]).
struct SignalWaits {
  std::vector<int64_t> ptr{0};
  std::vector<int32_t> after;
};
SignalWaits signal_waits(const std::vector<int64_t>& step_ptr, const std::vector<int32_t>& src,
                         const std::vector<int32_t>& dst, const std::vector<int64_t>& link_ptr,
                         const std::vector<int32_t>& links, size_t ranks, size_t n_links);

// _segment: a rank pair's bytes per route (share[0..count)), the overlap of [offset,
// offset + volume) with each route's segment (bounds: each segment's end); pieces under
// kPacedMinBytes (or a millionth of the pair) join the largest.
void segment(const int64_t* bounds, int64_t count, int64_t offset, int64_t volume, int64_t* share);

// Whether two models differ in their contention parameters alone (β, floor, paced_lossless).
bool same_costs_but_contention(const NetParams& a, const NetParams& b);

// planning_slack / planning_pays: the most, over the models, that the best
// candidate so far takes beyond the least a further candidate could take there (s); planning
// (work_s) may pay where it is less.
double planning_slack(const std::vector<double>& best_s, const std::vector<NetParams>& models, double bound_s);
bool planning_pays(const std::vector<double>& best_s, const std::vector<NetParams>& models, double work_s,
                   double bound_s);

// Minimax regret over predicted[model][candidate], among the
// candidates predicted no slower than `safe` (NCCL's own plan, staged) under the first model, the
// default (issue 51 item 4: whatever the hedge, the op's plan is never predicted slower than
// NCCL's under the default model); safe < 0: every candidate.
int32_t robust_choice(const std::vector<std::vector<double>>& predicted, std::vector<double>& regret,
                      int32_t safe = -1);

}  // namespace variopath
