#include "nccl/nccl_collective.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "cuda/check.h"
#include "cuda/cuda_streams.h"
#include "layout.h"
#include "nccl/loader.h"
#include "nccl/p2p.h"
#include "streams.h"

namespace variopath::nccl {

namespace {

Clock::time_point deadline_after(double seconds) {
  return Clock::now() + seconds_of(seconds);
}

void pause(int polls) {
  if (polls < 64)
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(polls < 1024 ? 20 : 500));
}

using cuda::Status;

// The message of a failed CUDA call (VP_CUDA names the call and the device), with what it was for.
std::string cuda_failed(const Status& s, const char* what) { return s.message + " (" + what + ")"; }

// Wait until `comm`'s last operation is no longer in progress (a non-blocking communicator
// returns ncclInProgress from its calls) or `deadline`. "" or the error.
std::string settle(const Api& api, Comm comm, Clock::time_point deadline, double timeout_s, const char* what) {
  for (int polls = 0;; ++polls) {
    Result state = kSuccess;
    const Result r = api.CommGetAsyncError(comm, &state);
    if (r != kSuccess) return describe(api, r, "ncclCommGetAsyncError", comm);
    if (state == kSuccess) return "";
    if (state != kInProgress) return describe(api, state, what, comm);
    if (Clock::now() >= deadline)
      return "timed out after " + std::to_string(timeout_s) + " s: " + what + " (a peer process stalled or died)";
    pause(polls);
  }
}

// Issue an NCCL call: ncclInProgress is fine on a non-blocking communicator.
std::string issued(const Api& api, Result r, const char* what, Comm comm) {
  return r == kSuccess || r == kInProgress ? "" : describe(api, r, what, comm);
}

// One device's communicator and the buffers its calls gather their rows in.
struct DeviceComm {
  Comm comm = nullptr;
  int32_t rank = -1;  // its communicator rank
  int device = -1;
  std::mutex mu;              // one call at a time
  int64_t* dev = nullptr;     // this row, then every device's
  int64_t* host = nullptr;    // pinned: the same
  size_t words = 0;           // capacity of both
  cudaEvent_t done = nullptr;  // the watchdog's event
};

// A configuration's communicators in this process.
struct Comms {
  const Api* api = nullptr;
  int32_t nranks = 0;
  std::map<int, std::unique_ptr<DeviceComm>> by_device;
  std::atomic<bool> broken{false};
  std::mutex mu;
  std::string why;  // under mu: what broke it

  void fail(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu);
    if (!broken.exchange(true)) why = reason;
  }
  std::string reason() {
    std::lock_guard<std::mutex> lock(mu);
    return why;
  }

  // Destroy a healthy configuration's communicators; abort those of a broken one (its peers may
  // be gone, and a destroy would wait for them).
  ~Comms() {
    int previous = 0;
    VP_CUDA(cudaGetDevice(&previous));
    for (auto& [device, dc] : by_device) {
      VP_CUDA(cudaSetDevice(device));
      if (dc->comm) (broken ? api->CommAbort : api->CommDestroy)(dc->comm);
      if (dc->dev) VP_CUDA(cudaFree(dc->dev));
      if (dc->host) VP_CUDA(cudaFreeHost(dc->host));
      if (dc->done) cuda::give_event(device, dc->done);
    }
    VP_CUDA(cudaSetDevice(previous));
  }
};

std::mutex g_mu;
auto* g_comms = new std::map<int64_t, std::shared_ptr<Comms>>;  // leaked: no NCCL calls at exit

std::shared_ptr<Comms> find(int64_t config) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_comms->find(config);
  return it == g_comms->end() ? nullptr : it->second;
}

const Api& library_or_throw(const std::string& library) {
  std::string error;
  const Api* api = load(library, error);
  if (!api) throw std::runtime_error(error);
  return *api;
}

