// Checks of the CUDA transport that need a GPU but no XLA (make gpu-check; issue 16): threads
// acting as ranks on one GPU, processes exchanging over CUDA IPC, and the batched copy's
// bandwidth beside a device-to-device copy.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace variopath::cuda {

struct ThreadsResult {
  std::vector<std::string> errors;  // per rank, "" on success (the last round that failed)
  int64_t wrong_bytes = 0;          // output bytes (rows and counts) that differ from the expected
  int64_t rounds = 0;
};

// all_to_all_v of byte rows between threads acting as ranks, each with a stream of its own on
// `device`, for `rounds` rounds: rank r sends counts[r][j] rows of `row_bytes` to rank j. Before
// each call a rank's stream is kept busy for a random time (up to max_delay_s) and then
// overwrites the rank's output, as a producer still using that memory would; each rank's host
// thread also sleeps a random time before each transfer it sends (seeded). A peer that writes
// before the receiver's stream reached the call, or a rank that returns before its data arrived,
// shows as wrong bytes.
ThreadsResult exchange_on_one_gpu(int64_t config, int64_t site, const std::vector<std::vector<int32_t>>& counts,
                                  int64_t row_bytes, int device, uint64_t seed, double max_delay_s, int rounds);

struct ProcessResult {
  std::string error;        // "" on success (the first round that failed)
  int64_t wrong_bytes = 0;  // this rank's output bytes (rows and counts) that differ from the expected
  int64_t rounds = 0;
};

// One rank of an all_to_all_v of byte rows between processes over the configuration's transport,
// cuda-ipc or cuda-host (the configuration `config`, bootstrapped across them; this process is
// mesh position `rank`): rank r sends counts[r][j] rows of `row_bytes` to rank j, for `rounds`
// rounds. Before each call the stream is kept busy for a random time (up to max_delay_s, seeded)
// and then overwrites the output, as a producer still using that memory would; a receiver that
// read a staging before its sender filled it, or returned before its copies completed, shows as
// wrong bytes.
ProcessResult process_exchange(int64_t config, int64_t site, int32_t rank,
                               const std::vector<std::vector<int32_t>>& counts, int64_t row_bytes, int device,
                               uint64_t seed, double max_delay_s, int rounds);

struct CopyBandwidth {
  double batched_gbs = 0;  // batched_copy of the segments
  double memcpy_gbs = 0;   // one cudaMemcpyAsync device to device of as many bytes
  int64_t nbytes = 0;      // the bytes the segments hold
  std::string error;       // also when the batched copy moved a wrong byte
};

// `segments` segments of about nbytes / segments each: with `row_bytes` 0, 16-byte aligned
// ones; else whole rows of row_bytes, the source's from its row 1 on and the destination's from
// its row 3 on, so that (for rows of a size not a multiple of 16) segments start and end off
// 16-byte boundaries, the source differently from the destination (the pack of odd-sized rows).
// Checks first that one batched copy moves a pattern exactly (and nothing else), then times both.
CopyBandwidth copy_bandwidth(int device, int64_t nbytes, int segments, int iterations, int64_t row_bytes);

}  // namespace variopath::cuda
