#include "cuda/ipc.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda/check.h"
#include "cuda/pull_streams.h"
#include "shm_collective.h"

namespace variopath::cuda {

namespace {

void check(const Status& s, const char* what) {
  if (!s.ok()) throw std::runtime_error(s.message + " (" + what + ")");
}

// What a peer needs to find a rank's rows: which staging of its process holds them.
struct Locator {
  int64_t serial;  // -1: none staged
  int64_t bytes;
  int32_t device;  // the owner's device ordinal, in the owner's process
  int32_t pad;
  cudaIpcMemHandle_t handle;
};

// One device staging buffer of this process.
struct Exported {
  int device = -1;
  uint8_t* data = nullptr;
  size_t bytes = 0;
  int64_t serial = -1;
  bool busy = false;
  cudaIpcMemHandle_t handle{};
};

// A peer's staging mapped here; closed when the last holder lets it go.
struct Mapping {
  int device;
  uint8_t* data;
  ~Mapping() {
    int previous = 0;
    VP_CUDA(cudaGetDevice(&previous));
    VP_CUDA(cudaSetDevice(device));
    VP_CUDA(cudaIpcCloseMemHandle(data));
    VP_CUDA(cudaSetDevice(previous));
  }
};

struct Locked {
  explicit Locked(shm::Control& c) : c(c) { c.lock.lock(); }
  ~Locked() { c.lock.unlock(); }
  shm::Control& c;
};

// Staging grows in powers of two from 1 MiB, so a growing demand makes few generations.
size_t staging_size(size_t bytes) {
  size_t size = size_t(1) << 20;
  while (size < bytes) size *= 2;
  return size;
}

// This process's device staging and its mappings of its peers', per configuration (attached to
// its shm::Transport, whose control segment carries the generations and the acknowledgements).
class IpcState final : public shm::Transport::Attachment {
 public:
  explicit IpcState(shm::Transport& t) : t_(t) {}

  // Close every mapping, then free this process's staging once its peers closed theirs: they do
  // at their next call or their own release, or they left or died. Whatever a live peer still
  // maps after a second stays allocated until this process exits (freeing it would be
  // undefined behaviour for that peer).
  ~IpcState() override {
    std::lock_guard<std::mutex> lock(mu_);
    mapped_.clear();
    for (auto* list : {&pool_, &kept_}) {
      retired_.insert(retired_.end(), list->begin(), list->end());
      list->clear();
    }
    shm::Control& c = t_.control();
    try {  // a destructor must not throw: the shared lock does when its holder is stuck (shm.h)
      {
        Locked l(c);
        auto& me = c.procs[t_.process()];
        me.exported_from = LLONG_MAX;
        for (int32_t q = 0; q < t_.processes(); ++q) me.closed_below[q] = LLONG_MAX;
        c.lock.notify();
      }
      const auto until = Clock::now() + std::chrono::seconds(1);
      while (!free_retired() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    } catch (const std::exception&) {
      // the peers cannot be told or asked: whatever is left stays allocated until this process exits
    }
  }

  // Once per call and rank, whether it stages rows or not: close the mappings whose owners
  // retired them and free what this process retired and every peer closed.
  void tidy() {
    std::lock_guard<std::mutex> lock(mu_);
    close_stale();
    free_retired();
  }

  // A free staging of at least `bytes` on `device` (a new, larger generation when none fits),
  // marked busy; every staging this process holds (busy, free, kept and retired ones not freed
  // yet: tidy() first) stays within `budget` bytes (0: unbounded). Throws, naming the budget.
  Exported acquire(int device, size_t bytes, int64_t budget) {
    std::lock_guard<std::mutex> lock(mu_);
    Exported* best = nullptr;
    for (auto& e : pool_)
      if (!e.busy && e.device == device && e.bytes >= bytes && (!best || e.bytes < best->bytes)) best = &e;
    if (best) {
      best->busy = true;
      return *best;
    }
    for (auto it = pool_.begin(); it != pool_.end();)  // free ones too small for this call retire
      if (!it->busy && it->device == device && it->bytes < bytes) {
        retired_.push_back(*it);
        it = pool_.erase(it);
      } else {
        ++it;
      }
    size_t held = 0;
    for (const auto* list : {&pool_, &kept_, &retired_})
      for (const auto& h : *list) held += h.bytes;
    Exported e;
    e.device = device;
    e.bytes = shm::within_budget(bytes, staging_size(bytes), held, budget,
                                 "cuda-ipc device staging of " + t_.describe(t_.process()));
    e.serial = next_serial_++;
    e.busy = true;
    void* p = nullptr;
    check(VP_CUDA(cudaMalloc(&p, e.bytes)), "cuda-ipc staging");
    e.data = static_cast<uint8_t*>(p);
    if (const Status s = VP_CUDA(cudaIpcGetMemHandle(&e.handle, p)); !s.ok()) {
      VP_CUDA(cudaFree(p));
      check(s, "cuda-ipc staging");
    }
    pool_.push_back(e);
    publish();
    return e;
  }

  // Give a staging back: reusable, or kept until the transport goes (a peer may still read it).
  void release(int64_t serial, bool reusable) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = pool_.begin(); it != pool_.end(); ++it)
      if (it->serial == serial) {
        if (reusable) {
          it->busy = false;
        } else {
          kept_.push_back(*it);
          pool_.erase(it);
        }
        return;
      }
  }

