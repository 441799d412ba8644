// POSIX shared memory between the processes of one host, and how they wait on each other there
// (issue 16, "Several processes": the CPU backend). A Segment is one named, mapped shm object;
// a SharedLock, placed inside a segment, is a robust process-shared mutex with a futex word to
// wait on with a deadline; `process_alive` tells a waiting process whether a peer still runs.
#pragma once

#include <pthread.h>
#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "clock.h"

namespace variopath::shm {

// One mapped POSIX shared-memory object. The creator owns the name: it unlinks it when the
// segment is destroyed (or earlier, with unlink()); an opener only unmaps.
class Segment {
 public:
  // A new object of `bytes` bytes (the name must not exist), mapped read-write and populated.
  static std::unique_ptr<Segment> create(const std::string& name, size_t bytes);
  // An existing object, mapped whole (read-write or read-only) and populated.
  static std::unique_ptr<Segment> open(const std::string& name, bool writable);
  ~Segment();
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& name() const { return name_; }
  bool writable() const { return writable_; }
  void unlink();  // remove the name now (the mapping stays valid); creators only

  // Run `pin` on this mapping once, whoever asks first (the cuda-host transport registers it as
  // pinned memory, cuda/host_staging.cc); every caller gets its result, "" or the error. The
  // `undo` a successful `pin` sets runs before the mapping goes.
  using Undo = std::function<void()>;
  std::string pin_once(const std::function<std::string(Undo& undo)>& pin);

 private:
  Segment(std::string name, uint8_t* data, size_t size, bool owner, bool writable)
      : name_(std::move(name)), data_(data), size_(size), owner_(owner), writable_(writable) {}
  std::string name_;
  uint8_t* data_;
  size_t size_;
  bool owner_, writable_;
  std::mutex pin_mu_;  // the members below
  bool pin_tried_ = false;
  std::string pin_error_;
  Undo unpin_;
};

// Remove a segment name whatever created it (a dead peer's); false if there was none.
bool unlink_name(const std::string& name);
// Whether a segment of that name exists (its creator has not removed it).
bool name_exists(const std::string& name);

// A mutex and a wait word in shared memory. The mutex is robust: a process that dies holding it
// does not block the others (the next locker is told). It is held only for bookkeeping, never
// across a wait, so taking it gives up after `patience` (the configuration's timeout): a holder
// that keeps it that long is stopped (SIGSTOP, a debugger) or stuck, and the locker throws
// LockTimeout naming it instead of hanging. Waits sleep on the word (futex) for at most a slice
// at a time, so that waiters look at their peers' liveness between slices.
struct SharedLock {
  pthread_mutex_t mutex;
  std::atomic<uint32_t> generation;
  std::atomic<int32_t> holder_pid, holder_tid;  // who holds the mutex (0: nobody)
  int64_t patience_ns;

  // once, by the segment's creator, before anybody else maps it
  void init(Clock::duration patience);
  // true when the previous owner died holding it (state may be half-updated); throws LockTimeout
  bool lock();
  void unlock();  // a no-op on a thread that does not hold it (after a lock that threw)
  void notify();  // with the mutex held: wake every waiter
  // With the mutex held: release it, sleep until notified or `until` (at most `slice`), retake it.
  void wait(Clock::time_point until, Clock::duration slice);
};

struct LockTimeout : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Whether process `pid` still runs (a zombie does not).
bool process_alive(pid_t pid);

}  // namespace variopath::shm
