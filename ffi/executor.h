// The executor (issue 16): one rank's part of a laid-out call, written against the stream
// interface (streams.h) and a board of transfer states (Board), so the CPU transport, the CPU
// emulator, a GPU backend and the shared-memory transport between processes share it.
//
// Host protocol, per rank: for each transfer it executes (push: those it sends; pull: those it
// receives), in order, wait (host) until the records of the transfers it depends on are
// enqueued, claim it and enqueue on its own stream a wait for each of them; the transfers of one
// plan step that wait for none of that step go out together (Streams::send: in flight at once,
// each at its pacing cap while its bytes move), and are marked enqueued. Then wait (host) until every transfer the other side executes
// (push: into it; pull: out of its staging) has completed. Whatever happened, before returning
// it waits until no claimed transfer into it or out of it is still being enqueued and every
// enqueued one has completed, so that once it returns nothing reads or writes its buffers.
// After a failure no transfer is claimed any more. Every one of these host waits gives up after
// the configuration's timeout and fails the call naming the rank and what it waited for; where
// the drain gives up (a wedged device), the rank's stream is made to wait for the transfers still
// in flight, so memory it frees next is reused only after them (XLA reuses memory in stream order).
// On a stream-ordered backend (Streams::stream_ordered: the GPU, and its CPU emulator) the waits
// for the transfers into a rank are its stream's, enqueued at the end, and the host waits only
// for its own stream (Streams::finish: not at all on a GPU, whose call syncs the host once).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "collective.h"
#include "layout.h"
#include "streams.h"
#include "sync.h"

namespace variopath {

enum class TransferState : uint8_t { kWaiting, kEnqueuing, kEnqueued };

// The transfer states of one call and its failure, shared by its ranks: in one process
// (LocalBoard, over CallSync) or across processes (shm_collective.cc). Every wait gives up after
// `timeout_s` from its start, with `stalled(t)` (t: a transfer waited for) as the call's error.
class Board {
 public:
  using Stalled = std::function<std::string(int32_t)>;
  virtual ~Board() = default;
  // Wait until every transfer of `after` is enqueued, then mark `t` enqueuing; false (claiming
  // nothing) once the call failed.
  virtual bool claim(int32_t t, const std::vector<int32_t>& after, double timeout_s, const Stalled& stalled) = 0;
  virtual void enqueued(int32_t t) = 0;
  // Wait until `t` is enqueued; false once the call failed.
  virtual bool await(int32_t t, double timeout_s, const Stalled& stalled) = 0;
  // Fail the call (the first failure wins); returns the call's error.
  virtual std::string fail(const std::string& why) = 0;
  virtual std::string error() = 0;
  // Wait until none of `ts` is being enqueued (by a rank still alive), giving up after
  // `timeout_s`; `enqueued` gets the enqueued ones. Returns one still being enqueued at the
  // deadline, else -1.
  virtual int32_t settle(const std::vector<int32_t>& ts, double timeout_s, std::vector<int32_t>& enqueued) = 0;
};

// The board of the in-process rendezvous: `states` (one per transfer) under `sync.mu`.
class LocalBoard final : public Board {
 public:
  // the board as rank `me` sees it (its waits sleep on its own condition variable)
  LocalBoard(CallSync& sync, std::vector<TransferState>& states, int32_t me) : sync_(sync), states_(states), me_(me) {}
  bool claim(int32_t t, const std::vector<int32_t>& after, double timeout_s, const Stalled& stalled) override;
  void enqueued(int32_t t) override;
  bool await(int32_t t, double timeout_s, const Stalled& stalled) override;
  std::string fail(const std::string& why) override;
  std::string error() override;
  int32_t settle(const std::vector<int32_t>& ts, double timeout_s, std::vector<int32_t>& enqueued) override;

 private:
  CallSync& sync_;
  std::vector<TransferState>& states_;
  int32_t me_;
};

// Who executes a transfer: its sender, writing into the receiver's memory (push), or its
// receiver, reading from the sender's staging (pull: the shared-memory transport, where a rank
// writes only its own output).
enum class Role : uint8_t { kPush, kPull };

// Run rank `me`'s part; "" or the error (then also the call's, on the board).
std::string execute(Board& board, const Layout& layout, Streams& streams, const std::vector<Contribution>& parts,
                    int32_t me, double timeout_s, TransferHook hook, Role role = Role::kPush);

// The in-process form: `states` (one per transfer) shared by the call's ranks under `sync.mu`.
std::string execute(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams,
                    const std::vector<Contribution>& parts, int32_t me, double timeout_s, TransferHook hook);

}  // namespace variopath
