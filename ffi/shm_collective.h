// One collective call between the processes of one host (issue 16, "Several processes"), over
// the control segment of shm_transport.h: POSIX shared memory between CPU processes, and the
// frame CUDA IPC between GPU processes (cuda/ipc.h) shares.
//
// Each rank stages its metadata (counts, slices, errors) in a host staging segment of its
// process and its rows where its RowStaging puts them (shm: after the metadata; cuda-ipc: in
// device staging the transport allocated), joins the call's slot in the control segment keyed
// by (site, group, per-rank call sequence), and once every rank has come reads every rank's
// staged metadata and computes the same placement, plan and layout as all the others
// (layout.h). Then it runs the executor in pull mode: it copies the transfers it receives, in
// plan order, from the senders' staging into its own XLA output, each once the transfers it
// depends on are done (transfer states in the slot); it reports that it is done reading its
// peers' staging once its copies completed, and a sender leaves only once every peer has, so
// nobody reads a staging after its owner returned it. Every wait has a deadline and looks at
// the peers' liveness: a process that dies or leaves fails the call for every rank, naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective.h"
#include "layout.h"
#include "shm_transport.h"
#include "streams.h"

namespace variopath {

// Where one rank's rows are staged for one call and how its copies run: what the shared-memory
// transport and CUDA IPC do differently (the rest of the call is shared).
class RowStaging {
 public:
  virtual ~RowStaging() = default;
  // Bytes the host staging segment holds past the metadata for `staged_bytes` of rows, and the
  // size of the locator a peer needs to find the rows (fixed per kind).
  virtual size_t host_bytes(int64_t staged_bytes) const = 0;
  virtual size_t locator_bytes() const = 0;
  // Whether peers read the rows where they are, in the rank's input (then every slice's rows are
  // "staged" at its input row), instead of a staged copy packed slice after slice.
  virtual bool in_place() const { return false; }
  // Stage the rows of `c`: slice k's rows at row staged_row[k] (-1: none) of `staged_rows`;
  // `host` is the host_bytes() area of the segment, `locator` gets locator_bytes(). "" or the error.
  virtual std::string stage(const Contribution& c, const std::vector<int64_t>& staged_row, int64_t staged_rows,
                            uint8_t* host, uint8_t* locator) = 0;
  // Where a rank of process `process` staged its rows, as this rank's copies read them: `host`
  // is that rank's host area, `locator` its locator. Throws on failure.
  virtual const uint8_t* rows_of(int32_t process, const uint8_t* host, const uint8_t* locator) = 0;
  // The streams this rank's local work and copies run on (rank `me` of `layout`); null with
  // `error` set on failure.
  virtual std::unique_ptr<Streams> streams(const Contribution& mine, const Layout& layout, std::string& error) = 0;
  // Whether copies may still be reading peers' rows when the executor returned (then the rank
  // reports done reading only after `settle`); else it does as soon as it read the metadata.
  virtual bool copies_outlive_executor() const = 0;
  // Wait until every copy enqueued on `streams` completed; false at the deadline.
  virtual bool settle(Streams& streams, Clock::time_point deadline) = 0;
  // Return the staging: reusable, or never again (a peer may still read it).
  virtual void release(bool reusable) = 0;
};

// Run rank `mine.rank`'s part of a call over `transport` with its rows staged by `rows`.
std::string run_process_collective(shm::Transport& transport, const OpConfig& config, int64_t site, int64_t group,
                                   Contribution mine, RowStaging& rows);

// The shared-memory transport: rows staged in the host segment, copied by the host.
std::string run_shm_collective(int64_t site, int64_t group, Contribution mine);

}  // namespace variopath
