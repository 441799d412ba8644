// The thin stream interface the executor is written against (executor.h), and its CPU backends.
//
// One stream per rank (the queue its sends go on) and one event per transfer, with CUDA's
// semantics: ops on a stream run in order; `wait` makes a stream wait for an event whose record
// is already on some stream (waiting for one not yet recorded would be a no-op on CUDA, so the
// emulator refuses it); `synchronize` is the host waiting for an event to complete.
//
// Backends: `memcpy_streams` runs every op at once on the calling thread (the CPU transport);
// `emulated_streams` runs each stream's ops on a thread of its own after random delays, so that
// an executor that forgets a wait, or returns before its data arrived, shows up as a wrong result
// or a broken order in every CI run (issue 16: the logic the GPU backend shares, stream-ordered
// like it: a rank's stream waits for what it receives, and the host for its stream); the CUDA
// backend (cuda/cuda_streams.h) puts them on the devices' streams. Ops on a rank's own memory
// (`local`, `zero`) run at once on both CPU backends: only that rank's thread touches it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "clock.h"

namespace variopath {

// One transfer of a batch its sender (pull: its receiver) issues together: its event, its
// copies and the rate it must not exceed (GB/s; 0: unpaced).
struct Send {
  struct Piece {
    uint8_t* dst;
    const uint8_t* src;
    int64_t nbytes;
  };
  int32_t event = 0;
  double pace_gbs = 0;
  std::vector<Piece> pieces;
};

class Streams {
 public:
  virtual ~Streams() = default;
  // Enqueue on `stream`: wait for `event`, whose record must already be enqueued.
  virtual void wait(int32_t stream, int32_t event) = 0;
  // Enqueue on `stream`: copy bytes within the stream's own rank (its self rows, or its result
  // arrays from host memory that may be freed once this returns); no event.
  virtual void local(int32_t stream, uint8_t* dst, const uint8_t* src, int64_t nbytes) = 0;
  // Enqueue on `stream`: zero bytes of the stream's own rank.
  virtual void zero(int32_t stream, uint8_t* dst, int64_t nbytes) = 0;
  // Enqueue on `stream`: the transfers of `batch` (one plan step's, none waiting for another),
  // in flight together, each paced at its cap while its bytes move and its event recorded when
  // they are done (the CPU backends: run_batch).
  virtual void send(int32_t stream, const std::vector<Send>& batch) = 0;
  // Host: wait until `event` (already recorded) has completed; false at the deadline.
  virtual bool synchronize(int32_t event, Clock::time_point deadline) = 0;
  // Whether a call ends with `stream` waiting for the transfers into its rank (wait) instead of
  // the host waiting for them (synchronize): a GPU stream, which XLA's next op on it follows, so
  // the call's one host sync is its counts' copy (issue 52). The emulator is stream-ordered too,
  // so that a missing wait shows on CPU.
  virtual bool stream_ordered() const { return false; }
  // Host, at the end of a stream-ordered rank's call: wait until everything enqueued on `stream`
  // so far has run, or `deadline`; -1 when it has, else an event the stream still waits for or
  // records. The CUDA backend returns -1 at once (the device, not the host, orders what follows);
  // the emulator waits, as XLA:CPU reads the output once the handler returns.
  virtual int32_t finish(int32_t, Clock::time_point) { return -1; }
  // The first error of the backend itself (an executor bug such as waiting for an event not
  // recorded yet), or "".
  virtual std::string error() const = 0;
  // When each transfer's first copy began and its event completed, as positions in one global
  // order (-1: not yet); for tests of the executor's ordering.
  virtual void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const = 0;
};

// How the memcpy backend moves a transfer's bytes ("" or the error, which becomes the backend's
// error()): by default memcpy; the shared-memory transport's cross-memory attach reads them out
// of the sending process (cma.h).
using Copier = std::function<std::string(int32_t event, uint8_t* dst, const uint8_t* src, int64_t nbytes)>;

// The CPU backends' issue of a batch from `start`, on the calling thread: unpaced transfers
// copied whole first (a plan without pacing pays nothing for it); paced ones in chunks of about
// kPaceChunk seconds at their cap (kMinPaceChunk bytes at least), the next chunk always the one whose deadline (its transfer's
// start plus the bytes before it at the cap) comes first, slept for when it is ahead, so that
// they move together, none faster than its cap. `began(i)` before transfer i's first byte,
// `copy(i, piece)` its bytes, `done(i)` once they are all copied and, paced, no earlier than its
// bytes at its cap after `start`.
constexpr double kPaceChunk = 100e-6;
constexpr int64_t kMinPaceChunk = 64 << 10;
void run_batch(const std::vector<Send>& batch, Clock::time_point start, const std::function<void(size_t)>& began,
               const std::function<void(size_t, const Send::Piece&)>& copy, const std::function<void(size_t)>& done);

std::unique_ptr<Streams> memcpy_streams(int32_t events, Copier copier = {});
std::unique_ptr<Streams> emulated_streams(int32_t streams, int32_t events, uint64_t seed, double max_delay_s);

// Tests: emulated streams made from now on never run an op of stream `stream` (-1: none), as a
// wedged device would not; its ops are dropped when the streams are destroyed, so nothing of
// them runs after the call returned.
void stall_emulated_stream(int32_t stream);

}  // namespace variopath
