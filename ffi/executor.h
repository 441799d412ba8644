// The executor (issue 16): one rank's part of a laid-out call, written against the stream
// interface (streams.h), so the CPU transport, the CPU emulator and a GPU backend share it.
//
// Host protocol, per rank: for each transfer it sends, in order, wait (host) until the records
// of the transfers it depends on are enqueued, claim it, enqueue on its own stream a wait for
// each of them, its copies and its record, and mark it enqueued. Then wait (host) until every
// transfer into it has completed. Whatever happened, before returning it waits until no claimed
// transfer into it or out of it is still being enqueued and every enqueued one has completed,
// so that once it returns nothing reads or writes its buffers. After a failure no transfer is
// claimed any more.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "collective.h"
#include "layout.h"
#include "streams.h"
#include "sync.h"

namespace variopath {

enum class TransferState : uint8_t { kWaiting, kEnqueuing, kEnqueued };

// Run rank `me`'s part; "" or the error (then also the call's, in `sync`). `states` (one per
// transfer) is shared by the call's ranks under `sync.mu`.
std::string execute(CallSync& sync, const Layout& layout, std::vector<TransferState>& states, Streams& streams,
                    const std::vector<Contribution>& parts, int32_t me, double timeout_s, TransferHook hook);

}  // namespace variopath