// The stream interface over one rank's XLA stream, for what a rank writes into its own memory
// (write_local: its result arrays, self rows, zeroing); the NCCL calls move everything else, so
// the peer operations of the interface are refused as a bug.
class OwnStream final : public Streams {
 public:
  explicit OwnStream(cudaStream_t stream) : stream_(stream) {}
  void wait(int32_t, int32_t) override { bug("wait"); }
  void send(int32_t, const std::vector<Send>&) override { bug("send"); }
  void local(int32_t, uint8_t* dst, const uint8_t* src, int64_t nbytes) override {
    if (nbytes) check(VP_CUDA(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, stream_)));
  }
  void zero(int32_t, uint8_t* dst, int64_t nbytes) override {
    if (nbytes) check(VP_CUDA(cudaMemsetAsync(dst, 0, nbytes, stream_)));
  }
  bool synchronize(int32_t, Clock::time_point) override {
    bug("synchronize");
    return false;
  }
  std::string error() const override { return error_; }
  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override {
    began.clear();
    ended.clear();
  }

 private:
  void check(const Status& s) {
    if (!s.ok() && error_.empty()) error_ = s.message;
  }
  void bug(const char* op) {
    if (error_.empty()) error_ = std::string("the NCCL transport's own stream was asked to ") + op;
  }
  cudaStream_t stream_;
  std::string error_;
};

// The watchdog: wait for everything enqueued on `stream` so far, polling its event and the
// communicator's asynchronous error, until `timeout_s` passed. "" or the error.
std::string watch(const Api& api, DeviceComm& dc, cudaStream_t stream, double timeout_s, const char* what) {
  if (const Status s = VP_CUDA(cudaEventRecord(dc.done, stream)); !s.ok()) return cuda_failed(s, what);
  const auto deadline = deadline_after(timeout_s);
  for (int polls = 0;; ++polls) {
    const Status polled = VP_CUDA(cudaEventQuery(dc.done));  // clears cudaErrorNotReady
    if (polled.ok()) return "";
    if (!polled.not_ready()) return cuda_failed(polled, what);
    Result state = kSuccess;
    const Result r = api.CommGetAsyncError(dc.comm, &state);
    if (r != kSuccess) return describe(api, r, "ncclCommGetAsyncError", dc.comm);
    if (state != kSuccess && state != kInProgress) return describe(api, state, what, dc.comm);
    if (Clock::now() >= deadline)
      return "timed out after " + std::to_string(timeout_s) + " s: " + what +
             " never completed (a peer process stalled or died)";
    pause(polls);
  }
}

// Room for `words` int64 in the device's gather buffers (grown, never shrunk). "" or the error.
std::string reserve(DeviceComm& dc, size_t words) {
  if (words <= dc.words) return "";
  if (dc.dev) VP_CUDA(cudaFree(dc.dev));
  if (dc.host) VP_CUDA(cudaFreeHost(dc.host));
  dc.dev = dc.host = nullptr;
  dc.words = 0;
  void* d = nullptr;
  void* h = nullptr;
  if (const Status s = VP_CUDA(cudaMalloc(&d, words * sizeof(int64_t))); !s.ok()) return cuda_failed(s, "cudaMalloc");
  dc.dev = static_cast<int64_t*>(d);
  if (const Status s = VP_CUDA(cudaMallocHost(&h, words * sizeof(int64_t))); !s.ok())
    return cuda_failed(s, "cudaMallocHost");
  dc.host = static_cast<int64_t*>(h);
  dc.words = words;
  return "";
}

