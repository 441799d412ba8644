#include "executor.h"

#include <algorithm>

namespace variopath {

namespace {

std::string stalled_on(const Transfer& d, int32_t me, const char* what) {
  return "rank " + std::to_string(me) + " waited for rank " + std::to_string(d.src) + "'s transfer to rank " +
         std::to_string(d.dst) + " (" + what + ")";
}

// Execute this rank's transfers, then wait for those the other side executes. "" or the error.
std::string run(Board& board, const Layout& layout, Streams& streams, const std::vector<Contribution>& parts,
                int32_t me, double timeout_s, TransferHook hook, Role role) {
  const bool pull = role == Role::kPull;
  const auto& mine = pull ? layout.receives[me] : layout.sends[me];
  const auto& theirs = pull ? layout.sends[me] : layout.receives[me];
  const Board::Stalled mid = [&](int32_t d) {
    return stalled_on(layout.transfers[d], me, "a rank stalled mid-exchange");
  };
  // A batch: the longest run of its transfers of one step, none waiting for another of that
  // step, claimed one by one (each once what it waits for is enqueued: all of it in earlier
  // steps, so no batch waits for a transfer behind a claimed one) and issued together.
  std::vector<Send> batch;
  for (size_t nth = 0; nth < mine.size();) {
    const int32_t step = layout.transfers[mine[nth]].step;
    batch.clear();
    for (; nth < mine.size(); ++nth) {
      const int32_t t = mine[nth];
      const Transfer& tr = layout.transfers[t];
      const bool later = std::any_of(tr.after.begin(), tr.after.end(),
                                     [&](int32_t d) { return layout.transfers[d].step >= step; });
      if (tr.step != step || (later && !batch.empty())) break;
      if (hook) hook(me, static_cast<int64_t>(nth));
      // from a successful claim on, tr.src and tr.dst wait for it before returning
      if (!board.claim(t, tr.after, timeout_s, mid)) {
        for (Send& s : batch) s = {s.event, 0, {}};  // claimed before the failure: recorded, nothing moved
        streams.send(me, batch);
        for (const Send& s : batch) board.enqueued(s.event);
        return board.error();
      }
      for (int32_t d : tr.after) streams.wait(me, d);
      Send send{t, tr.pace_gbs, {}};
      const uint8_t* in = parts[tr.src].input;
      uint8_t* out = parts[tr.dst].output;
      for (size_t c = tr.first_copy; c < tr.end_copy; ++c) {
        const Copy& copy = layout.copies[c];
        send.pieces.push_back({out + copy.dst_offset, in + copy.src_offset, copy.nbytes});
      }
      batch.push_back(std::move(send));
      if (later) {  // it waits for a transfer of its own step: alone
        ++nth;
        break;
      }
    }
    streams.send(me, batch);
    for (const Send& s : batch) board.enqueued(s.event);
  }
  const char* never = pull ? "its staged rows were never read: a rank stalled" : "its data never came: a rank stalled";
  for (int32_t t : theirs) {
    if (!board.await(t, timeout_s, [&](int32_t d) { return stalled_on(layout.transfers[d], me, never); }))
      return board.error();
    if (streams.stream_ordered()) continue;  // its stream waits for it at the end (drain), not the host
    const auto deadline = Clock::now() + seconds_of(timeout_s);
    if (!streams.synchronize(t, deadline))
      return board.fail("timed out after " + std::to_string(timeout_s) + " s: " +
                        stalled_on(layout.transfers[t], me, "its copies never completed"));
  }
  const std::string bug = streams.error();
  if (!bug.empty()) return board.fail(bug);
  return "";
}

// Before returning: no transfer into or out of `me` still being enqueued, every enqueued one
// complete. Each is finite work already under way (an enqueued transfer waits only for enqueued
// ones), but a stopped process or a wedged device would hold it forever: each of the two waits
// gives up after `timeout_s` and fails the call. On a stream-ordered backend (a GPU) "complete"
// is the rank's stream waiting for them: nothing XLA runs next on it touches the buffers before
// they are done, and the host does not wait for the device. "" or the error.
std::string drain(Board& board, const Layout& layout, Streams& streams, int32_t me, double timeout_s, Role role) {
  std::vector<int32_t> touching(layout.sends[me]);
  touching.insert(touching.end(), layout.receives[me].begin(), layout.receives[me].end());
  const std::string timed_out = "timed out after " + std::to_string(timeout_s) + " s before returning: ";
  std::vector<int32_t> enqueued;
  const int32_t busy = board.settle(touching, timeout_s, enqueued);
  std::string err;
  if (busy >= 0) err = board.fail(timed_out + stalled_on(layout.transfers[busy], me, "still being enqueued"));
  if (streams.stream_ordered()) {
    // the rank's stream waits for every enqueued transfer the other side executes; what follows
    // on it (XLA's next op) runs after them, and the host waits only for its stream (finish: at
    // once on a GPU, the emulator's thread on CPU)
    const bool pull = role == Role::kPull;
    for (int32_t t : enqueued)
      if ((pull ? layout.transfers[t].dst : layout.transfers[t].src) != me) streams.wait(me, t);
    const int32_t left = streams.finish(me, Clock::now() + seconds_of(timeout_s));
    if (left < 0) return err;
    const std::string why = board.fail(timed_out + stalled_on(layout.transfers[left], me, "its copies never completed"));
    if (err.empty()) err = why;
    // a wedged stream: the transfers that can still complete do before the rank returns
    const auto deadline = Clock::now() + seconds_of(timeout_s);
    for (int32_t t : enqueued)
      if (t != left && !streams.synchronize(t, deadline)) break;
    return err;
  }
  const auto deadline = Clock::now() + seconds_of(timeout_s);
  for (size_t k = 0; k < enqueued.size(); ++k) {
    if (streams.synchronize(enqueued[k], deadline)) continue;
    const std::string why = board.fail(timed_out + stalled_on(layout.transfers[enqueued[k]], me, "its copies never completed"));
    if (err.empty()) err = why;
    for (size_t rest = k; rest < enqueued.size(); ++rest) streams.wait(me, enqueued[rest]);
    break;
  }
  return err;
}

}  // namespace

bool LocalBoard::claim(int32_t t, const std::vector<int32_t>& after, double timeout_s, const Stalled& stalled) {
  std::unique_lock<std::mutex> lock(sync_.mu);
  const auto open = [&] {
    for (int32_t d : after)
      if (states_[d] != TransferState::kEnqueued) return d;
    return -1;
  };
  const bool ok = wait_for(
      sync_, lock, timeout_s,
      [&] {
        const int32_t d = open();
        sync_.waiting_on[me_] = d < 0 ? CallSync::kNone : d;
        return d < 0;
      },
      [&] { return stalled(open()); }, &sync_.rank_cv[me_]);
  sync_.waiting_on[me_] = CallSync::kNone;
  if (!ok) return false;
  states_[t] = TransferState::kEnqueuing;
  return true;
}

// Wake the ranks waiting for `t` and those settling (who wait for anything enqueuing to end).
void LocalBoard::enqueued(int32_t t) {
  std::lock_guard<std::mutex> lock(sync_.mu);
  states_[t] = TransferState::kEnqueued;
  for (size_t r = 0; r < sync_.waiting_on.size(); ++r)
    if (sync_.waiting_on[r] == t || sync_.waiting_on[r] == CallSync::kSettling) sync_.rank_cv[r].notify_one();
}

bool LocalBoard::await(int32_t t, double timeout_s, const Stalled& stalled) {
  std::unique_lock<std::mutex> lock(sync_.mu);
  sync_.waiting_on[me_] = t;
  const bool ok = wait_for(sync_, lock, timeout_s, [&] { return states_[t] == TransferState::kEnqueued; },
                           [&] { return stalled(t); }, &sync_.rank_cv[me_]);
  sync_.waiting_on[me_] = CallSync::kNone;
  return ok;
}

std::string LocalBoard::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(sync_.mu);
  sync_.fail(why);
  return sync_.error;
}

