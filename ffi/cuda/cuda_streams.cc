#include "cuda/cuda_streams.h"

#include <cuda.h>  // the driver's types, for its entry points (no link to libcuda)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "cuda/check.h"
#include "cuda/kernels.h"

namespace variopath::cuda {

namespace {

std::mutex g_pool_mu;
std::map<int, std::vector<cudaEvent_t>> g_pool;  // device -> free events

std::mutex g_peer_mu;
std::map<std::pair<int, int>, bool> g_peer;  // (from, to) -> peer access enabled from `from` to `to`

// Whether `from` has peer access to `to`'s cudaMalloc memory: enabled once per process
// (cudaMemcpyPeerAsync works without it, through host memory).
bool peer_access(int from, int to) {
  if (from == to) return true;
  std::lock_guard<std::mutex> lock(g_peer_mu);
  auto it = g_peer.find({from, to});
  if (it != g_peer.end()) return it->second;
  int can = 0, previous = 0;
  bool enabled = VP_CUDA(cudaDeviceCanAccessPeer(&can, from, to)).ok() && can;
  if (enabled && VP_CUDA(cudaGetDevice(&previous)).ok() && VP_CUDA(cudaSetDevice(from)).ok()) {
    const Status s = VP_CUDA(cudaDeviceEnablePeerAccess(to, 0));  // cleared either way (check.h)
    enabled = s.ok() || s.code == cudaErrorPeerAccessAlreadyEnabled;
    VP_CUDA(cudaSetDevice(previous));
  }
  return g_peer[{from, to}] = enabled;
}

// A driver function through the runtime's entry points (null where the driver lacks it).
template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  const Status s = VP_CUDA(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found));
#else
  const Status s = VP_CUDA(cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &found));
#endif
  return s.ok() && found == cudaDriverEntryPointSuccess ? reinterpret_cast<Fn>(fn) : nullptr;
}

using PointerGetAttribute = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);
using MemGetAccess = CUresult (*)(unsigned long long*, const CUmemLocation*, CUdeviceptr);

// What the runtime and the driver say about `buffer`, for a kernel on `writer` (peer_access.h).
BufferFacts facts_of(const void* buffer, int writer) {
  BufferFacts f;
  cudaPointerAttributes a{};
  if (!VP_CUDA(cudaPointerGetAttributes(&a, buffer)).ok()) return f;
  f.kind = static_cast<MemoryKind>(a.type);
  f.owner = a.device;
  if (f.kind != MemoryKind::kDevice || f.owner == writer) return f;
  static const auto get = driver_entry<PointerGetAttribute>("cuPointerGetAttribute");
  static const auto access = driver_entry<MemGetAccess>("cuMemGetAccess");
  if (!get) return f;
  const auto ptr = reinterpret_cast<CUdeviceptr>(buffer);
  CUmemoryPool pool = nullptr;
  int legacy = 0;
  if (get(&pool, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr) == CUDA_SUCCESS && pool) {
    f.allocation = Allocation::kPool;
    cudaMemLocation at{};
    at.type = cudaMemLocationTypeDevice;
    at.id = writer;
    cudaMemAccessFlags flags = cudaMemAccessFlagsProtNone;
    if (VP_CUDA(cudaMemPoolGetAccess(&flags, static_cast<cudaMemPool_t>(pool), &at)).ok())
      f.access = static_cast<int>(flags);
  } else if (get(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr) == CUDA_SUCCESS && legacy) {
    f.allocation = Allocation::kPlain;
  } else if (access) {  // neither cudaMalloc nor a pool: a VMM mapping, or its access is unreadable
    CUmemLocation at{};
    at.type = CU_MEM_LOCATION_TYPE_DEVICE;
    at.id = writer;
    unsigned long long flags = 0;
    if (access(&flags, &at, ptr) == CUDA_SUCCESS) {
      f.allocation = Allocation::kVmm;
      f.access = static_cast<int>(flags);
    }
  }
  return f;
}

std::mutex g_write_mu;
std::map<std::pair<uintptr_t, int>, PeerWrite> g_write;  // (buffer, writer) -> decision
std::deque<std::string> g_log;                            // the transport log (newest last), under g_write_mu

