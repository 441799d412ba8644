#include "executor.h"

namespace variopath {

namespace {

std::string stalled_on(const Transfer& d, int32_t me, const char* what) {
  return "rank " + std::to_string(me) + " waited for rank " + std::to_string(d.src) + "'s transfer to rank " +
         std::to_string(d.dst) + " (" + what + ")";
}

// Send this rank's transfers, then wait for everything sent to it. "" or the error.
std::string run(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams,
                const std::vector<Contribution>& parts, int32_t me, double timeout_s, TransferHook hook) {
  const auto& mine = layout.sends[me];
  for (size_t nth = 0; nth < mine.size(); ++nth) {
    const int32_t t = mine[nth];
    const Transfer& tr = layout.transfers[t];
    if (hook) hook(me, static_cast<int64_t>(nth));
    {
      std::unique_lock<std::mutex> lock(sync.mu);
      const auto open = [&] {
        for (int32_t d : tr.after)
          if (states[d] != TransferState::kEnqueued) return d;
        return -1;
      };
      if (!wait_for(sync, lock, timeout_s, [&] { return open() < 0; },
                    [&] { return stalled_on(layout.transfers[open()], me, "a rank stalled mid-exchange"); }))
        return sync.error;
      states[t] = TransferState::kEnqueuing;  // from here on, tr.dst and me wait for it before returning
    }
    for (int32_t d : tr.after) streams.wait(me, d);
    const uint8_t* in = parts[tr.src].input;
    uint8_t* out = parts[tr.dst].output;
    int64_t nbytes = 0;
    for (size_t c = tr.first_copy; c < tr.end_copy; ++c) {
      const Copy& copy = layout.copies[c];
      streams.copy(me, t, out + copy.dst_offset, in + copy.src_offset, copy.nbytes);
      nbytes += copy.nbytes;
    }
    const auto hold = tr.pace_gbs > 0 ? std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(nbytes / (tr.pace_gbs * 1e9)))
                                      : Clock::duration::zero();
    streams.record(me, t, hold);
    std::lock_guard<std::mutex> lock(sync.mu);
    states[t] = TransferState::kEnqueued;
    sync.cv.notify_all();
  }
  for (int32_t t : layout.receives[me]) {
    {
      std::unique_lock<std::mutex> lock(sync.mu);
      if (!wait_for(sync, lock, timeout_s, [&] { return states[t] == TransferState::kEnqueued; },
                    [&] { return stalled_on(layout.transfers[t], me, "its data never came: a rank stalled"); }))
        return sync.error;
    }
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
    if (!streams.synchronize(t, deadline)) {
      std::lock_guard<std::mutex> lock(sync.mu);
      sync.fail("timed out after " + std::to_string(timeout_s) + " s: " +
                stalled_on(layout.transfers[t], me, "its copies never completed"));
      return sync.error;
    }
  }
  const std::string bug = streams.error();
  if (!bug.empty()) {
    std::lock_guard<std::mutex> lock(sync.mu);
    sync.fail(bug);
    return bug;
  }
  return "";
}

// Before returning: no transfer into or out of `me` still being enqueued, every enqueued one
// complete. Each is finite work already under way (an enqueued transfer waits only for enqueued
// ones), so this waits without a deadline.
void drain(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams, int32_t me) {
  std::vector<int32_t> touching(layout.sends[me]);
  touching.insert(touching.end(), layout.receives[me].begin(), layout.receives[me].end());
  std::vector<int32_t> enqueued;
  {
    std::unique_lock<std::mutex> lock(sync.mu);
    sync.cv.wait(lock, [&] {
      for (int32_t t : touching)
        if (states[t] == TransferState::kEnqueuing) return false;
      return true;
    });
    for (int32_t t : touching)
      if (states[t] == TransferState::kEnqueued) enqueued.push_back(t);
  }
  for (int32_t t : enqueued) streams.synchronize(t, Clock::time_point::max());
}

}  // namespace

std::string execute(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams,
                    const std::vector<Contribution>& parts, int32_t me, double timeout_s, TransferHook hook) {
  const std::string err = run(sync, layout, states, streams, parts, me, timeout_s, hook);
  drain(sync, layout, states, streams, me);
  return err;
}

}  // namespace variopath
