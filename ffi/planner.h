// The online planner's C++ core: channel-guided demand decomposition (paper §4.2, Algorithm 2).
//
// It mirrors variopath_jax/planner/reference.py step for step (the same step names: quantum,
// aggregate, candidates, flat/factored candidates, select patterns, match, combine,
// multistart AA, evaluate, single lane, activation, route options, disjoint) and decision for
// decision (integer pressures and credits, the lexicographically smallest optimal assignment,
// SplitMix64 starts, first index on ties), so the same inputs and seed give byte-identical
// schedules. What differs is only how answers are found: residual aggregates are kept up to date
// instead of recomputed, shapes are scored cell by cell over the whole catalog in vectorised
// passes, the cross-node matching draws from a heap, and every buffer lives in a per-call
// workspace reused by every activation.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "catalog.h"

namespace variopath {

// What a lane of a candidate channel is; the same values as planner/reference.py LaneKind.
enum class LaneKind : int32_t {
  kFlat = 0,   // a flat catalog's instance
  kIntra = 1,  // a factored catalog's node-local instance, on one node
  kNet = 2,    // a leaving half on one node joined to an arriving half on another
  kRoute = 3,  // the fallback: the nearest route of a group pair
};

// How a factored catalog prices a lane leaving or entering a node (PlannerParams.leaving_price).
enum class LeavingPrice : int32_t { kMax = 0, kSum = 1 };

// How τ follows the demand (PlannerParams.granularity).
enum class Granularity : int32_t { kAuto = 0, kFixed = 1 };

// Link ids of the expanded multi-node graph (topology/model.py LinkLayout): node k's links are
// [k * links_per_node, (k + 1) * links_per_node), then each node's network links in a block of
// net_links_per_node after all node blocks. A node-local id (a one-node graph's) below
// links_per_node is a tree link, at or above it a network link.
struct LinkLayout {
  int32_t nodes = 1;
  int64_t links_per_node = 0;
  int64_t net_links_per_node = 0;

  int64_t total() const { return int64_t(nodes) * (links_per_node + net_links_per_node); }
  int64_t global(int64_t local, int32_t node) const {
    if (local < links_per_node) return int64_t(node) * links_per_node + local;
    return int64_t(nodes) * links_per_node + int64_t(node) * net_links_per_node + (local - links_per_node);
  }
};

// What the planner needs to know about the deployment beyond the catalog (planner/native.py
// builds it from the topology and its PathModel). check() names the first inconsistent field.
struct Deployment {
  int32_t ranks = 0;
  int32_t n_groups = 0;  // all rank groups of the deployment
  int32_t group_size = 0;
  std::vector<int32_t> group_ranks;  // n_groups x group_size
  std::vector<int32_t> group_of;     // rank -> group
  std::vector<int32_t> endpoint_up;  // rank -> link id GPU->parent
  std::vector<int32_t> endpoint_down;  // rank -> link id parent->GPU
  std::vector<double> endpoint_up_gbs;
  std::vector<double> endpoint_down_gbs;
  LinkLayout layout;
  // the nearest route of every ordered group pair (the single-lane fallback), CSR by a*G+d
  std::vector<int64_t> near_ptr;
  std::vector<int32_t> near_links;
  std::vector<double> near_rate;
  std::vector<uint8_t> near_via;

  void check() const;
};

// Algorithm 2's knobs: the fields of planner/reference.py PlannerParams, one for one.
struct PlanParams {
  double lambda_s = 5e-6;
  int64_t k_target = 0;  // 0: N
  int32_t starts = 4;
  int32_t sweeps = 3;
  uint64_t seed = 0;
  Granularity granularity = Granularity::kAuto;
  int32_t max_candidates = 8;
  LeavingPrice leaving_price = LeavingPrice::kMax;

