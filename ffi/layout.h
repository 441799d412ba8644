// Turning one call's contributions into what the executor runs (issue 16: the plan-and-layout
// step between the rendezvous and the executor): validate what the ranks brought and place the
// received rows, the demand in topology ranks, the plan (cached per configuration), and its
// transfers laid out as byte copies with what each waits for.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective.h"

namespace variopath {

// One byte copy of the laid-out schedule.
struct Copy {
  int64_t src_offset, dst_offset, nbytes;
};

// One planned transfer as executed: its copies and the transfers it waits for.
struct Transfer {
  int32_t src, dst;     // mesh-axis positions
  int32_t step = 0;     // the plan step it belongs to
  double pace_gbs = 0;  // the rate it must not exceed; 0: unpaced
  size_t first_copy = 0, end_copy = 0;
  std::vector<int32_t> after;
};

// What a rank's output arrays receive besides the rows (written by the rank itself).
struct RankResult {
  std::vector<int32_t> recv_counts;                   // all_to_all_v
  std::vector<int32_t> recv_offsets, source_offsets;  // ragged
};

// A call laid out: per-rank results, the copies, the transfers, and per rank the transfers it
// sends (in order) and receives.
struct Layout {
  std::vector<RankResult> results;
  std::vector<Copy> copies;
  std::vector<Transfer> transfers;
  std::vector<std::vector<int32_t>> sends, receives;
};

// Check what every rank brought and place the rows (all_to_all_v: the receiver's layout, in
// source order; ragged: the sender's offsets, checked against the receivers' recv_sizes).
// Fills `out.results` and the demand in topology ranks (bytes, self traffic excluded) and may
// set `parts[i].slices[*].output_row`. "" or the error.
std::string place(std::vector<Contribution>& parts, const OpConfig& config, Layout& out, std::vector<int64_t>& demand);

// The configuration's plan for a demand: from its cache of recent demands, else planned (with
// the core, by the rule of its Execution, or by its external planner, checked) and cached. With
// `transposed`, a cached plan of the transposed demand is served reversed instead of planning:
// only where one planner serves every rank of the call (the in-process transport), since the
// result depends on the cache's history, which processes planning each for itself may not share.
// With `rank` (a topology rank) the plan may hold only the transfers that rank sends or receives:
// the chosen paced plan is expanded for it alone (ChoiceCore::choose), every decision still
// every rank's, for a transport where each rank lays out only its own pieces (nccl/p2p.h).
// kPlanned: the plan applies `decision` (decision_for) to the demand; a cached plan serves (as is,
// or reversed) only a call of the same decision.
std::string plan_for(OpConfig& config, const std::vector<int64_t>& demand, std::shared_ptr<const ExternalPlan>& out,
                     bool transposed = false, int32_t rank = -1, const Decision& decision = safe_decision());

// Deciding ahead (decider.h): the decision `site`'s call applies (the safe one but for kPlanned;
// error: the decider failed or timed out, and the safe decision is returned), and, once the call
// is planned, deciding for its next call from this demand, off the call path.
Decision decision_for(const OpConfig& config, const Decider::Site& site, std::string& error);
void decide_next(const OpConfig& config, const Decider::Site& site, const std::vector<int64_t>& demand);
// A call of several processes, each holding a decision: `mine` where every rank brought its id
// (Contribution::decision), else the safe decision (a rank that missed a call decided from another
// demand; the next call's decisions, all made from this call's demand, agree again).
Decision agreed_decision(const std::vector<Contribution>& parts, const Decision& mine);

// What a kPlanned call does on its call path once the counts are read: the decision applied to the
// demand (ChoiceCore::apply; rank >= 0: that rank's transfers where the family allows) as the op
// executes it, checked. "" or the error. benchmarks/bench_op_call.py times exactly this.
std::string critical_path(const ChoiceCore& chooser, const Decision& decision, const std::vector<int64_t>& demand,
                          const Algorithm2& algorithm2, const std::vector<NetParams>& models, int32_t rank,
                          double timeout_s, ExternalPlan& out);

// How plan_for met the demands it was given since the process started (issue 30): planned anew,
// served from the cache as is, or served by a cached plan of the transposed demand, reversed.
struct PlanCounts {
  int64_t planned = 0, exact = 0, transposed = 0;
};
PlanCounts plan_counts();

// Lay a plan's transfers out as byte copies of the ranks' slices.
void lay_out(const std::vector<Contribution>& parts, const ExternalPlan& made, const OpConfig& config,
             int64_t row_bytes, Layout& out);

}  // namespace variopath
