// The NCCL transport's plan-side steps, pure C++ with no CUDA or NCCL (issue 16, "Several
// processes"), so that a CPU test checks them (module.cc `nccl_p2p_plan`).
//
// One call: every device of the communicator contributes one fixed-size row of int64 words (its
// group, mesh position, row type, slices and recv_sizes: everything `place` needs of it), the
// rows are all-gathered, and every rank of a group decodes its group's rows into the same
// contributions, so it makes the same placement and plan decisions as every other rank and as
// the other transports (layout.h), and lays out the transfers it sends or receives (the paced
// plan is expanded for it alone; the other plans whole). The layout becomes, per plan step, the
// pieces this rank sends and receives: one ncclSend/ncclRecv each, issued in one group per step.
// Both ends derive their pieces from the same plan in the same order (transfer order, then copy
// order), so the pieces between a pair of ranks match one to one, in order and in size.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "layout.h"

namespace variopath::nccl {

// The words of one rank's row for a call with `slots` slices (all_to_all_v: the axis size;
// ragged: the offsets' length): fixed by the program's shapes, so equal on every device.
int64_t row_words(int64_t slots, bool ragged);

// Write `c` (of collective `group`) into `row` (row_words(slots, c.ragged) words). A contribution
// whose slices do not fill `slots` (a local validation error) writes its error and no slices.
void encode_row(const Contribution& c, int32_t group, int64_t slots, int64_t* row);

// From `count` gathered rows of `words` words: the contributions of collective `group` by mesh
// position (axis of `n` positions; no buffers) and each one's communicator rank (its row's
// index). "" or what is wrong (a row not ours, a position missing or claimed twice).
std::string decode_group(const int64_t* rows, int32_t count, int64_t words, int32_t group, int32_t n,
                         std::vector<Contribution>& parts, std::vector<int32_t>& comm_rank);

// Check, place, plan and lay out a call's contributions as every transport does (layout.h);
// `step_ptr`: the plan's steps over the layout's transfers, each cut before a transfer that
// waits for one of its own step (the groups NCCL issues one after another). With `me` (a mesh
// position) the plan is that rank's (plan_for's `rank`): the layout may hold only the transfers
// it sends or receives, and p2p_steps(…, me) is the same as from the whole plan's. "" or the error.
// `decision`: the one this process holds (the plan applies it where every rank brought its id,
// layout.h agreed_decision); `history` (if given): the call site whose next call is decided from
// this call's demand.
std::string lay_out_call(std::vector<Contribution>& parts, std::shared_ptr<OpConfig>& config, Layout& layout,
                         std::vector<int64_t>& step_ptr, int32_t me = -1, const Decision& decision = safe_decision(),
                         const Decider::Site* history = nullptr);

// One ncclSend or ncclRecv: `nbytes` at `offset` in this rank's input (send) or output (recv).
struct Piece {
  int32_t peer = 0;  // mesh position
  int64_t offset = 0;
  int64_t nbytes = 0;
};

// What rank `me` issues in one plan step (one ncclGroupStart/End).
struct P2pStep {
  std::vector<Piece> sends, recvs;
};

// Rank `me`'s pieces per plan step (every step, empty where it has nothing to do).
std::vector<P2pStep> p2p_steps(const Layout& layout, const std::vector<int64_t>& step_ptr, int32_t me);

}  // namespace variopath::nccl