// The call after its communicator is known; an error from an NCCL or CUDA failure or a timeout
// sets `broke` (the communicator must be aborted), a validation error does not.
std::string exchange(const Api& api, Comms& comms, DeviceComm& dc, int64_t site, int64_t group, Contribution& mine,
                     int64_t slots, const std::shared_ptr<OpConfig>& config, bool& broke) {
  const double timeout_s = config->timeout_s;
  const auto stream = static_cast<cudaStream_t>(mine.stream);
  const int32_t n = static_cast<int32_t>(mine.axis_size);
  const int64_t words = row_words(slots, mine.ragged);
  const size_t bytes = static_cast<size_t>(words) * sizeof(int64_t);
  broke = true;
  std::string err = reserve(dc, static_cast<size_t>(words) * (1 + comms.nranks));
  if (!err.empty()) return err;
  // the decision this process holds for the call, whose id the others compare with theirs
  const Decider::Site history{site, group};
  std::string undecided;
  const Decision decision = decision_for(*config, history, undecided);
  if (mine.error.empty()) mine.error = undecided;
  mine.decision = decision.id;
  // every device's row, gathered on the stream and copied to pinned host memory
  encode_row(mine, static_cast<int32_t>(group), slots, dc.host);
  if (const Status s = VP_CUDA(cudaMemcpyAsync(dc.dev, dc.host, bytes, cudaMemcpyHostToDevice, stream)); !s.ok())
    return cuda_failed(s, "copying the counts to the device");
  err = issued(api, api.AllGather(dc.dev, dc.dev + words, bytes, kUint8, dc.comm, stream), "ncclAllGather", dc.comm);
  if (err.empty()) err = settle(api, dc.comm, deadline_after(timeout_s), timeout_s, "ncclAllGather of the counts");
  if (!err.empty()) return err;
  if (const Status s = VP_CUDA(cudaMemcpyAsync(dc.host + words, dc.dev + words, bytes * comms.nranks,
                                               cudaMemcpyDeviceToHost, stream));
      !s.ok())
    return cuda_failed(s, "copying the gathered counts to the host");
  err = watch(api, dc, stream, timeout_s, "the all-gather of every rank's counts");
  if (!err.empty()) return err;
  // the same placement, plan and layout as every other rank of the collective
  broke = false;
  std::vector<Contribution> parts;
  std::vector<int32_t> comm_rank;
  err = decode_group(dc.host + words, comms.nranks, words, static_cast<int32_t>(group), n, parts, comm_rank);
  if (!err.empty()) return err;
  if (comm_rank[mine.rank] != dc.rank)
    return "mesh position " + std::to_string(mine.rank) + " is claimed by communicator rank " +
           std::to_string(comm_rank[mine.rank]) + ", not this device's " + std::to_string(dc.rank);
  const int32_t me = mine.rank;
  parts[me] = std::move(mine);  // its own buffers
  std::shared_ptr<OpConfig> used;
  Layout layout;
  std::vector<int64_t> step_ptr;
  err = lay_out_call(parts, used, layout, step_ptr, me, decision, &history);  // its own pieces' plan
  if (!err.empty()) return err;
  broke = true;
  OwnStream own(stream);
  write_local(layout, parts, me, own);
  err = own.error();
  if (!err.empty()) return err;
  // one group per plan step: this rank's sends and receives, matched by its peers' in order
  const uint8_t* input = parts[me].input;
  uint8_t* output = parts[me].output;
  for (const P2pStep& step : p2p_steps(layout, step_ptr, me)) {
    if (step.sends.empty() && step.recvs.empty()) continue;
    err = issued(api, api.GroupStart(), "ncclGroupStart", dc.comm);
    for (const Piece& p : step.sends)
      if (err.empty())
        err = issued(api, api.Send(input + p.offset, static_cast<size_t>(p.nbytes), kUint8, comm_rank[p.peer], dc.comm,
                                   stream),
                     "ncclSend", dc.comm);
    for (const Piece& p : step.recvs)
      if (err.empty())
        err = issued(api, api.Recv(output + p.offset, static_cast<size_t>(p.nbytes), kUint8, comm_rank[p.peer], dc.comm,
                                   stream),
                     "ncclRecv", dc.comm);
    const std::string ended = issued(api, api.GroupEnd(), "ncclGroupEnd", dc.comm);  // always close the group
    if (err.empty()) err = ended;
    if (err.empty()) err = settle(api, dc.comm, deadline_after(timeout_s), timeout_s, "a step's sends and receives");
    if (!err.empty()) return err;
  }
  return watch(api, dc, stream, timeout_s, "the exchange");
}

}  // namespace

std::string unique_id(const std::string& library) {
  const Api& api = library_or_throw(library);
  UniqueId id;
  if (const Result r = api.GetUniqueId(&id); r != kSuccess) throw std::runtime_error(describe(api, r, "ncclGetUniqueId"));
  return std::string(id.internal, kUniqueIdBytes);
}