// The paced transfers' clock stamps of each stream (clock_slots), and what growth replaced.
struct Slots {
  int device = -1;
  uint64_t* data = nullptr;
  size_t capacity = 0;
};
std::mutex g_slots_mu;
std::map<void*, Slots> g_slots;                          // stream -> its buffer
std::vector<std::pair<int, uint64_t*>> g_slots_retired;  // (device, buffer) freed at release_scratch

class CudaStreams final : public Streams {
 public:
  CudaStreams(const std::vector<Contribution>& parts, const Layout& layout, bool debug)
      : parts_(parts.size()),
        transfers_(layout.transfers.size()),
        began_(layout.transfers.size(), -1),
        ended_(layout.transfers.size(), -1) {
    for (size_t r = 0; r < parts.size(); ++r) {
      parts_[r] = {parts[r].device, static_cast<cudaStream_t>(parts[r].stream), static_cast<cudaEvent_t>(parts[r].entry),
                   std::vector<bool>(parts.size(), false)};
    }
    std::map<int32_t, size_t> paced;  // sender rank -> its slots
    std::map<std::pair<int32_t, int32_t>, bool> direct;  // (sender rank, receiver rank) -> peer_write's answer
    for (size_t t = 0; t < transfers_.size(); ++t) {
      const Transfer& tr = layout.transfers[t];
      Event& e = transfers_[t];
      e.device = parts_[tr.src].device;
      e.dst_device = parts_[tr.dst].device;
      e.dst = tr.dst;
      e.paced = tr.pace_gbs > 0;
      auto known = direct.find({tr.src, tr.dst});
      if (known == direct.end())
        known = direct.emplace(std::make_pair(tr.src, tr.dst), peer_write(e.device, parts[tr.dst].output, debug).direct)
                    .first;
      e.direct = known->second;
      std::string why;
      e.event = static_cast<cudaEvent_t>(take_event(e.device, why));
      if (!e.event) fail(why);
      if (e.paced) e.slot = paced[tr.src]++;
    }
    for (auto& [rank, count] : paced) {  // the clock stamps of paced transfers, on the sender's stream's buffer
      std::string why;
      slots_[rank] = clock_slots(parts_[rank].device, parts_[rank].stream, count, why);
      if (!slots_[rank]) fail(why);
    }
  }

  // The events go back to the pool once every rank has returned: every wait on them is enqueued
  // (a later record of a pooled event does not change what those waits wait for).
  ~CudaStreams() override {
    for (const Event& e : transfers_)
      if (e.event) give_event(e.device, e.event);
  }

  void wait(int32_t stream, int32_t event) override {
    Rank& r = enter(stream);
    note(VP_CUDA(cudaStreamWaitEvent(r.stream, transfers_[event].event, 0)));
  }

  bool stream_ordered() const override { return true; }

