// The shared-memory transport of one configuration across the processes of one host (issue 16,
// "Several processes"): the control segment they all map (their pids, the call slots the
// rendezvous runs in), each process's staging segments, the mappings of its peers' staging, and
// the bootstrap at configuration time (jax_ops/shm.py, through jax.distributed's key-value store).
// The cuda-ipc transport (cuda/ipc.h) runs on the same control segment and call slots, with its
// device staging kept in an Attachment.
//
// Segment names: /vpjax-<token>-ctl (removed once every process attached, so it never leaks) and
// /vpjax-<token>-p<process>-<serial> for staging; a process removes its own at release and at
// exit, and the survivors remove a dead process's when they find it dead.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "shm.h"

namespace variopath::shm {

constexpr int32_t kMaxProcesses = 64;
constexpr int32_t kMaxRanks = 64;         // mesh-axis positions per collective
constexpr int32_t kSlots = 64;            // calls in flight at once
constexpr int32_t kMaxTransfers = 8192;   // planned transfers per call
constexpr size_t kErrorBytes = 1024;
constexpr uint64_t kMagic = 0x32687370766a6178;  // "xajvpsh2"

enum ProcessState : int32_t { kAbsent = 0, kAttached = 1, kLeft = 2 };

struct ProcessEntry {
  int32_t pid;
  int32_t state;  // ProcessState
  int32_t reaped;  // a survivor removed its staging segments
  int32_t pad;
  int64_t next_serial;  // its staging segments are serials [0, next_serial)
  // Row staging its peers map (cuda-ipc, cuda/ipc.h): it exports no staging of a serial below
  // exported_from any more, and it has closed its mappings of process q's exported stagings of
  // serials below closed_below[q]; an owner frees a retired staging once every live peer closed it.
  int64_t exported_from;
  int64_t closed_below[kMaxProcesses];
  // Cross-memory attach (cma.h): the address of its probe word, the processes whose probe word
  // it could read at ready() (bit q: process q; 0: it did not try), and why not where it could not.
  uint64_t probe;
  uint64_t readable;
  char unreadable[kErrorBytes];
};

// One rank's place in a call.
struct RankEntry {
  int32_t process;
  int8_t arrived, reading, busy, departed;  // reading its peers' staged metadata (1) or done (2); busy: a claimed copy
  int64_t serial;  // its staging segment
};

// One call in flight, keyed by (site, group, run, seq): XLA's run id of the program's logical
// execution (the same in every process) and the call's number among those of its site and group
// in that run (a loop calls a site again).
struct Slot {
  int32_t used, expected, arrived, departed;
  int64_t site, group, run, seq, stamp;
  int32_t failed, pad;
  char error[kErrorBytes];
  RankEntry ranks[kMaxRanks];
  uint8_t states[kMaxTransfers];  // TransferState
  int8_t claimer[kMaxTransfers];  // the rank copying a transfer
};

struct Control {
  uint64_t magic;
  int32_t processes, pad;
  int64_t stamp;  // slots made so far
  SharedLock lock;
  ProcessEntry procs[kMaxProcesses];
  Slot slots[kSlots];
};

class Transport {
 public:
  Transport(std::string token, std::unique_ptr<Segment> control, int32_t process, int32_t processes);
  ~Transport();  // leaves the control segment (peers see it left) and removes its staging

  Control& control() const { return *reinterpret_cast<Control*>(control_->data()); }
  int32_t process() const { return process_; }
  // What the names of its segments in /dev/shm begin with ("vpjax-<token>-").
  std::string segment_prefix() const { return "vpjax-" + token_ + "-"; }
  int32_t processes() const { return processes_; }
  void unlink_control() { control_->unlink(); }

  // With the control lock held: "" or what happened to the first process of `mask` (bit p:
  // process p) that died or left; a dead one's staging segments are removed.
  std::string gone(uint64_t mask);
  std::string describe(int32_t p) const;  // "process p (pid N)"

  // How receivers read the rows sent to them (agree()): straight out of the senders' input
  // buffers by cross-memory attach ("" ), else from the senders' staging (why, non-empty).
  std::string staged_because() const {
    std::lock_guard<std::mutex> lock(mu_);
    return staged_because_;
  }
  void set_staged_because(std::string why) {
    std::lock_guard<std::mutex> lock(mu_);
    staged_because_ = std::move(why);
  }

