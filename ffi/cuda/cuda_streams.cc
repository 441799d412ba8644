#include "cuda/cuda_streams.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "cuda/kernels.h"

namespace variopath::cuda {

namespace {

std::mutex g_pool_mu;
std::map<int, std::vector<cudaEvent_t>> g_pool;  // device -> free events

std::mutex g_peer_mu;
std::map<std::pair<int, int>, bool> g_peer;  // (from, to) -> kernels on `from` may touch `to`

// Whether kernels on `from` may read and write `to`'s memory: peer access, enabled once per
// process (cudaMemcpyPeerAsync works without it, through host memory).
bool peer_access(int from, int to) {
  if (from == to) return true;
  std::lock_guard<std::mutex> lock(g_peer_mu);
  auto it = g_peer.find({from, to});
  if (it != g_peer.end()) return it->second;
  int can = 0;
  bool enabled = cudaDeviceCanAccessPeer(&can, from, to) == cudaSuccess && can;
  if (enabled && cudaSetDevice(from) == cudaSuccess) {
    const cudaError_t status = cudaDeviceEnablePeerAccess(to, 0);
    enabled = status == cudaSuccess || status == cudaErrorPeerAccessAlreadyEnabled;
  }
  cudaGetLastError();  // an already-enabled (or refused) peer is not this call's error
  return g_peer[{from, to}] = enabled;
}

class CudaStreams final : public Streams {
 public:
  CudaStreams(const std::vector<Contribution>& parts, const Layout& layout)
      : parts_(parts.size()),
        transfers_(layout.transfers.size()),
        began_(layout.transfers.size(), -1),
        ended_(layout.transfers.size(), -1) {
    for (size_t r = 0; r < parts.size(); ++r) {
      parts_[r] = {parts[r].device, static_cast<cudaStream_t>(parts[r].stream), static_cast<cudaEvent_t>(parts[r].entry),
                   std::vector<bool>(parts.size(), false)};
    }
    std::map<int, size_t> paced;  // sender device -> its slots
    for (size_t t = 0; t < transfers_.size(); ++t) {
      const Transfer& tr = layout.transfers[t];
      Event& e = transfers_[t];
      e.device = parts_[tr.src].device;
      e.dst_device = parts_[tr.dst].device;
      e.dst = tr.dst;
      e.paced = tr.pace_gbs > 0;
      e.direct = peer_access(e.device, e.dst_device);
      std::string why;
      e.event = static_cast<cudaEvent_t>(take_event(e.device, why));
      if (!e.event) fail(why);
      if (e.paced) e.slot = paced[e.device]++;
    }
    for (auto& [device, count] : paced) {  // the clock stamps of paced transfers (study mode)
      void* p = nullptr;
      if (!check(cudaSetDevice(device), "cudaSetDevice") || !check(cudaMalloc(&p, count * sizeof(uint64_t)), "cudaMalloc"))
        break;
      slots_[device] = static_cast<uint64_t*>(p);
    }
  }

  ~CudaStreams() override {
    for (const Event& e : transfers_)
      if (e.event) give_event(e.device, e.event);
    for (auto& [device, p] : slots_) {
      cudaSetDevice(device);
      cudaFree(p);
    }
  }

  void wait(int32_t stream, int32_t event) override {
    Rank& r = enter(stream);
    check(cudaStreamWaitEvent(r.stream, transfers_[event].event, 0), "cudaStreamWaitEvent");
  }

