// One collective call between the processes of one host (issue 16, "Several processes"), over
// the control segment of shm_transport.h: POSIX shared memory between CPU processes, and the
// frame CUDA IPC between GPU processes (cuda/ipc.h) shares.
// Direction: pull (collective.h direction_of): every transport on this frame has each receiver
// copy from its senders' staging (shm: host memory, no peer traffic).
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

// One contiguous copy: `nbytes` from `src` to `dst`.
struct Piece {
  const uint8_t* src;
  uint8_t* dst;
  int64_t nbytes;
};

// The copies that stage the rows of `c` at `staging` (slice k at row staged_row[k]; -1: none).
std::vector<Piece> staged_pieces(const Contribution& c, const std::vector<int64_t>& staged_row, uint8_t* staging);

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
  // Make a staging segment ready before this rank writes it (its own) or reads it (a peer's,
  // mapped read-only): cuda-host pins it. "" or the error.
  virtual std::string pin(const std::shared_ptr<shm::Segment>&) { return ""; }
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

// How the cuda-host transport's rows cross between a rank's device and the host staging
// segments (its RowStaging, HostStagedRows, is shared): on GPUs (cuda/host_staging.h) copies on
// the rank's XLA stream to and from pinned shared memory; in its CPU twin
// (run_host_staged_collective) copies on the CPU stream backends.
class Bounce {
 public:
  virtual ~Bounce() = default;
  // Make a segment ready for copies (RowStaging::pin). "" or the error.
  virtual std::string pin(shm::Segment& segment) = 0;
  // Run `pieces` (device to host staging) and wait for them, at most `timeout_s`. "" or the error.
  virtual std::string to_host(const std::vector<Piece>& pieces, double timeout_s) = 0;
  // The streams this rank pulls on (RowStaging::streams) and their final wait (RowStaging::settle).
  virtual std::unique_ptr<Streams> streams(const Layout& layout, int32_t me, std::string& error) = 0;
  virtual bool settle(Streams& streams, Clock::time_point deadline) = 0;
};

// The cuda-host transport's rows (issue 29): staged in the host segment after the metadata, as
// the shared-memory transport's are, but written from the rank's device and read into its
// peers' devices by `bounce`, whose copies complete after the executor enqueued them.
class HostStagedRows final : public RowStaging {
 public:
  HostStagedRows(Bounce& bounce, double timeout_s) : bounce_(bounce), timeout_s_(timeout_s) {}
  size_t host_bytes(int64_t staged_bytes) const override { return static_cast<size_t>(staged_bytes); }
  size_t locator_bytes() const override { return 0; }
  std::string pin(const std::shared_ptr<shm::Segment>& segment) override;
  std::string stage(const Contribution& c, const std::vector<int64_t>& staged_row, int64_t staged_rows, uint8_t* host,
                    uint8_t* locator) override;
  const uint8_t* rows_of(int32_t, const uint8_t* host, const uint8_t*) override { return host; }
  std::unique_ptr<Streams> streams(const Contribution& mine, const Layout& layout, std::string& error) override;
  bool copies_outlive_executor() const override { return true; }
  bool settle(Streams& streams, Clock::time_point deadline) override;
  void release(bool) override {}

 private:
  Bounce& bounce_;
  double timeout_s_;
  std::vector<std::shared_ptr<shm::Segment>> held_;  // the segments this call reads or writes
};

// Configuration `config`'s transport and planner configuration in this process; a null
// transport, with `error` naming `transport`, where configure() did not set them up here.
struct Configured {
  std::shared_ptr<shm::Transport> transport;
  std::shared_ptr<OpConfig> config;
};
Configured configured(int64_t config, const char* transport, std::string& error);

// Run rank `mine.rank`'s part of a call over `transport` with its rows staged by `rows`; `run`
// is XLA's run id of the program's logical execution (ffi::RunId), the same in every process.
std::string run_process_collective(shm::Transport& transport, const OpConfig& config, int64_t run, int64_t site,
                                   int64_t group, Contribution mine, RowStaging& rows);

// The shared-memory transport: rows staged in the host segment, copied by the host.
std::string run_shm_collective(int64_t run, int64_t site, int64_t group, Contribution mine);

// The cuda-host transport's CPU twin (CPU devices; the CUDA handlers run the GPU one): pinned
// memory is the ordinary shared memory, the copies run on the emulator of the stream interface
// (random delays of up to the configuration's emulator_delay_s; memcpy streams when it is 0).
std::string run_host_staged_collective(int64_t run, int64_t site, int64_t group, Contribution mine);

}  // namespace variopath
