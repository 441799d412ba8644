#include "nccl/p2p.h"

#include <algorithm>
#include <cstring>

namespace variopath::nccl {

namespace {

constexpr int64_t kMagic = 0x316c63636e726176;  // "varnccl1"
constexpr int64_t kErrorWords = 32;             // a local error's first 256 bytes
// header words
enum : int64_t {
  kMagicAt,
  kWordsAt,
  kGroupAt,
  kRankAt,
  kConfigAt,
  kAxisAt,
  kRowBytesAt,
  kDtypeAt,
  kInputRowsAt,
  kOutputRowsAt,
  kRaggedAt,
  kSlicesAt,
  kRecvAt,
  kErrorBytesAt,
  kDecisionAt,
  kHeader
};

}  // namespace

int64_t row_words(int64_t slots, bool ragged) { return kHeader + kErrorWords + 4 * slots + (ragged ? slots : 0); }

void encode_row(const Contribution& c, int32_t group, int64_t slots, int64_t* row) {
  const int64_t words = row_words(slots, c.ragged);
  std::fill(row, row + words, 0);
  const bool whole = static_cast<int64_t>(c.slices.size()) == slots &&
                     (!c.ragged || static_cast<int64_t>(c.recv_sizes.size()) == slots);
  std::string error = c.error;
  if (error.empty() && !whole) error = "its slices do not match the call's shapes";
  row[kMagicAt] = kMagic;
  row[kWordsAt] = words;
  row[kGroupAt] = group;
  row[kRankAt] = c.rank;
  row[kConfigAt] = c.config;
  row[kAxisAt] = c.axis_size;
  row[kRowBytesAt] = c.row_bytes;
  row[kDtypeAt] = c.dtype;
  row[kInputRowsAt] = c.input_rows;
  row[kOutputRowsAt] = c.output_rows;
  row[kRaggedAt] = c.ragged ? 1 : 0;
  std::memcpy(row + kDecisionAt, &c.decision, sizeof c.decision);
  const size_t error_bytes = std::min<size_t>(error.size(), kErrorWords * sizeof(int64_t));
  row[kErrorBytesAt] = static_cast<int64_t>(error_bytes);
  std::memcpy(row + kHeader, error.data(), error_bytes);
  if (!error.empty()) return;
  row[kSlicesAt] = slots;
  row[kRecvAt] = c.ragged ? slots : 0;
  int64_t* at = row + kHeader + kErrorWords;
  for (const Slice& s : c.slices) {
    at[0] = s.dest;
    at[1] = s.input_row;
    at[2] = s.rows;
    at[3] = s.output_row;
    at += 4;
  }
  for (int64_t r : c.recv_sizes) *at++ = r;
}

std::string decode_group(const int64_t* rows, int32_t count, int64_t words, int32_t group, int32_t n,
                         std::vector<Contribution>& parts, std::vector<int32_t>& comm_rank) {
  if (n < 1) return "a mesh axis of " + std::to_string(n) + " devices";
  parts.assign(n, {});
  comm_rank.assign(n, -1);
  for (int32_t d = 0; d < count; ++d) {
    const int64_t* row = rows + static_cast<size_t>(d) * words;
    if (row[kMagicAt] != kMagic || row[kWordsAt] != words)
      return "the row of communicator rank " + std::to_string(d) + " is not this call's (" +
             std::to_string(row[kWordsAt]) + " words, expected " + std::to_string(words) +
             "): the devices run different programs";
    if (row[kGroupAt] != group) continue;
    const int64_t p = row[kRankAt];
    if (p < 0 || p >= n)
      return "communicator rank " + std::to_string(d) + " is at mesh position " + std::to_string(p) +
             ", outside the axis of " + std::to_string(n);
    if (comm_rank[p] >= 0)
      return "communicator ranks " + std::to_string(comm_rank[p]) + " and " + std::to_string(d) +
             " both claim mesh position " + std::to_string(p);
    comm_rank[p] = d;
    Contribution& c = parts[p];
    c.rank = static_cast<int32_t>(p);
    c.config = row[kConfigAt];
    c.axis_size = row[kAxisAt];
    c.row_bytes = row[kRowBytesAt];
    c.dtype = row[kDtypeAt];
    c.input_rows = row[kInputRowsAt];
    c.output_rows = row[kOutputRowsAt];
    c.ragged = row[kRaggedAt] != 0;
    std::memcpy(&c.decision, row + kDecisionAt, sizeof c.decision);
    const int64_t slices = row[kSlicesAt], recv = row[kRecvAt];
    const int64_t error_bytes = row[kErrorBytesAt];
    if (slices < 0 || recv < 0 || error_bytes < 0 || error_bytes > kErrorWords * 8 ||
        kHeader + kErrorWords + 4 * slices + recv > words)
      return "the row of communicator rank " + std::to_string(d) + " is corrupt";
    c.error.assign(reinterpret_cast<const char*>(row + kHeader), static_cast<size_t>(error_bytes));
    const int64_t* at = row + kHeader + kErrorWords;
    for (int64_t k = 0; k < slices; ++k, at += 4) {
      if (at[0] < 0 || at[0] >= n)
        return "communicator rank " + std::to_string(d) + " sends to mesh position " + std::to_string(at[0]) +
               ", outside the axis of " + std::to_string(n);
      c.slices.push_back({static_cast<int32_t>(at[0]), at[1], at[2], at[3]});
    }
    c.recv_sizes.assign(at, at + recv);
  }
  int32_t missing = 0;
  std::string which;
  for (int32_t p = 0; p < n; ++p)
    if (comm_rank[p] < 0) {
      ++missing;
      if (which.size() < 64) which += " " + std::to_string(p);
    }
  if (missing)
    return "collective " + std::to_string(group) + " lacks mesh positions" + which + " among the " +
           std::to_string(count) +
           " devices of the NCCL communicator: a call must run on a mesh over every device the NCCL transport "
           "was configured with";
  return "";
}

std::string lay_out_call(std::vector<Contribution>& parts, std::shared_ptr<OpConfig>& config, Layout& layout,
                         std::vector<int64_t>& step_ptr, int32_t me, const Decision& decision,
                         const Decider::Site* history) {
  std::string err = check_parts(parts, static_cast<int32_t>(parts.size()), config);
  if (!err.empty()) return err;
  std::vector<int64_t> demand;
  err = place(parts, *config, layout, demand);
  if (!err.empty()) return err;
  std::shared_ptr<const ExternalPlan> planned;
  err = plan_for(*config, demand, planned, false, me < 0 ? -1 : config->rank_map[size_t(me)],
                 agreed_decision(parts, decision));
  if (!err.empty()) return err;
  if (history) decide_next(*config, *history, demand);
  lay_out(parts, *planned, *config, parts[0].row_bytes, layout);
  // NCCL keeps no per-transfer signals: a group per step runs after the one before, which honours
  // every dependency on an earlier step; a step is cut before a transfer that waits for one of
  // its own step, so that it too runs after what it waits for
  const auto& plan = planned->plan;
  step_ptr.assign(1, 0);
  for (size_t s = 0; s + 1 < plan.step_ptr.size(); ++s) {
    for (int64_t t = plan.step_ptr[s]; t < plan.step_ptr[s + 1]; ++t)
      for (int32_t d : planned->after[t])
        if (d >= step_ptr.back()) {
          step_ptr.push_back(t);
          break;
        }
    step_ptr.push_back(plan.step_ptr[s + 1]);
  }
  return "";
}

std::vector<P2pStep> p2p_steps(const Layout& layout, const std::vector<int64_t>& step_ptr, int32_t me) {
  std::vector<P2pStep> steps(step_ptr.empty() ? 0 : step_ptr.size() - 1);
  for (size_t s = 0; s < steps.size(); ++s)
    for (int64_t t = step_ptr[s]; t < step_ptr[s + 1]; ++t) {
      const Transfer& tr = layout.transfers[static_cast<size_t>(t)];
      if (tr.src != me && tr.dst != me) continue;
      for (size_t c = tr.first_copy; c < tr.end_copy; ++c) {
        const Copy& copy = layout.copies[c];
        if (tr.src == me) steps[s].sends.push_back({tr.dst, copy.src_offset, copy.nbytes});
        if (tr.dst == me) steps[s].recvs.push_back({tr.src, copy.dst_offset, copy.nbytes});
      }
    }
  return steps;
}

}  // namespace variopath::nccl