  // One plan step's transfers of this sender. Where any is paced, the copies of those a kernel on
  // the sender may write go out in one throttled launch (paced_copy: in flight together, a paced
  // transfer's chunks each no earlier than its deadline on the GPU clock), each then held to its
  // bytes at its cap and recorded; the others (no peer access: through host memory) a peer copy
  // each after it, held after its copies. Without pacing, as ever: each transfer's copies in
  // one batched launch (or peer copies), one after another.
  void send(int32_t stream, const std::vector<Send>& batch) override {
    const bool paced = std::any_of(batch.begin(), batch.end(), [&](const Send& t) {
      return t.pace_gbs > 0 && transfers_[t.event].direct;
    });
    std::vector<const Send*> throttled, rest;
    for (const Send& t : batch) (paced && transfers_[t.event].direct ? throttled : rest).push_back(&t);
    if (!throttled.empty()) issue_throttled(stream, throttled);
    for (const Send* t : rest) {
      int64_t nbytes = 0;
      for (const Send::Piece& p : t->pieces) {
        add(stream, t->event, p.dst, p.src, p.nbytes);
        nbytes += p.nbytes;
      }
      issue(stream, t->event, hold_of(nbytes, t->pace_gbs));
    }
  }

  void local(int32_t stream, uint8_t* dst, const uint8_t* src, int64_t nbytes) override {
    if (nbytes) check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, enter(stream).stream), "cudaMemcpyAsync");
  }

  void zero(int32_t stream, uint8_t* dst, int64_t nbytes) override {
    if (nbytes) check(cudaMemsetAsync(dst, 0, nbytes, enter(stream).stream), "cudaMemsetAsync");
  }

  // A stalled device still gives up at the deadline (poll_event).
  bool synchronize(int32_t event, Clock::time_point deadline) override {
    std::string why;
    if (!poll_event(transfers_[event].event, deadline, why)) return false;
    if (!why.empty()) fail(why);
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_[event] < 0) ended_[event] = clock_++;
    return true;
  }

  std::string error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }

  // Host orders: when each transfer's first copy was enqueued and when a host wait first saw it
  // complete (the devices keep no global order).
  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override {
    std::lock_guard<std::mutex> lock(mu_);
    began = began_;
    ended = ended_;
  }

 private:
  static Clock::duration hold_of(int64_t nbytes, double pace_gbs) {
    return pace_gbs > 0 ? seconds_of(nbytes / (pace_gbs * 1e9))
                        : Clock::duration::zero();
  }

  // The direct transfers of a paced batch in paced_copy launches, then each one's hold and record.
  void issue_throttled(int32_t stream, const std::vector<const Send*>& sends) {
    std::vector<PacedSegment> segments;
    for (const Send* t : sends) {
      Event& e = transfers_[t->event];
      for (const Send::Piece& p : t->pieces) add(stream, t->event, p.dst, p.src, p.nbytes);
      int64_t before = 0;
      for (const Segment& seg : e.segments) {
        const uint64_t* start = e.paced ? slots_[e.device] + e.slot : nullptr;
        segments.push_back({seg.src, seg.dst, seg.nbytes, start, e.paced ? 1.0 / t->pace_gbs : 0.0, before});
        before += seg.nbytes;
      }
    }
    Rank& r = enter(stream);
    for (size_t i = 0; i < segments.size(); i += kMaxSegments) {
      const int count = static_cast<int>(std::min<size_t>(kMaxSegments, segments.size() - i));
      check(paced_copy(segments.data() + i, count, r.stream), "paced_copy");
    }
    for (const Send* t : sends) {
      Event& e = transfers_[t->event];
      int64_t nbytes = 0;
      for (const Segment& seg : e.segments) nbytes += seg.nbytes;
      if (e.paced && nbytes > 0)
        check(hold_until(slots_[e.device] + e.slot, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                        hold_of(nbytes, t->pace_gbs)).count(), r.stream),
              "hold_until");
      check(cudaEventRecord(e.event, r.stream), "cudaEventRecord");
    }
  }

  // One copy of transfer `event`, gathered until its issue.
  void add(int32_t stream, int32_t event, uint8_t* dst, const uint8_t* src, int64_t nbytes) {
    Rank& r = enter(stream);
    Event& e = transfers_[event];
    if (e.segments.empty()) {
      began_[event] = clock_++;
      if (!r.entered[e.dst]) {  // the receiver's stream has reached the call: its output is free
        check(cudaStreamWaitEvent(r.stream, parts_[e.dst].entry, 0), "cudaStreamWaitEvent (entry)");
        r.entered[e.dst] = true;
      }
      if (e.paced) check(stamp_clock(slots_[e.device] + e.slot, r.stream), "stamp_clock");
    }
    e.segments.push_back({src, dst, nbytes});
  }

  // The transfer's copies go out here, together: one batched kernel launch per kMaxSegments
  // when a kernel on the sender may write the receiver's memory and there are several, else a
  // peer copy each (through host memory where the devices have no peer access).
  void issue(int32_t stream, int32_t event, Clock::duration hold) {
    Rank& r = enter(stream);
    Event& e = transfers_[event];
    if (e.direct && e.segments.size() > 1) {
      for (size_t i = 0; i < e.segments.size(); i += kMaxSegments) {
        const int count = static_cast<int>(std::min<size_t>(kMaxSegments, e.segments.size() - i));
        check(batched_copy(e.segments.data() + i, count, r.stream), "batched_copy");
      }
    } else {
      for (const Segment& s : e.segments)
        check(cudaMemcpyPeerAsync(s.dst, e.dst_device, s.src, e.device, s.nbytes, r.stream), "cudaMemcpyPeerAsync");
    }
    if (e.paced && hold > Clock::duration::zero() && !e.segments.empty())
      check(hold_until(slots_[e.device] + e.slot,
                       std::chrono::duration_cast<std::chrono::nanoseconds>(hold).count(), r.stream),
            "hold_until");
    check(cudaEventRecord(e.event, r.stream), "cudaEventRecord");
  }

  struct Rank {
    int device = -1;
    cudaStream_t stream = nullptr;
    cudaEvent_t entry = nullptr;
    std::vector<bool> entered;  // its stream waited for that rank's entry event (written by its thread only)
  };
  struct Event {
    int device = -1, dst_device = -1;
    int32_t dst = -1;
    bool paced = false, direct = false;
    cudaEvent_t event = nullptr;
    size_t slot = 0;
    std::vector<Segment> segments;  // its copies, enqueued at its record (sender's thread only)
  };

  Rank& enter(int32_t stream) {
    check(cudaSetDevice(parts_[stream].device), "cudaSetDevice");
    return parts_[stream];
  }

  bool check(cudaError_t status, const char* what) {
    if (status == cudaSuccess) return true;
    fail(describe(status, what));
    return false;
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = why;
  }

  std::vector<Rank> parts_;
  std::vector<Event> transfers_;
  std::map<int, uint64_t*> slots_;
  std::atomic<int64_t> clock_{0};
  std::vector<int64_t> began_;  // each entry written by its transfer's sender only
  std::vector<int64_t> ended_;  // under mu_
  mutable std::mutex mu_;
  std::string error_;  // the first CUDA failure
};

}  // namespace

