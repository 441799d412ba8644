// The online planner's C++ core: channel-guided demand decomposition (paper §4.2, Algorithm 2).
//
// It mirrors variopath_jax/planner/reference.py decision for decision (integer pressures and
// credits, the lexicographically smallest optimal assignment, SplitMix64 starts, first index on
// ties), so the same inputs and seed give byte-identical schedules. Buffers are sized once per
// plan; the per-activation loop allocates nothing per lane.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "catalog.h"

namespace variopath {

// What the planner needs to know about the deployment beyond the catalog (built in Python from
// the topology and its PathModel).
struct DeploymentView {
  int32_t ranks = 0;
  int32_t nodes = 1;
  int32_t n_groups = 0;                 // all rank groups of the deployment
  int32_t group_size = 0;
  std::vector<int32_t> group_ranks;     // n_groups x group_size
  std::vector<int32_t> group_of;        // rank -> group
  std::vector<int32_t> endpoint_up;     // rank -> link id GPU->parent
  std::vector<int32_t> endpoint_down;   // rank -> link id parent->GPU
  std::vector<double> endpoint_up_gbs;
  std::vector<double> endpoint_down_gbs;
  int64_t links_per_node = 0;           // factored: node-local link block size
  int64_t net_links_per_node = 0;       // factored: network-block links per node
  // the nearest route of every ordered group pair (the single-lane fallback), CSR by a*G+d
  std::vector<int64_t> near_ptr;
  std::vector<int32_t> near_links;
  std::vector<double> near_rate;
  std::vector<uint8_t> near_via;
};

struct PlanParams {
  double lambda_s = 5e-6;
  int64_t k_target = 0;  // 0: N
  int32_t starts = 4;
  int32_t sweeps = 3;
  uint64_t seed = 0;
  bool auto_granularity = true;
  int32_t max_candidates = 8;
};

// A planned schedule as flat arrays: transfers grouped by step.
struct PlanResult {
  std::vector<int64_t> step_ptr{0};
  std::vector<int32_t> src, dst;
  std::vector<int64_t> bytes;
  std::vector<double> rate;
  std::vector<int32_t> lane_kind;  // >= 0: catalog instance; -1: network lane; -2: fallback route
  std::vector<int64_t> link_ptr{0};
  std::vector<int32_t> links;
  double tau_s = 0;
  int64_t k = 0;
  int64_t fallbacks = 0;
  int64_t candidates = 0;
};

class PlannerCore {
 public:
  PlannerCore(const CatalogFile& catalog, DeploymentView deployment);
  PlanResult plan(const int64_t* demand, const PlanParams& params) const;

  int64_t num_shapes() const { return num_shapes_; }
  int32_t ranks() const { return dep_.ranks; }

 private:
  struct Lane {
    int32_t src_group, dst_group;
    double rate;
    int32_t kind;  // 0 flat, 1 intra, 2 net, 3 fallback
    int32_t node, inst, node2, inst2;
  };

  void flat_candidates(const std::vector<int64_t>& dhat, std::vector<std::vector<Lane>>& out) const;
  void factored_candidates(const std::vector<int64_t>& dhat, std::vector<std::vector<Lane>>& out,
                           int32_t max_candidates) const;
  // Options of one lane appended to flat buffers: option o's links are links[ptr[o], ptr[o+1]).
  struct Options {
    std::vector<int64_t> ptr{0};
    std::vector<int32_t> links;
    std::vector<uint8_t> via;
    std::vector<size_t> lane_first;  // first option of each lane (lane_first[n] .. lane_first[n+1])
    void clear() {
      ptr.assign(1, 0);
      links.clear();
      via.clear();
      lane_first.clear();
    }
  };
  void route_options(const Lane& lane, Options& out) const;
  int64_t global_link(int32_t local, int32_t node) const;

  bool factored_ = false;
  int32_t free_group_ = -1;
  int64_t link_offset_ = 0;
  int32_t cat_groups_ = 0;  // groups in the catalog (incl. O)
  int64_t num_shapes_ = 0;
  DeploymentView dep_;
  std::vector<int32_t> inst_src_, inst_dst_;
  std::vector<double> inst_rate_;
  std::vector<int64_t> route_inst_ptr_, route_link_ptr_;
  std::vector<int32_t> route_links_;
  std::vector<uint8_t> route_via_;
  std::vector<int16_t> shapes_;
  // each shape's non-zero cells, for scoring: (cell, lanes) runs per shape (CSR)
  std::vector<int64_t> shape_nz_ptr_;
  std::vector<int32_t> shape_nz_cell_;
  std::vector<int64_t> shape_nz_count_;
  std::vector<std::vector<int32_t>> families_of_shape_;
  std::vector<int64_t> fam_ptr_;
  std::vector<int32_t> fam_inst_, fam_count_;
};

// Lexicographically smallest maximum-weight perfect assignment of an n x n integer matrix
// (row-major); returns the column of each row. Exposed for tests against the Python reference.
std::vector<int32_t> canonical_assignment(const std::vector<int64_t>& weights, int32_t rows, int32_t cols);

}  // namespace variopath