  // One plan step's transfers of this sender. Where any is paced, the copies of those a kernel on
  // the sender may write go out in one throttled launch (paced_copy: in flight together, a paced
  // transfer's chunks each no earlier than its deadline on the GPU clock), each then held to its
  // bytes at its cap and recorded; the others (peer copies) one each after it, held after its
  // copies. Without pacing, as ever: each transfer's copies in one batched launch (or peer
  // copies), one after another.
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
    if (nbytes) note(VP_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, enter(stream).stream)));
  }

  void zero(int32_t stream, uint8_t* dst, int64_t nbytes) override {
    if (nbytes) note(VP_CUDA(cudaMemsetAsync(dst, 0, nbytes, enter(stream).stream)));
  }

  // A host wait (no longer on a call's path, which is stream-ordered: the executor's fallbacks and
  // tests); a stalled device still gives up at the deadline (poll_event).
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
  // complete (the devices keep no global order; a stream-ordered call has no host waits: -1).
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

  uint64_t* slot_of(int32_t stream, size_t slot) { return slots_[stream] + slot; }

  // The direct transfers of a paced batch in paced_copy launches, then each one's hold and record.
  void issue_throttled(int32_t stream, const std::vector<const Send*>& sends) {
    std::vector<PacedSegment> segments;
    for (const Send* t : sends) {
      Event& e = transfers_[t->event];
      for (const Send::Piece& p : t->pieces) add(stream, t->event, p.dst, p.src, p.nbytes);
      int64_t before = 0;
      for (const Segment& seg : e.segments) {
        const uint64_t* start = e.paced ? slot_of(stream, e.slot) : nullptr;
        segments.push_back({seg.src, seg.dst, seg.nbytes, start, e.paced ? 1.0 / t->pace_gbs : 0.0, before});
        before += seg.nbytes;
      }
    }
    Rank& r = enter(stream);
    for (size_t i = 0; i < segments.size(); i += kMaxSegments) {
      const int count = static_cast<int>(std::min<size_t>(kMaxSegments, segments.size() - i));
      note(paced_copy(segments.data() + i, count, r.stream));
    }
    for (const Send* t : sends) {
      Event& e = transfers_[t->event];
      int64_t nbytes = 0;
      for (const Segment& seg : e.segments) nbytes += seg.nbytes;
      if (e.paced && nbytes > 0)
        note(hold_until(slot_of(stream, e.slot),
                        std::chrono::duration_cast<std::chrono::nanoseconds>(hold_of(nbytes, t->pace_gbs)).count(),
                        r.stream));
      note(VP_CUDA(cudaEventRecord(e.event, r.stream)));
    }
  }

  // One copy of transfer `event`, gathered until its issue.
  void add(int32_t stream, int32_t event, uint8_t* dst, const uint8_t* src, int64_t nbytes) {
    Rank& r = enter(stream);
    Event& e = transfers_[event];
    if (e.segments.empty()) {
      began_[event] = clock_++;
      if (!r.entered[e.dst]) {  // the receiver's stream has reached the call: its output is free
        note(VP_CUDA(cudaStreamWaitEvent(r.stream, parts_[e.dst].entry, 0)));
        r.entered[e.dst] = true;
      }
      if (e.paced) note(stamp_clock(slot_of(stream, e.slot), r.stream));
    }
    e.segments.push_back({src, dst, nbytes});
  }

  // The transfer's copies go out here, together: one batched kernel launch per kMaxSegments
  // when a kernel on the sender may store into the receiver's buffer (peer_write) and there are
  // several, else a peer copy each (the driver's copy engines; through host memory where the
  // devices have no peer access).
  void issue(int32_t stream, int32_t event, Clock::duration hold) {
    Rank& r = enter(stream);
    Event& e = transfers_[event];
    if (e.direct && e.segments.size() > 1) {
      for (size_t i = 0; i < e.segments.size(); i += kMaxSegments) {
        const int count = static_cast<int>(std::min<size_t>(kMaxSegments, e.segments.size() - i));
        note(batched_copy(e.segments.data() + i, count, r.stream));
      }
    } else {
      for (const Segment& s : e.segments)
        note(VP_CUDA(cudaMemcpyPeerAsync(s.dst, e.dst_device, s.src, e.device, s.nbytes, r.stream)));
    }
    if (e.paced && hold > Clock::duration::zero() && !e.segments.empty())
      note(hold_until(slot_of(stream, e.slot), std::chrono::duration_cast<std::chrono::nanoseconds>(hold).count(),
                      r.stream));
    note(VP_CUDA(cudaEventRecord(e.event, r.stream)));
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
    note(VP_CUDA(cudaSetDevice(parts_[stream].device)));
    return parts_[stream];
  }

  bool note(const Status& s) {
    if (!s.ok()) fail(s.message);
    return s.ok();
  }

  void fail(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (error_.empty()) error_ = why;
  }

  std::vector<Rank> parts_;
  std::vector<Event> transfers_;
  std::map<int32_t, uint64_t*> slots_;  // sender rank -> its stream's clock slots (written in the constructor only)
  std::atomic<int64_t> clock_{0};
  std::vector<int64_t> began_;  // each entry written by its transfer's sender only
  std::vector<int64_t> ended_;  // under mu_
  mutable std::mutex mu_;
  std::string error_;  // the first CUDA failure
};

}  // namespace