  // This process's staging `serial` (a rank of this process reads it directly). Throws.
  const uint8_t* own(int64_t serial) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& e : pool_)
      if (e.serial == serial) return e.data;
    throw std::runtime_error("cuda-ipc staging " + std::to_string(serial) + " is not this process's");
  }

  // Process p's staging named by `loc`, mapped on `device` (opened once, then kept). Throws.
  std::shared_ptr<Mapping> open(int32_t p, const Locator& loc, int device) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto key = std::make_tuple(p, loc.serial, device);
    auto it = mapped_.find(key);
    if (it != mapped_.end()) return it->second;
    void* data = nullptr;
    const Status opened = VP_CUDA(cudaIpcOpenMemHandle(&data, loc.handle, cudaIpcMemLazyEnablePeerAccess));
    if (!opened.ok())
      throw std::runtime_error(opened.message + " for " + t_.describe(p) + "'s staging " +
                               std::to_string(loc.serial) + " on its device " + std::to_string(loc.device) +
                               " (the processes must see the same GPUs: one node, no isolating container; and a "
                               "GPU maps another GPU's memory only where they have peer access, "
                               "cudaDeviceCanAccessPeer: without either use transport='cuda-host', configure's "
                               "default there)");
    std::shared_ptr<Mapping> m(new Mapping{device, static_cast<uint8_t*>(data)});
    mapped_[key] = m;
    return m;
  }

 private:
  // With mu_: publish the lowest serial this process still exports (everything below is retired).
  void publish() {
    int64_t from = next_serial_;
    for (const auto* list : {&pool_, &kept_})
      for (const auto& e : *list) from = std::min(from, e.serial);
    shm::Control& c = t_.control();
    Locked l(c);
    c.procs[t_.process()].exported_from = from;
  }

  // With mu_: close the mappings no call holds of stagings their owners retired (or of owners
  // that left or died), and acknowledge, per owner, below which serial nothing is mapped here.
  void close_stale() {
    shm::Control& c = t_.control();
    std::vector<int64_t> from(t_.processes());
    std::vector<bool> gone(t_.processes());
    {
      Locked l(c);
      for (int32_t q = 0; q < t_.processes(); ++q) {
        from[q] = c.procs[q].exported_from;
        gone[q] = c.procs[q].state != shm::kAttached || !shm::process_alive(c.procs[q].pid);
      }
    }
    std::vector<int64_t> below(from);
    for (auto it = mapped_.begin(); it != mapped_.end();) {
      const int32_t q = std::get<0>(it->first);
      const int64_t serial = std::get<1>(it->first);
      if ((gone[q] || serial < from[q]) && it->second.use_count() == 1) {
        it = mapped_.erase(it);
      } else {
        below[q] = std::min(below[q], serial);
        ++it;
      }
    }
    Locked l(c);
    for (int32_t q = 0; q < t_.processes(); ++q) c.procs[t_.process()].closed_below[q] = below[q];
    c.lock.notify();
  }

  // With mu_: free each retired staging every live peer has closed; true when none is left.
  bool free_retired() {
    shm::Control& c = t_.control();
    std::vector<int64_t> closed(t_.processes(), LLONG_MAX);
    {
      Locked l(c);
      for (int32_t p = 0; p < t_.processes(); ++p)
        if (p != t_.process() && c.procs[p].state == shm::kAttached && shm::process_alive(c.procs[p].pid))
          closed[p] = c.procs[p].closed_below[t_.process()];
    }
    const int64_t everyone = *std::min_element(closed.begin(), closed.end());
    for (auto it = retired_.begin(); it != retired_.end();)
      if (it->serial < everyone) {
        int previous = 0;
        VP_CUDA(cudaGetDevice(&previous));
        VP_CUDA(cudaSetDevice(it->device));
        VP_CUDA(cudaFree(it->data));
        VP_CUDA(cudaSetDevice(previous));
        it = retired_.erase(it);
      } else {
        ++it;
      }
    return retired_.empty();
  }

  shm::Transport& t_;
  std::mutex mu_;  // the members below
  int64_t next_serial_ = 0;
  std::vector<Exported> pool_;     // busy, or free for reuse
  std::vector<Exported> kept_;     // a peer may still read them: neither reused nor freed
  std::vector<Exported> retired_;  // replaced by a larger generation: freed once every peer closed them
  std::map<std::tuple<int32_t, int64_t, int>, std::shared_ptr<Mapping>> mapped_;  // (process, serial, device)
};

