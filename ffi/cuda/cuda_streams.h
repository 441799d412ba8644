// The CUDA backend of the stream interface (streams.h; issue 16, research/cuda-transport.md):
// the ranks are devices of this process, each stream is the XLA stream its handler was given and
// each transfer's event a CUDA event on its sender's device. Before its first copy into a rank,
// a stream waits for that rank's entry event, so no peer writes into an output buffer before its
// owner's stream has reached the call (XLA's allocator reuses memory in stream order).
// Direction: push (collective.h direction_of, the memcpy transport on CUDA devices): a transfer's
// copies run on its sender's stream, a kernel writing peer memory or a peer copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "layout.h"
#include "streams.h"

namespace variopath::cuda {

// The streams of one call whose contributions all come from CUDA handlers; null with `error`
// set when a CUDA call failed.
std::unique_ptr<Streams> cuda_streams(const std::vector<Contribution>& parts, const Layout& layout, std::string& error);

// An event (cudaEvent_t, timing disabled) on `device`, from a process-wide pool; give it back
// once nothing will be enqueued on it any more (waits already enqueued keep their record).
void* take_event(int device, std::string& error);
void give_event(int device, void* event);

// Poll `event` (a cudaEvent_t already recorded) until it completed or `deadline` passed (a
// blocking cudaEventSynchronize has no deadline), yielding at first, then sleeping briefly.
// False at the deadline; a failure the event reports goes to `error` (if still empty).
bool poll_event(void* event, Clock::time_point deadline, std::string& error);

// "what: cudaErrorName (its description)" for a failed CUDA call (`status`: a cudaError_t).
std::string describe(int status, const char* what);

}  // namespace variopath::cuda