  void check() const;
};

// A planned schedule as flat arrays: transfers grouped by step.
struct PlanResult {
  std::vector<int64_t> step_ptr{0};
  std::vector<int32_t> src, dst;
  std::vector<int64_t> bytes;
  std::vector<double> rate;
  std::vector<int32_t> lane_kind;  // LaneKind
  std::vector<int32_t> lane_inst;  // the catalog instance of kFlat / kIntra lanes, else -1
  std::vector<int64_t> link_ptr{0};
  std::vector<int32_t> links;
  double tau_s = 0;
  int64_t k = 0;
  int64_t fallbacks = 0;
  int64_t candidates = 0;
};

// The catalog's shapes for shape selection (Eq. 6): the dense table, the same cell by cell
// (each cell's column over all shapes, for scoring every shape in one vectorised pass per
// cell), and the profile cells a query may limit (a factored catalog's leaving column and
// arriving row).
struct ShapeTable {
  int64_t count = 0;
  int32_t cells = 0;
  std::vector<int16_t> dense;    // count x cells
  std::vector<int16_t> columns;  // cells x count
  std::vector<int16_t> column_max;
  std::vector<int32_t> profile_cells;

  ShapeTable() = default;
  ShapeTable(std::vector<int16_t> shapes, int64_t count, int32_t cells, std::vector<int32_t> profile_cells);
  // The shape of highest pressure s(M) = sum_c w_c M_c among those whose profile cells stay
  // within limits (nullptr: all), first index on ties; -1 when none fits. scores is scratch.
  int64_t best(const int64_t* w, const int64_t* limits, std::vector<double>& scores) const;
};

class PlannerCore {
 public:
  PlannerCore(const CatalogFile& catalog, Deployment deployment);
  // Thread-safe: every call plans in its own workspace.
  PlanResult plan(const int64_t* demand, const PlanParams& params) const;

  int64_t num_shapes() const { return num_shapes_; }
  int32_t ranks() const { return dep_.ranks; }

 private:
  struct Lane {
    int32_t src_group, dst_group;
    double rate;
    LaneKind kind;
    int32_t node, inst, node2, inst2;
  };
  struct Workspace;

  // Algorithm 2's steps (planner/reference.py, same names)
  void quantum(Workspace& ws) const;
  void aggregate(Workspace& ws) const;
  void consume(Workspace& ws, int32_t i, int32_t j, int64_t x) const;
  void candidates(Workspace& ws) const;
  void flat_candidates(Workspace& ws) const;
  void factored_candidates(Workspace& ws) const;
  void prices(Workspace& ws) const;
  void select_patterns(Workspace& ws) const;
  void match(Workspace& ws) const;
  void combine(Workspace& ws, size_t c, std::vector<Lane>& lanes) const;
  int64_t multistart_aa(const Lane* lanes, size_t count, Workspace& ws) const;
  double evaluate(const Lane* lanes, size_t count, const int32_t* src, const int32_t* dst, Workspace& ws,
                  std::vector<int64_t>& volumes) const;
  void single_lane(Workspace& ws) const;
  void activation(const Lane* lanes, Workspace& ws, PlanResult& res) const;
  void route_options(const Lane& lane, Workspace& ws) const;
  void disjoint(Workspace& ws) const;

  void check_catalog() const;

  bool factored_ = false;
  int32_t cat_groups_ = 0;  // groups in the catalog (incl. O)
  std::vector<int32_t> node_of_group_;
  int64_t num_shapes_ = 0;
  Deployment dep_;
  std::vector<int32_t> inst_src_, inst_dst_;
  std::vector<double> inst_rate_;
  std::vector<int64_t> route_inst_ptr_, route_link_ptr_;
  std::vector<int32_t> route_links_;
  std::vector<uint8_t> route_via_;
  ShapeTable table_;
  std::vector<int64_t> fam_of_shape_ptr_;  // CSR: the families of each shape, in catalog order
  std::vector<int32_t> fam_of_shape_;
  std::vector<int64_t> fam_ptr_;
  std::vector<int32_t> fam_inst_, fam_count_, fam_shape_;
  std::vector<int64_t> flat_lane_ptr_;  // flat catalogs: each family's lanes, built once
  std::vector<Lane> flat_lanes_;
};

// Lexicographically smallest maximum-weight assignment of the rows of a rows x cols integer
// matrix (row-major, rows <= cols) to distinct columns; returns the column of each row. Exposed
// for tests against the Python reference.
std::vector<int32_t> canonical_assignment(const std::vector<int64_t>& weights, int32_t rows, int32_t cols);

}  // namespace variopath