// One rank's rows in one call: staged in this process's device staging, pulled from its peers'.
//
// The sender waits for its staging copy (host poll with the call's deadline) before it joins
// instead of recording an interprocess event for its receivers to wait on: the handler has just
// synchronised this stream to read the counts, so the wait is the staging copy alone, which a
// receiver would wait for anyway; everything a peer can read is complete before it can see the
// call, so no receiver's stream ever waits on another process (a dead sender cannot leave a
// receiver's stream blocked), and there is no event handle to open, cache and re-record safely.
class IpcRows final : public RowStaging {
 public:
  IpcRows(std::shared_ptr<IpcState> state, int32_t process, int device, cudaStream_t stream, const OpConfig& config)
      : state_(std::move(state)),
        process_(process),
        device_(device),
        stream_(stream),
        timeout_s_(config.timeout_s),
        budget_(config.staging_budget) {}

  size_t host_bytes(int64_t) const override { return 0; }
  size_t locator_bytes() const override { return sizeof(Locator); }

  std::string stage(const Contribution& c, const std::vector<int64_t>& staged_row, int64_t staged_rows, uint8_t*,
                    uint8_t* locator) override {
    Locator loc{};
    loc.serial = -1;  // until the rows are staged
    loc.device = device_;
    std::memcpy(locator, &loc, sizeof loc);
    const int64_t bytes = staged_rows * c.row_bytes;
    state_->tidy();
    if (bytes > 0) {
      try {
        const Exported e = state_->acquire(device_, static_cast<size_t>(bytes), budget_);
        serial_ = e.serial;
        const std::string err =
            copy_and_wait(device_, stream_, staged_pieces(c, staged_row, e.data), timeout_s_, "staging the rows");
        if (!err.empty()) return err;
        loc.serial = e.serial;
        loc.bytes = bytes;
        loc.handle = e.handle;
      } catch (const std::exception& err) {
        return err.what();
      }
    }
    std::memcpy(locator, &loc, sizeof loc);
    return "";
  }

  const uint8_t* rows_of(int32_t process, const uint8_t*, const uint8_t* locator) override {
    Locator loc;
    std::memcpy(&loc, locator, sizeof loc);
    if (loc.serial < 0) return nullptr;  // it stages nothing: no copy reads from it
    if (process == process_) return state_->own(loc.serial);
    auto m = state_->open(process, loc, device_);
    held_.push_back(m);
    return m->data;
  }

  std::unique_ptr<Streams> streams(const Contribution& mine, const Layout& layout, std::string& error) override {
    auto s = std::make_unique<PullStreams>(device_, stream_, layout, mine.rank, timeout_s_);
    error = s->error();
    if (!error.empty()) return nullptr;
    streams_ = s.get();
    return s;
  }

  bool copies_outlive_executor() const override { return true; }

  bool settle(Streams& streams, Clock::time_point deadline) override {
    if (&streams == streams_ && streams_->settle(deadline)) return true;
    // copies that never completed may still read these mappings: they stay open until the
    // process exits (closing one under a copy would fault this GPU)
    static auto* never_closed = new std::vector<std::shared_ptr<Mapping>>;  // never destroyed
    static std::mutex never_closed_mu;
    std::lock_guard<std::mutex> lock(never_closed_mu);
    never_closed->insert(never_closed->end(), held_.begin(), held_.end());
    return false;
  }

  // Give the staging back, and acknowledge at once the peers' retired stagings this call was the
  // last to read, so that their owners free them at their next call.
  void release(bool reusable) override {
    if (serial_ >= 0) state_->release(serial_, reusable);
    held_.clear();
    try {
      state_->tidy();
    } catch (const std::exception&) {
      // the control lock's holder is stuck (shm.h): the next call acknowledges them
    }
  }

 private:
  std::shared_ptr<IpcState> state_;
  int32_t process_;
  int device_;
  cudaStream_t stream_;
  double timeout_s_;
  int64_t budget_;
  int64_t serial_ = -1;
  std::vector<std::shared_ptr<Mapping>> held_;  // the peers' stagings this call reads
  PullStreams* streams_ = nullptr;
};

}  // namespace

std::string run_ipc_collective(int64_t run, int64_t site, int64_t group, Contribution mine) {
  std::string err;
  const Configured on = configured(mine.config, "cuda-ipc", err);
  if (!on.transport) return err;
  if (mine.device < 0 || !mine.stream)
    return "the cuda-ipc transport moves GPU devices' rows only (CPU devices in several processes: transport='shm')";
  shm::Transport& transport = *on.transport;
  auto state = std::dynamic_pointer_cast<IpcState>(
      transport.attachment([&] { return std::make_shared<IpcState>(transport); }));
  if (!state) return "configuration " + std::to_string(mine.config) + "'s transport is not a cuda-ipc one";
  IpcRows rows(state, transport.process(), mine.device, static_cast<cudaStream_t>(mine.stream), *on.config);
  return run_process_collective(transport, *on.config, run, site, group, std::move(mine), rows);
}

}  // namespace variopath::cuda