void init(int64_t config, const std::string& library, const std::string& id, int32_t nranks,
          const std::vector<int32_t>& ranks, const std::vector<int32_t>& devices, double timeout_s) {
  const Api& api = library_or_throw(library);
  if (id.size() != kUniqueIdBytes)
    throw std::runtime_error("an NCCL unique id has " + std::to_string(kUniqueIdBytes) + " bytes, got " +
                             std::to_string(id.size()));
  if (ranks.size() != devices.size() || devices.empty())
    throw std::runtime_error("one communicator rank per local device, and at least one device");
  for (int32_t r : ranks)
    if (r < 0 || r >= nranks)
      throw std::runtime_error("communicator rank " + std::to_string(r) + " outside 0.." + std::to_string(nranks - 1));
  release(config);
  UniqueId uid;
  std::memcpy(uid.internal, id.data(), kUniqueIdBytes);
  auto comms = std::make_shared<Comms>();
  comms->api = &api;
  comms->nranks = nranks;
  int previous = 0;
  VP_CUDA(cudaGetDevice(&previous));
  std::string err;
  // several local devices: their communicators are made together, in one group
  err = issued(api, api.GroupStart(), "ncclGroupStart", nullptr);
  for (size_t i = 0; i < devices.size() && err.empty(); ++i) {
    auto& dc = comms->by_device[devices[i]];
    if (dc) {
      err = "device " + std::to_string(devices[i]) + " is named twice";
      break;
    }
    dc = std::make_unique<DeviceComm>();
    dc->device = devices[i];
    dc->rank = ranks[i];
    if (const Status s = VP_CUDA(cudaSetDevice(devices[i])); !s.ok()) {
      err = cuda_failed(s, "cudaSetDevice");
      break;
    }
    Config cfg = make_config(false);  // non-blocking: polled below against the timeout
    err = issued(api, api.CommInitRankConfig(&dc->comm, nranks, uid, ranks[i], &cfg), "ncclCommInitRankConfig",
                 nullptr);
  }
  const std::string ended = issued(api, api.GroupEnd(), "ncclGroupEnd", nullptr);
  if (err.empty()) err = ended;
  const auto deadline = deadline_after(timeout_s);
  for (auto& [device, dc] : comms->by_device)
    if (err.empty() && dc->comm) {
      err = settle(api, dc->comm, deadline, timeout_s, "making the NCCL communicator (ncclCommInitRankConfig)");
      if (!err.empty()) err = "device " + std::to_string(device) + ", communicator rank " + std::to_string(dc->rank) +
                              " of " + std::to_string(nranks) + ": " + err;
    }
  for (auto& [device, dc] : comms->by_device)
    if (err.empty()) {
      std::string why;
      dc->done = static_cast<cudaEvent_t>(cuda::take_event(device, why));
      if (!dc->done) err = why;
    }
  VP_CUDA(cudaSetDevice(previous));
  if (!err.empty()) {
    if (err.find("Duplicate GPU") != std::string::npos)
      err += " (NCCL allows one communicator rank per GPU: one process per GPU)";
    comms->broken = true;  // abort what was made
    comms.reset();
    throw std::runtime_error("NCCL " + version_string(api.version) + " from " + api.path + ": " + err);
  }
  std::lock_guard<std::mutex> lock(g_mu);
  (*g_comms)[config] = std::move(comms);
}

void release(int64_t config) {
  std::shared_ptr<Comms> gone;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_comms->find(config);
    if (it == g_comms->end()) return;
    gone = std::move(it->second);
    g_comms->erase(it);
  }
}

std::string run_collective(int64_t site, int64_t group, Contribution mine, int64_t slots) {
  auto comms = find(mine.config);
  if (!comms)
    return "configuration " + std::to_string(mine.config) +
           " has no NCCL communicator in this process (call configure(transport='nccl') in every process)";
  if (comms->broken)
    return "the NCCL communicator of configuration " + std::to_string(mine.config) + " was aborted (" +
           comms->reason() + "): call configure() again";
  auto it = comms->by_device.find(mine.device);
  if (it == comms->by_device.end())
    return "device " + std::to_string(mine.device) + " is not among the devices the NCCL transport was configured with";
  DeviceComm& dc = *it->second;
  auto config = find_config(mine.config);
  if (!config) return "configuration " + std::to_string(mine.config) + " is not registered (call configure())";
  // from here on this device takes part in the all-gather whatever it brought (a bad rank or
  // argument becomes the same error on every rank of its collective), so no peer waits for it
  std::lock_guard<std::mutex> lock(dc.mu);
  bool broke = false;
  const std::string err = exchange(*comms->api, *comms, dc, site, group, mine, slots, config, broke);
  if (err.empty() || !broke) return err;
  comms->api->CommAbort(dc.comm);
  dc.comm = nullptr;
  comms->fail(err);
  return err + "; the NCCL communicator was aborted: call configure() again";
}