bool poll_event(void* event, Clock::time_point deadline, std::string& error) {
  for (int polls = 0;; ++polls) {
    const cudaError_t status = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (status != cudaErrorNotReady) {
      if (status != cudaSuccess && error.empty()) error = describe(status, "cudaEventQuery");
      return true;
    }
    if (Clock::now() >= deadline) return false;
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

std::string describe(int status, const char* what) {
  const auto e = static_cast<cudaError_t>(status);
  return std::string(what) + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

void* take_event(int device, std::string& error) {
  {
    std::lock_guard<std::mutex> lock(g_pool_mu);
    auto& free = g_pool[device];
    if (!free.empty()) {
      cudaEvent_t e = free.back();
      free.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  cudaError_t status = cudaSetDevice(device);
  if (status == cudaSuccess) status = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (status != cudaSuccess && error.empty()) error = describe(status, "cudaEventCreate");
  return status == cudaSuccess ? e : nullptr;
}

void give_event(int device, void* event) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool[device].push_back(static_cast<cudaEvent_t>(event));
}

std::unique_ptr<Streams> cuda_streams(const std::vector<Contribution>& parts, const Layout& layout, std::string& error) {
  auto streams = std::make_unique<CudaStreams>(parts, layout);
  error = streams->error();
  if (!error.empty()) return nullptr;
  return streams;
}

}  // namespace variopath::cuda
