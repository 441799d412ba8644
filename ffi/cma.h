// Cross-memory attach between the processes of one host (issue 16, "Several processes": the
// shared-memory transport's single-copy path). A receiver reads the rows a sender sends straight
// out of the sender's XLA input buffer with process_vm_readv(2), one copy where staging costs
// two (sender into its staging, receiver out of it). The sender stays in the call until every
// transfer out of it completed (executor.h, pull mode), so the buffer is alive while it is read.
//
// The kernel allows it where the reader may ptrace the sender: same user, no Yama
// ptrace_scope >= 1 between non-descendants, no seccomp filter refusing the call (some container
// runtimes). The transport probes every pair at configuration time and falls back to staging
// unless every pair can (shm_transport.h `cross_memory`).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace variopath::shm {

// The address of a word of this process that holds a value derived from its pid, for peers to
// probe.
uint64_t probe_address();

// "" if this process can read `pid`'s probe word at `address`, else why not.
std::string probe(pid_t pid, uint64_t address);

// Copy `nbytes` from address `remote` of process `pid` to `dst` here; "" or the error.
std::string read_remote(pid_t pid, uint8_t* dst, const uint8_t* remote, int64_t nbytes);

}  // namespace variopath::shm