std::string selftest(int device, const std::string& library, int64_t nbytes, double timeout_s, std::string& detail) {
  std::string error;
  const Api* api = load(library, error);
  if (!api) return error;
  if (nbytes <= 0) return "nbytes must be > 0";
  int previous = 0;
  VP_CUDA(cudaGetDevice(&previous));
  if (const Status s = VP_CUDA(cudaSetDevice(device)); !s.ok()) return cuda_failed(s, "cudaSetDevice");
  UniqueId id;
  Comm comm = nullptr;
  cudaStream_t stream = nullptr;
  uint8_t *send = nullptr, *gathered = nullptr, *received = nullptr;
  std::string err = issued(*api, api->GetUniqueId(&id), "ncclGetUniqueId", nullptr);
  Config cfg = make_config(false);
  if (err.empty()) err = issued(*api, api->CommInitRankConfig(&comm, 1, id, 0, &cfg), "ncclCommInitRankConfig", nullptr);
  const auto n = static_cast<size_t>(nbytes);
  const auto cuda = [&](const Status& s) {
    if (err.empty() && !s.ok()) err = s.message;
  };
  if (err.empty()) err = settle(*api, comm, deadline_after(timeout_s), timeout_s, "ncclCommInitRankConfig");
  cuda(VP_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)));
  cuda(VP_CUDA(cudaMalloc(&send, n)));
  cuda(VP_CUDA(cudaMalloc(&gathered, n)));
  cuda(VP_CUDA(cudaMalloc(&received, n)));
  std::vector<uint8_t> pattern(n), back(n);
  for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<uint8_t>(i * 131 + 7);
  cuda(VP_CUDA(cudaMemcpy(send, pattern.data(), n, cudaMemcpyHostToDevice)));
  cuda(VP_CUDA(cudaMemset(gathered, 0, n)));
  cuda(VP_CUDA(cudaMemset(received, 0, n)));
  const auto t0 = Clock::now();
  if (err.empty()) err = issued(*api, api->AllGather(send, gathered, n, kUint8, comm, stream), "ncclAllGather", comm);
  if (err.empty()) err = settle(*api, comm, deadline_after(timeout_s), timeout_s, "ncclAllGather");
  if (err.empty()) {
    err = issued(*api, api->GroupStart(), "ncclGroupStart", comm);
    if (err.empty()) err = issued(*api, api->Send(send, n, kUint8, 0, comm, stream), "ncclSend", comm);
    if (err.empty()) err = issued(*api, api->Recv(received, n, kUint8, 0, comm, stream), "ncclRecv", comm);
    const std::string ended = issued(*api, api->GroupEnd(), "ncclGroupEnd", comm);
    if (err.empty()) err = ended;
  }
  if (err.empty()) err = settle(*api, comm, deadline_after(timeout_s), timeout_s, "the self send/receive");
  if (err.empty()) {
    DeviceComm dc;
    dc.comm = comm;
    std::string why;
    dc.done = static_cast<cudaEvent_t>(cuda::take_event(device, why));
    err = dc.done ? watch(*api, dc, stream, timeout_s, "the one-rank all-gather and self send/receive") : why;
    if (dc.done) cuda::give_event(device, dc.done);
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  size_t wrong = 0;
  for (uint8_t* buf : {gathered, received}) {
    cuda(VP_CUDA(cudaMemcpy(back.data(), buf, n, cudaMemcpyDeviceToHost)));
    if (err.empty())
      for (size_t i = 0; i < n; ++i) wrong += back[i] != pattern[i];
  }
  if (err.empty() && wrong) err = std::to_string(wrong) + " wrong bytes after the all-gather and self send/receive";
  if (comm) (err.empty() ? api->CommDestroy : api->CommAbort)(comm);
  for (uint8_t* buf : {send, gathered, received})
    if (buf) VP_CUDA(cudaFree(buf));
  if (stream) VP_CUDA(cudaStreamDestroy(stream));
  VP_CUDA(cudaSetDevice(previous));
  detail = "NCCL " + version_string(api->version) + " from " + api->path + ": one-rank all-gather and self send/receive of " +
           std::to_string(nbytes) + " bytes in " + std::to_string(ms) + " ms";
  return err;
}

}  // namespace variopath::nccl