std::string LocalBoard::error() {
  std::lock_guard<std::mutex> lock(sync_.mu);
  return sync_.error;
}

int32_t LocalBoard::settle(const std::vector<int32_t>& ts, double timeout_s, std::vector<int32_t>& enqueued) {
  std::unique_lock<std::mutex> lock(sync_.mu);
  const auto busy = [&] {
    for (int32_t t : ts)
      if (states_[t] == TransferState::kEnqueuing) return t;
    return -1;
  };
  sync_.waiting_on[me_] = CallSync::kSettling;
  const auto deadline = Clock::now() + seconds_of(timeout_s);
  sync_.rank_cv[me_].wait_until(lock, deadline, [&] { return busy() < 0; });
  sync_.waiting_on[me_] = CallSync::kNone;
  enqueued.clear();
  for (int32_t t : ts)
    if (states_[t] == TransferState::kEnqueued) enqueued.push_back(t);
  return busy();
}

std::string execute(Board& board, const Layout& layout, Streams& streams, const std::vector<Contribution>& parts,
                    int32_t me, double timeout_s, TransferHook hook, Role role) {
  const std::string err = run(board, layout, streams, parts, me, timeout_s, hook, role);
  const std::string drained = drain(board, layout, streams, me, timeout_s, role);
  return err.empty() ? drained : err;
}

std::string execute(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams,
                    const std::vector<Contribution>& parts, int32_t me, double timeout_s, TransferHook hook) {
  LocalBoard board(sync, states, me);
  return execute(board, layout, streams, parts, me, timeout_s, hook);
}

}  // namespace variopath
