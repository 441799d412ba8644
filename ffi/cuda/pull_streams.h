// The receiving side of the transports between GPU processes of one node (cuda-ipc, cuda/ipc.h;
// cuda-host, cuda/host_staging.h), on the frame of shm_collective.h: a receiver pulls its rows
// from its senders' staging (peer device memory, or pinned host memory) on its own XLA stream,
// and a sender fills its staging on its stream and waits for that before it joins.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "cuda/kernels.h"
#include "layout.h"
#include "shm_collective.h"
#include "streams.h"

namespace variopath::cuda {

// Enqueue `pieces` (dst, src, bytes: cudaMemcpyDefault) on `stream` of `device` and wait (host
// poll) until they completed or `timeout_s` passed; "" or the error, naming `what`.
std::string copy_and_wait(int device, cudaStream_t stream, const std::vector<Piece>& pieces, double timeout_s,
                          const char* what);

// The streams of a receiving rank: its own XLA stream, an event per transfer it pulls. The
// Board says "enqueued" to other processes, which cannot wait for this process's events: a
// transfer another transfer depends on is therefore waited for (host, with the deadline) as it
// is recorded, so that enqueued means complete for its dependents; the others complete by the
// rank's final `settle`, before it reports done reading its peers' staging.
class PullStreams final : public Streams {
 public:
  PullStreams(int device, cudaStream_t stream, const Layout& layout, int32_t me, double timeout_s)
      : device_(device),
        stream_(stream),
        timeout_s_(timeout_s),
        mine_(layout.transfers.size(), false),
        needed_(layout.transfers.size(), false),
        events_(layout.transfers.size(), nullptr),
        segments_(layout.transfers.size()),
        slot_(layout.transfers.size(), -1),
        began_(layout.transfers.size(), -1),
        ended_(layout.transfers.size(), -1) {
    for (const Transfer& tr : layout.transfers)
      for (int32_t d : tr.after) needed_[d] = true;
    int paced = 0;
    for (int32_t t : layout.receives[me]) {
      mine_[t] = true;
      events_[t] = static_cast<cudaEvent_t>(take_event(device, error_));
      if (layout.transfers[t].pace_gbs > 0) slot_[t] = paced++;
    }
    done_ = static_cast<cudaEvent_t>(take_event(device, error_));
    if (paced) {  // the clock stamps of paced transfers (study mode): the stream's, kept across calls
      std::string why;
      slots_ = clock_slots(device, stream, static_cast<size_t>(paced), why);
      if (!slots_) fail(why);
    }
  }

  ~PullStreams() override {
    for (cudaEvent_t e : events_)
      if (e) give_event(device_, e);
    if (done_) give_event(device_, done_);
  }

  // Every transfer this rank waits for is complete once enqueued (see above) or on this stream.
  void wait(int32_t, int32_t) override {}

  // The transfers of a batch one after another on this rank's stream, each held to its cap.
  void send(int32_t, const std::vector<Send>& batch) override {
    for (const Send& t : batch) {
      int64_t nbytes = 0;
      for (const Send::Piece& p : t.pieces) {
        add(t.event, p.dst, p.src, p.nbytes);
        nbytes += p.nbytes;
      }
      issue(t.event, t.pace_gbs > 0 ? seconds_of(nbytes / (t.pace_gbs * 1e9))
                                    : Clock::duration::zero());
    }
  }

  void local(int32_t, uint8_t* dst, const uint8_t* src, int64_t nbytes) override {
    if (nbytes) note(VP_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_)));
  }

  void zero(int32_t, uint8_t* dst, int64_t nbytes) override {
    if (nbytes) note(VP_CUDA(cudaMemsetAsync(dst, 0, nbytes, stream_)));
  }

  // A transfer another rank pulled: nothing of it runs here (its receiver reports done reading
  // only once its copies completed).
  bool synchronize(int32_t event, Clock::time_point deadline) override {
    if (!mine_[event]) return true;
    std::string why;
    const bool done = poll_event(events_[event], std::min(deadline, Clock::now() + seconds_of(timeout_s_)), why);
    if (!why.empty()) fail(why);
    if (done) {
      std::lock_guard<std::mutex> lock(mu_);
      if (ended_[event] < 0) ended_[event] = clock_++;
    }
    return done;
  }

  // Every op enqueued on the stream so far has completed; false at the deadline.
  bool settle(Clock::time_point deadline) {
    if (!note(VP_CUDA(cudaEventRecord(done_, stream_)))) return false;
    std::string why;
    const bool done = poll_event(done_, deadline, why);
    if (!why.empty()) fail(why);
    return done && why.empty();
  }

  std::string error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override {
    std::lock_guard<std::mutex> lock(mu_);
    began = began_;
    ended = ended_;
  }

 private:
  // One copy of transfer `event`, gathered until its issue.
  void add(int32_t event, uint8_t* dst, const uint8_t* src, int64_t nbytes) {
    if (segments_[event].empty()) {
      began_[event] = clock_++;
      if (slot_[event] >= 0) note(stamp_clock(slots_ + slot_[event], stream_));
    }
    segments_[event].push_back({src, dst, nbytes});
  }

  // The copies go out here, each a cudaMemcpyAsync: the driver moves peer memory directly where
  // the devices have peer access and through host memory where not, and a transfer from one
  // sender is one contiguous run of rows per slice (few copies).
  void issue(int32_t event, Clock::duration hold) {
    for (const Segment& s : segments_[event])
      note(VP_CUDA(cudaMemcpyAsync(s.dst, s.src, s.nbytes, cudaMemcpyDefault, stream_)));
    if (slot_[event] >= 0 && hold > Clock::duration::zero() && !segments_[event].empty())
      note(hold_until(slots_ + slot_[event], std::chrono::duration_cast<std::chrono::nanoseconds>(hold).count(),
                      stream_));
    note(VP_CUDA(cudaEventRecord(events_[event], stream_)));
    if (needed_[event] && !synchronize(event, Clock::now() + seconds_of(timeout_s_)))
      fail("timed out after " + std::to_string(timeout_s_) + " s waiting for a transfer's copies on the GPU");
  }

  bool note(const Status& s) {
    if (!s.ok()) fail(s.message);
    return s.ok();
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = why;
  }

  int device_;
  cudaStream_t stream_;
  double timeout_s_;
  std::vector<bool> mine_, needed_;  // pulled by this rank; waited for by some transfer
  std::vector<cudaEvent_t> events_;
  cudaEvent_t done_ = nullptr;
  std::vector<std::vector<Segment>> segments_;
  std::vector<int> slot_;  // paced transfers: their clock stamp in slots_
  uint64_t* slots_ = nullptr;  // clock_slots': not this call's to free
  std::atomic<int64_t> clock_{0};
  std::vector<int64_t> began_, ended_;  // ended_ under mu_
  mutable std::mutex mu_;
  std::string error_;
};

}  // namespace variopath::cuda
