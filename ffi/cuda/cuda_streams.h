// The CUDA backend of the stream interface (streams.h; issue 16, research/cuda-transport.md):
// the ranks are devices of this process, each stream is the XLA stream its handler was given and
// each transfer's event a CUDA event on its sender's device. Before its first copy into a rank,
// a stream waits for that rank's entry event, so no peer writes into an output buffer before its
// owner's stream has reached the call (XLA's allocator reuses memory in stream order). Where a
// kernel on the sender may not store into the receiver's buffer (peer_write: no peer access, or
// pool or VMM memory that does not grant it), the bytes go by cudaMemcpyPeerAsync instead.
// Direction: push (collective.h direction_of, the memcpy transport on CUDA devices): a transfer's
// copies run on its sender's stream, a kernel writing peer memory or a peer copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "cuda/peer_access.h"
#include "layout.h"
#include "streams.h"

namespace variopath::cuda {

// The streams of one call whose contributions all come from CUDA handlers; null with `error`
// set when a CUDA call failed. The backend is stream-ordered (Streams::stream_ordered): a call
// ends with each rank's XLA stream waiting on the events of the transfers into it, never with
// the host waiting for the devices (the handler's one host sync is the counts' copy). `debug`:
// each peer-write decision (peer_write) is also printed to stderr.
std::unique_ptr<Streams> cuda_streams(const std::vector<Contribution>& parts, const Layout& layout, bool debug,
                                      std::string& error);

// An event (cudaEvent_t, timing disabled) on `device`, from a process-wide pool; give it back
// once nothing will be enqueued on it any more (waits already enqueued keep their record).
void* take_event(int device, std::string& error);
void give_event(int device, void* event);

// Poll `event` (a cudaEvent_t already recorded) until it completed or `deadline` passed (a
// blocking cudaEventSynchronize has no deadline), yielding at first, then sleeping briefly; each
// poll clears the cudaErrorNotReady it leaves behind (VP_CUDA). False at the deadline; a failure
// the event reports goes to `error` (if still empty).
bool poll_event(void* event, Clock::time_point deadline, std::string& error);

// `count` words of device memory on `device` for the clock stamps of the paced transfers `stream`
// issues: one buffer per stream, allocated once and grown (doubling) when a call needs more, so no
// call allocates or frees on its path (cudaMalloc and cudaFree synchronise the device). A grown
// buffer's predecessor is kept (work queued on the stream may still read it) until
// release_scratch. Null with `error` set when the allocation failed.
uint64_t* clock_slots(int device, void* stream, size_t count, std::string& error);

// Teardown: wait (with a deadline) for the devices and free every scratch buffer. Only when no
// call is in flight (tests, the GPU check, interpreter exit). "" or the error.
std::string release_scratch(double timeout_s);

// Whether a kernel on `writer` may store into `buffer` (a device pointer, possibly a peer's),
// decided once per (buffer address, writer) and then cached (cuda/peer_access.h); every new
// decision goes to the transport log (and to stderr where `debug`).
PeerWrite peer_write(int writer, const void* buffer, bool debug);

// The transport log: a line for each peer-write decision and each fallback taken (a slower way
// that still works, such as cudaHostRegisterReadOnly refused: pageable reads), so that none is
// silent; the GPU check prints it. Oldest first, at most the last 256.
void note_fallback(const std::string& what);
std::vector<std::string> transport_log();

}  // namespace variopath::cuda