  // State a transport built on this one keeps per configuration and process (cuda/ipc.h: device
  // staging and the mappings of peers'), made by `make` on first use; destroyed before this
  // transport leaves the control segment.
  struct Attachment {
    virtual ~Attachment() = default;
  };
  std::shared_ptr<Attachment> attachment(const std::function<std::shared_ptr<Attachment>()>& make);

  // This process's staging: a free segment of at least `bytes` (a new, larger generation when
  // none fits; free ones too small go), and its return (not reused when a peer may still read
  // it). The segments this process holds stay within `budget` bytes (0: unbounded): a call that
  // would need more throws an error naming it.
  struct Staging {
    std::shared_ptr<Segment> segment;
    int64_t serial = -1;
  };
  Staging acquire(size_t bytes, int64_t budget);
  void release(const Staging& staging, bool reusable);
  // The staging segment `serial` of process `p`, mapped here (read-only for peers'); throws.
  std::shared_ptr<Segment> staging_of(int32_t p, int64_t serial);

  // This rank's number for its call of (site, group) in run `run`: the n-th call of that site
  // and group in the run. Keyed by the run, a call never depends on what another run did: ranks
  // that skipped different ops of a failed run (a device stops its program at its first
  // failing op), or a rank that succeeded where a peer failed, meet again in the next run.
  int64_t next_sequence(int64_t site, int64_t group, int32_t rank, int64_t run);

  // A rank of this process that joined call slot `slot` (made as `stamp`) and could not leave
  // it (its lock timed out, shm.h) leaves it later, failing the call with `why`: at this
  // process's next call, or when it leaves the transport (else 64 such slots would exhaust the
  // control segment). settle_departures pays what is owed, with the control lock held.
  void owe_departure(Slot* slot, int64_t stamp, int32_t rank, const std::string& why);
  void settle_departures();
  // Held while a rank of this process plans, so that its other ranks find the plan in the
  // configuration's cache instead of making it again (every rank plans for itself).
  std::mutex planning;

 private:
  std::string name(int32_t p, int64_t serial) const;
  struct Buffer {
    std::shared_ptr<Segment> segment;
    int64_t serial;
    bool busy;
  };
  std::string token_;
  std::unique_ptr<Segment> control_;
  std::shared_ptr<Attachment> attachment_;  // under mu_
  int32_t process_, processes_;
  mutable std::mutex mu_;  // the members below
  std::string staged_because_ = "the processes have not agreed on cross-memory attach yet";
  std::vector<Buffer> pool_;
  std::map<std::pair<int32_t, int64_t>, std::shared_ptr<Segment>> peers_;
  struct Count {
    int64_t run = 0, calls = 0;
  };
  std::map<std::tuple<int64_t, int64_t, int32_t>, Count> sequence_;  // the rank's latest run
  struct Owed {
    Slot* slot;
    int64_t stamp;
    int32_t rank;
    std::string why;
  };
  std::mutex owed_mu_;  // never held while taking the control lock (mu_ is, in acquire)
  std::vector<Owed> owed_;
};

// Tests and diagnostics: the control segment's slots held by calls (a failed call's slot that
// every rank which joined it has left is free to reuse).
int32_t slots_in_use(int64_t config);

// The size of a new staging generation: `size` (`bytes` rounded up) where it fits within
// `budget` (0: unbounded) beside the `held` bytes, else `bytes`; throws an error naming `what` and the budget
// when `bytes` do not fit.
size_t within_budget(size_t bytes, size_t size, size_t held, int64_t budget, const std::string& what);

// The registry of transports by configuration id, and the bootstrap steps (module.cc).
// process 0: returns the control name; taking its lock gives up after `timeout_s` (shm.h)
std::string create(int64_t config, int32_t processes, double timeout_s);
void attach(int64_t config, const std::string& name, int32_t process, int32_t processes);
// After every process attached: check them all, remove the name, and (if `cross_memory`) probe
// whether this process can read every peer's memory (cma.h).
void ready(int64_t config, bool cross_memory);
// After every process is ready: whether receivers read by cross-memory attach (every process
// tried and could read every other) or from staging; the same answer in every process.
void agree(int64_t config);
void release(int64_t config);
void release_all();
std::vector<int32_t> pids(int64_t config);
// Tests: a thread of this process takes configuration `config`'s lock and keeps it `seconds`
// (a holder stopped in its bookkeeping); returns once it holds it.
void hold_lock(int64_t config, double seconds);
std::shared_ptr<Transport> find(int64_t config);

}  // namespace variopath::shm