bool poll_event(void* event, Clock::time_point deadline, std::string& error) {
  for (int polls = 0;; ++polls) {
    const Status s = VP_CUDA(cudaEventQuery(static_cast<cudaEvent_t>(event)));  // clears cudaErrorNotReady
    if (!s.not_ready()) {
      if (!s.ok() && error.empty()) error = s.message;
      return true;
    }
    if (Clock::now() >= deadline) return false;
    if (polls < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
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
  Status s = VP_CUDA(cudaSetDevice(device));
  if (s.ok()) s = VP_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (!s.ok() && error.empty()) error = s.message;
  return s.ok() ? e : nullptr;
}

void give_event(int device, void* event) {
  std::lock_guard<std::mutex> lock(g_pool_mu);
  g_pool[device].push_back(static_cast<cudaEvent_t>(event));
}

uint64_t* clock_slots(int device, void* stream, size_t count, std::string& error) {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  Slots& s = g_slots[stream];
  if (count <= s.capacity && s.device == device) return s.data;
  size_t capacity = std::max<size_t>(s.device == device ? 2 * s.capacity : 0, 256);
  while (capacity < count) capacity *= 2;
  void* p = nullptr;
  Status st = VP_CUDA(cudaSetDevice(device));
  if (st.ok()) st = VP_CUDA(cudaMalloc(&p, capacity * sizeof(uint64_t)));
  if (!st.ok()) {
    if (error.empty()) error = st.message + " (the paced transfers' clock stamps)";
    return nullptr;
  }
  if (s.data) g_slots_retired.emplace_back(s.device, s.data);  // queued work may still read it
  s = {device, static_cast<uint64_t*>(p), capacity};
  return s.data;
}

std::string release_scratch(double timeout_s) {
  std::lock_guard<std::mutex> lock(g_slots_mu);
  std::vector<std::pair<int, uint64_t*>> all(g_slots_retired);
  for (const auto& [stream, s] : g_slots)
    if (s.data) all.emplace_back(s.device, s.data);
  std::map<int, bool> drained;  // device -> synchronised
  for (const auto& [device, p] : all) {
    if (drained.count(device)) continue;
    // a device synchronisation has no deadline: it runs on a thread of its own, waited for with one
    auto done = std::make_shared<std::promise<Status>>();
    std::future<Status> result = done->get_future();
    std::thread([device = device, done] {
      Status s = VP_CUDA(cudaSetDevice(device));
      if (s.ok()) s = VP_CUDA(cudaDeviceSynchronize());
      done->set_value(s);
    }).detach();
    if (result.wait_for(seconds_of(timeout_s)) != std::future_status::ready)
      return "device " + std::to_string(device) + " did not drain within " + std::to_string(timeout_s) +
             " s: the scratch buffers stay allocated";
    if (const Status s = result.get(); !s.ok()) return s.message;
    drained[device] = true;
  }
  for (const auto& [device, p] : all) {
    VP_CUDA(cudaSetDevice(device));
    if (const Status s = VP_CUDA(cudaFree(p)); !s.ok()) return s.message;
  }
  g_slots.clear();
  g_slots_retired.clear();
  return "";
}

PeerWrite peer_write(int writer, const void* buffer, bool debug) {
  const auto key = std::make_pair(reinterpret_cast<uintptr_t>(buffer), writer);
  {
    std::lock_guard<std::mutex> lock(g_write_mu);
    auto it = g_write.find(key);
    if (it != g_write.end()) return it->second;
  }
  const BufferFacts f = facts_of(buffer, writer);
  const PeerWrite w = decide_peer_write(f, writer, f.owner < 0 || peer_access(writer, f.owner));
  char line[64];
  std::snprintf(line, sizeof line, "peer write %p from device %d: ", buffer, writer);
  const std::string said = line + w.why;
  if (debug) std::fprintf(stderr, "variopath: %s\n", said.c_str());
  std::lock_guard<std::mutex> lock(g_write_mu);
  if (g_write.size() >= 4096) g_write.clear();  // XLA's buffers are few; a churn of addresses is bounded
  g_write[key] = w;
  g_log.push_back(said);
  if (g_log.size() > 256) g_log.pop_front();
  return w;
}

void note_fallback(const std::string& what) {
  std::lock_guard<std::mutex> lock(g_write_mu);
  g_log.push_back("fallback: " + what);
  if (g_log.size() > 256) g_log.pop_front();
}

std::vector<std::string> transport_log() {
  std::lock_guard<std::mutex> lock(g_write_mu);
  return {g_log.begin(), g_log.end()};
}

std::unique_ptr<Streams> cuda_streams(const std::vector<Contribution>& parts, const Layout& layout, bool debug,
                                      std::string& error) {
  auto streams = std::make_unique<CudaStreams>(parts, layout, debug);
  error = streams->error();
  if (!error.empty()) return nullptr;
  return streams;
}

}  // namespace variopath::cuda
