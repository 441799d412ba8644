#include "shm_collective.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "cma.h"
#include "executor.h"
#include "layout.h"

namespace variopath {

namespace {

using shm::Control;
using shm::Slot;

constexpr auto kSlice = std::chrono::milliseconds(20);  // how often a waiter looks at its peers
constexpr int8_t kReading = 1, kRead = 2;  // RankEntry::reading: 0, then these (RowStaging::copies_outlive_executor)

// ----- staging: what a rank brings, in shared memory ------------------------------------------
// A header, its slices, its recv_sizes, its error text and its rows' locator, then (64-byte
// aligned) the host area of its RowStaging (shm: the rows of its slices to other ranks, one after
// the other; cuda-ipc: none, the rows are in device staging the locator names).
struct StagedHeader {
  uint64_t magic;
  int64_t config, axis_size, row_bytes, dtype, input_rows, output_rows;
  int32_t rank, ragged;
  int64_t slices, recv_sizes, error_bytes, locator_bytes, rows_at, host_bytes, staged_rows;
  uint64_t decision;
};
struct StagedSlice {
  int64_t dest, input_row, rows, output_row, staged_row;  // staged_row: -1 when none are staged
};

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

size_t metadata_bytes(const Contribution& c, const RowStaging& rows) {
  return sizeof(StagedHeader) + c.slices.size() * sizeof(StagedSlice) + c.recv_sizes.size() * sizeof(int64_t) +
         c.error.size() + rows.locator_bytes();
}

// Where each slice's rows go in the staging (-1: not staged); the host segment's size.
size_t plan_staging(const Contribution& c, const RowStaging& rows, std::vector<int64_t>& staged_row,
                    int64_t& staged_rows) {
  staged_row.assign(c.slices.size(), -1);
  staged_rows = rows.in_place() && c.error.empty() ? c.input_rows : 0;
  if (c.error.empty())
    for (size_t k = 0; k < c.slices.size(); ++k)
      if (c.slices[k].dest != c.rank && c.slices[k].rows > 0) {
        staged_row[k] = rows.in_place() ? c.slices[k].input_row : staged_rows;
        if (!rows.in_place()) staged_rows += c.slices[k].rows;
      }
  return align64(metadata_bytes(c, rows)) + rows.host_bytes(staged_rows * c.row_bytes);
}

// Write the metadata at `at`, then have `rows` stage the rows. "" or the error.
std::string stage(const Contribution& c, RowStaging& rows, const std::vector<int64_t>& staged_row, int64_t staged_rows,
                  uint8_t* at) {
  const int64_t rows_at = static_cast<int64_t>(align64(metadata_bytes(c, rows)));
  const StagedHeader h{shm::kMagic, c.config, c.axis_size, c.row_bytes, c.dtype, c.input_rows, c.output_rows, c.rank,
                       c.ragged ? 1 : 0, static_cast<int64_t>(c.slices.size()),
                       static_cast<int64_t>(c.recv_sizes.size()), static_cast<int64_t>(c.error.size()),
                       static_cast<int64_t>(rows.locator_bytes()), rows_at,
                       static_cast<int64_t>(rows.host_bytes(staged_rows * c.row_bytes)), staged_rows,
                       c.decision};
  std::memcpy(at, &h, sizeof h);
  uint8_t* p = at + sizeof h;
  for (size_t k = 0; k < c.slices.size(); ++k) {
    const Slice& s = c.slices[k];
    const StagedSlice ss{s.dest, s.input_row, s.rows, s.output_row, staged_row[k]};
    std::memcpy(p, &ss, sizeof ss);
    p += sizeof ss;
  }
  std::memcpy(p, c.recv_sizes.data(), c.recv_sizes.size() * sizeof(int64_t));
  p += c.recv_sizes.size() * sizeof(int64_t);
  std::memcpy(p, c.error.data(), c.error.size());
  p += c.error.size();
  if (!c.error.empty()) return "";  // nothing staged: the call fails with this rank's error
  return rows.stage(c, staged_row, staged_rows, at + rows_at, p);
}

// What rank `r` staged in `seg`: its contribution (input: null), its host area and its
// locator; "" or what is wrong.
std::string unstage(const shm::Segment& seg, int32_t r, const RowStaging& rows, Contribution& c,
                    std::vector<int64_t>& staged_row, const uint8_t*& host, const uint8_t*& locator) {
  const uint8_t* at = seg.data();
  const std::string bad = "rank " + std::to_string(r) + "'s staging " + seg.name() + " is corrupt: ";
  if (seg.size() < sizeof(StagedHeader)) return bad + "too small";
  StagedHeader h;
  std::memcpy(&h, at, sizeof h);
  if (h.magic != shm::kMagic || h.rank != r) return bad + "not this call's";
  if (h.locator_bytes != static_cast<int64_t>(rows.locator_bytes())) return bad + "staged by another transport";
  const size_t meta = sizeof h + size_t(h.slices) * sizeof(StagedSlice) + size_t(h.recv_sizes) * sizeof(int64_t) +
                      size_t(h.error_bytes) + size_t(h.locator_bytes);
  if (h.slices < 0 || h.recv_sizes < 0 || h.error_bytes < 0 || h.row_bytes < 0 || h.staged_rows < 0 ||
      meta > size_t(h.rows_at) || h.host_bytes != static_cast<int64_t>(rows.host_bytes(h.staged_rows * h.row_bytes)) ||
      size_t(h.rows_at) + size_t(h.host_bytes) > seg.size())
    return bad + "its sizes overrun it";
  c.rank = r;
  c.config = h.config;
  c.axis_size = h.axis_size;
  c.row_bytes = h.row_bytes;
  c.dtype = h.dtype;
  c.input_rows = h.input_rows;
  c.output_rows = h.output_rows;
  c.ragged = h.ragged != 0;
  c.decision = h.decision;
  c.input = nullptr;
  host = at + h.rows_at;
  const uint8_t* p = at + sizeof h;
  c.slices.resize(size_t(h.slices));
  staged_row.resize(size_t(h.slices));
  for (size_t k = 0; k < c.slices.size(); ++k) {
    StagedSlice ss;
    std::memcpy(&ss, p, sizeof ss);
    p += sizeof ss;
    if (ss.dest < 0 || ss.dest >= h.axis_size || (ss.staged_row >= 0 && (ss.rows < 0 || ss.staged_row + ss.rows > h.staged_rows)))
      return bad + "a slice lies outside the mesh axis or its staged rows";
    c.slices[k] = {static_cast<int32_t>(ss.dest), ss.input_row, ss.rows, ss.output_row};
    staged_row[k] = ss.staged_row;
  }
  c.recv_sizes.resize(size_t(h.recv_sizes));
  std::memcpy(c.recv_sizes.data(), p, size_t(h.recv_sizes) * sizeof(int64_t));
  p += h.recv_sizes * sizeof(int64_t);
  c.error.assign(reinterpret_cast<const char*>(p), size_t(h.error_bytes));
  locator = p + h.error_bytes;
  return "";
}

// The shared-memory transport's rows: in the host segment after the metadata, copied by the
// receiving rank's thread (memcpy streams: a copy is complete once enqueued).
class HostRows final : public RowStaging {
 public:
  size_t host_bytes(int64_t staged_bytes) const override { return static_cast<size_t>(staged_bytes); }
  size_t locator_bytes() const override { return 0; }
  std::string stage(const Contribution& c, const std::vector<int64_t>& staged_row, int64_t, uint8_t* host,
                    uint8_t*) override {
    for (const Piece& p : staged_pieces(c, staged_row, host)) std::memcpy(p.dst, p.src, static_cast<size_t>(p.nbytes));
    return "";
  }
  const uint8_t* rows_of(int32_t, const uint8_t* host, const uint8_t*) override { return host; }
  std::unique_ptr<Streams> streams(const Contribution&, const Layout& layout, std::string&) override {
    return memcpy_streams(static_cast<int32_t>(layout.transfers.size()));
  }
  bool copies_outlive_executor() const override { return false; }
  bool settle(Streams&, Clock::time_point) override { return true; }
  void release(bool) override {}
};

// The shared-memory transport's rows where cross-memory attach works (cma.h): read by each
// receiver straight out of the sender's XLA input, one copy instead of two. The locator names the
// sender's process and input buffer; a sender in this process is read with memcpy.
class CrossMemoryRows final : public RowStaging {
 public:
  explicit CrossMemoryRows(int32_t ranks) : pid_of_rank_(ranks, 0) {}
  size_t host_bytes(int64_t) const override { return 0; }
  size_t locator_bytes() const override { return sizeof(Locator); }
  bool in_place() const override { return true; }
  std::string stage(const Contribution& c, const std::vector<int64_t>&, int64_t, uint8_t*, uint8_t* locator) override {
    const Locator l{getpid(), c.rank, reinterpret_cast<uint64_t>(c.input)};
    std::memcpy(locator, &l, sizeof l);
    return "";
  }
  const uint8_t* rows_of(int32_t, const uint8_t*, const uint8_t* locator) override {
    Locator l;
    std::memcpy(&l, locator, sizeof l);
    if (l.rank < 0 || size_t(l.rank) >= pid_of_rank_.size()) throw std::runtime_error("its locator names no rank");
    pid_of_rank_[l.rank] = l.pid;
    return reinterpret_cast<const uint8_t*>(l.input);  // an address in the sender's process
  }
  std::unique_ptr<Streams> streams(const Contribution&, const Layout& layout, std::string&) override {
    std::vector<pid_t> pid_of_transfer;
    for (const Transfer& t : layout.transfers) pid_of_transfer.push_back(pid_of_rank_[t.src]);
    const pid_t here = getpid();
    Copier read = [pid_of_transfer = std::move(pid_of_transfer), here](int32_t t, uint8_t* dst, const uint8_t* src,
                                                                       int64_t nbytes) -> std::string {
      const pid_t pid = pid_of_transfer[t];
      if (pid == here) {
        std::memcpy(dst, src, static_cast<size_t>(nbytes));
        return "";
      }
      return shm::read_remote(pid, dst, src, nbytes);
    };
    return memcpy_streams(static_cast<int32_t>(layout.transfers.size()), std::move(read));
  }
  bool copies_outlive_executor() const override { return false; }
  bool settle(Streams&, Clock::time_point) override { return true; }
  void release(bool) override {}

 private:
  struct Locator {
    int32_t pid, rank;
    uint64_t input;
  };
  std::vector<pid_t> pid_of_rank_;
};

// The CPU twin's receiving streams, as cuda/pull_streams.h's are on a GPU: every copy on the
// rank's one stream of `inner`; a transfer another depends on is waited for (host, with the
// deadline) as it is recorded, so that "enqueued" on the board means complete for ranks of other
// processes, which cannot wait on this process's events; the rest complete by `settle`.
class TwinPullStreams final : public Streams {
 public:
  TwinPullStreams(std::unique_ptr<Streams> inner, const Layout& layout, int32_t me, double timeout_s)
      : inner_(std::move(inner)), timeout_s_(timeout_s), mine_(layout.transfers.size(), false),
        needed_(layout.transfers.size(), false),
        recorded_(layout.transfers.size(), false) {
    for (const Transfer& tr : layout.transfers)
      for (int32_t d : tr.after) needed_[d] = true;
    for (int32_t t : layout.receives[me]) mine_[t] = true;
  }
  void wait(int32_t, int32_t) override {}  // complete once enqueued (see above) or on this stream
  void local(int32_t, uint8_t* dst, const uint8_t* src, int64_t nbytes) override { inner_->local(0, dst, src, nbytes); }
  void zero(int32_t, uint8_t* dst, int64_t nbytes) override { inner_->zero(0, dst, nbytes); }
  void send(int32_t, const std::vector<Send>& batch) override {
    inner_->send(0, batch);
    for (const Send& t : batch) {
      recorded_[t.event] = true;
      if (needed_[t.event] && !inner_->synchronize(t.event, Clock::now() + seconds_of(timeout_s_))) {
        std::lock_guard<std::mutex> lock(mu_);
        if (error_.empty())
          error_ = "timed out after " + std::to_string(timeout_s_) + " s waiting for a transfer's copies";
      }
    }
  }
  // a transfer another rank pulled: nothing of it runs here
  bool synchronize(int32_t event, Clock::time_point deadline) override {
    return !mine_[event] || inner_->synchronize(event, deadline);
  }
  // Every copy enqueued so far has completed; false at the deadline.
  bool settle(Clock::time_point deadline) {
    for (size_t t = 0; t < recorded_.size(); ++t)
      if (recorded_[t] && !inner_->synchronize(static_cast<int32_t>(t), deadline)) return false;
    return true;
  }
  std::string error() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return error_.empty() ? inner_->error() : error_;
  }
  void order(std::vector<int64_t>& began, std::vector<int64_t>& ended) const override { inner_->order(began, ended); }

 private:
  std::unique_ptr<Streams> inner_;
  double timeout_s_;
  std::vector<bool> mine_, needed_, recorded_;  // pulled by this rank; waited for by some transfer; recorded
  mutable std::mutex mu_;
  std::string error_;
};

// The cuda-host transport's CPU twin: its "pinned" memory is the ordinary shared memory, its
// device copies those of the emulator (memcpy streams without delays).
class TwinBounce final : public Bounce {
 public:
  TwinBounce(const OpConfig& config, int64_t site, int32_t rank)
      : seed_(config.emulator_seed ^ uint64_t(site) ^ (uint64_t(rank) << 32)),
        delay_s_(config.emulator_delay_s),
        timeout_s_(config.timeout_s) {}
  std::string pin(shm::Segment&) override { return ""; }
  std::string to_host(const std::vector<Piece>& pieces, double timeout_s) override {
    auto s = make(1);
    Send all{0, 0, {}};
    for (const Piece& p : pieces) all.pieces.push_back({p.dst, p.src, p.nbytes});
    s->send(0, {all});
    if (!s->synchronize(0, Clock::now() + seconds_of(timeout_s)))
      return "timed out after " + std::to_string(timeout_s) + " s staging the rows";
    return s->error();
  }
  std::unique_ptr<Streams> streams(const Layout& layout, int32_t me, std::string&) override {
    auto s = std::make_unique<TwinPullStreams>(make(static_cast<int32_t>(layout.transfers.size())), layout, me,
                                               timeout_s_);
    pulling_ = s.get();
    return s;
  }
  bool settle(Streams& streams, Clock::time_point deadline) override {
    return &streams == pulling_ && pulling_->settle(deadline);
  }

 private:
  std::unique_ptr<Streams> make(int32_t events) const {
    return delay_s_ > 0 ? emulated_streams(1, events, seed_, delay_s_) : memcpy_streams(events);
  }
  uint64_t seed_;
  double delay_s_, timeout_s_;
  TwinPullStreams* pulling_ = nullptr;
};

// ----- the call's slot: rendezvous and transfer states across processes ------------------------
class Call final : public Board {
 public:
  Call(shm::Transport& t, int32_t me, double timeout_s) : t_(t), c_(t.control()), me_(me), timeout_s_(timeout_s) {}

  // Take this rank's place in the call's slot and wait for every rank. "" or the error.
  std::string join(int64_t site, int64_t group, int64_t run, int64_t seq, int32_t n, int64_t serial,
                   const std::string& local_error);
  // The staged segment of every rank (after join), and the end of reading their metadata.
  std::vector<std::pair<int32_t, int64_t>> staged() const;
  void done_reading();
  // Leave the call once nobody still reads this rank's staging; false when that could not be
  // made sure within the timeout (then the staging must not be reused).
  bool leave();
  // After an exception (the shared lock held past the timeout, shm.h): a rank that joined and
  // did not leave leaves later (Transport::owe_departure), failing the call with `why`.
  void abandon(const std::string& why);

  bool claim(int32_t t, const std::vector<int32_t>& after, double timeout_s, const Stalled& stalled) override;
  void enqueued(int32_t t) override;
  bool await(int32_t t, double timeout_s, const Stalled& stalled) override;
  std::string fail(const std::string& why) override;
  std::string error() override;
  int32_t settle(const std::vector<int32_t>& ts, double timeout_s, std::vector<int32_t>& enqueued) override;

 private:
  struct Locked {
    explicit Locked(Control& c) : c(c) { c.lock.lock(); }
    ~Locked() { c.lock.unlock(); }
    Control& c;
  };
  Slot* find_slot(int64_t site, int64_t group, int64_t run, int64_t seq, int32_t n);
  uint64_t in_call() const;
  std::string missing() const;
  std::string fail_locked(const std::string& why);
  bool alive(int32_t rank) const;
  template <typename Done, typename Why>
  bool wait_locked(double timeout_s, Done done, Why stalled);
  template <typename Quiet>
  void quiesce(double timeout_s, Quiet quiet);

  shm::Transport& t_;
  Control& c_;
  Slot* slot_ = nullptr;
  int32_t me_;
  double timeout_s_;
  bool joined_ = false, left_ = false;
  int64_t stamp_ = 0;    // the slot's, when this rank joined it
  bool unsafe_ = false;  // a peer may still read this rank's staging
};

// The slot of (site, group, run, seq), else a free one (else a failed one nobody is in); with the lock.
Slot* Call::find_slot(int64_t site, int64_t group, int64_t run, int64_t seq, int32_t n) {
  Slot* free_slot = nullptr;
  Slot* stale = nullptr;
  for (Slot& s : c_.slots) {
    if (s.used && s.site == site && s.group == group && s.run == run && s.seq == seq) return &s;
    if (!s.used && !free_slot) free_slot = &s;
    if (s.used && s.failed && s.departed == s.arrived && (!stale || s.stamp < stale->stamp)) stale = &s;
  }
  Slot* s = free_slot ? free_slot : stale;
  if (!s) return nullptr;
  std::memset(static_cast<void*>(s), 0, sizeof(Slot));
  s->used = 1;
  s->expected = n;
  s->site = site;
  s->group = group;
  s->run = run;
  s->seq = seq;
  s->stamp = ++c_.stamp;
  return s;
}

// The processes a wait depends on: every process while ranks are missing (who owns them is not
// known yet), else those of the ranks still in the call.
uint64_t Call::in_call() const {
  if (slot_->arrived < slot_->expected) return ~uint64_t(0);
  uint64_t mask = 0;
  for (int32_t r = 0; r < slot_->expected; ++r)
    if (slot_->ranks[r].arrived && !slot_->ranks[r].departed) mask |= uint64_t(1) << slot_->ranks[r].process;
  return mask;
}

std::string Call::missing() const {
  std::string ranks, brought;
  std::vector<std::string> per(t_.processes());
  for (int32_t r = 0; r < slot_->expected; ++r) {
    const auto& e = slot_->ranks[r];
    if (!e.arrived)
      ranks += " " + std::to_string(r);
    else
      per[e.process] += " " + std::to_string(r);
  }
  for (int32_t p = 0; p < t_.processes(); ++p)
    brought += (p ? "; " : "") + t_.describe(p) + (per[p].empty() ? " brought none" : " brought ranks" + per[p]);
  return "waiting for ranks" + ranks + " to join the collective (" + brought + ")";
}

std::string Call::fail_locked(const std::string& why) {
  if (!slot_->failed) {
    slot_->failed = 1;
    std::strncpy(slot_->error, why.c_str(), shm::kErrorBytes - 1);
  }
  c_.lock.notify();
  return slot_->error;
}

bool Call::alive(int32_t rank) const {
  const auto& p = c_.procs[slot_->ranks[rank].process];
  return p.state == shm::kAttached && shm::process_alive(p.pid);
}

// With the lock: until `done()`, the call failed (false), a process it depends on is gone or the
// timeout passed (both fail the call).
template <typename Done, typename Why>
bool Call::wait_locked(double timeout_s, Done done, Why stalled) {
  const auto until = Clock::now() + seconds_of(timeout_s);
  for (;;) {
    if (slot_->failed) return false;
    if (done()) return true;
    const std::string gone = t_.gone(in_call());
    if (!gone.empty()) {
      fail_locked(gone + ": the collective cannot complete");
      return false;
    }
    if (Clock::now() >= until) {
      fail_locked("timed out after " + std::to_string(timeout_s) + " s: " + stalled());
      return false;
    }
    c_.lock.wait(until, kSlice);
  }
}

// With the lock, on the way out whatever happened: until `quiet()` (peers are done with this
// rank's staging), which is finite work of live peers; past the timeout the staging is marked
// unsafe to reuse instead.
template <typename Quiet>
void Call::quiesce(double timeout_s, Quiet quiet) {
  const auto until = Clock::now() + seconds_of(timeout_s);
  while (!quiet()) {
    if (Clock::now() >= until) {
      unsafe_ = true;
      return;
    }
    c_.lock.wait(until, kSlice);
  }
}

std::string Call::join(int64_t site, int64_t group, int64_t run, int64_t seq, int32_t n, int64_t serial,
                       const std::string& local_error) {
  Locked lock(c_);
  t_.settle_departures();  // slots this process's ranks could not leave before
  slot_ = find_slot(site, group, run, seq, n);
  if (!slot_)
    return "more than " + std::to_string(shm::kSlots) + " calls in flight on the shared-memory transport";
  auto& e = slot_->ranks[me_];
  if (slot_->expected != n) return fail_locked("ranks disagree on the mesh axis size: " +
                                               std::to_string(slot_->expected) + " and " + std::to_string(n));
  if (e.arrived) return fail_locked("two devices claim mesh-axis position " + std::to_string(me_));
  e.process = t_.process();
  e.serial = serial;
  e.arrived = 1;
  ++slot_->arrived;
  joined_ = true;
  stamp_ = slot_->stamp;
  c_.lock.notify();
  if (!local_error.empty()) return fail_locked("rank " + std::to_string(me_) + ": " + local_error);
  if (!wait_locked(timeout_s_, [&] { return slot_->arrived == slot_->expected; }, [&] { return missing(); }))
    return slot_->error;
  e.reading = kReading;
  return "";
}

std::vector<std::pair<int32_t, int64_t>> Call::staged() const {
  std::vector<std::pair<int32_t, int64_t>> out;
  for (int32_t r = 0; r < slot_->expected; ++r) out.emplace_back(slot_->ranks[r].process, slot_->ranks[r].serial);
  return out;
}

void Call::done_reading() {
  Locked lock(c_);
  slot_->ranks[me_].reading = kRead;
  c_.lock.notify();
}

bool Call::leave() {
  if (!joined_) return true;
  Locked lock(c_);
  // every rank alive is done reading the staged metadata (and, for cuda-ipc, its copies of
  // staged rows completed; after a failure: none is reading, as none starts to) and, after a
  // failure, none copies staged rows
  const auto quiet = [&] {
    for (int32_t r = 0; r < slot_->expected; ++r) {
      const auto& e = slot_->ranks[r];
      const bool in_use = slot_->failed ? e.reading == kReading || e.busy : e.reading != kRead;
      // one that left still reading gave up waiting for its own copies (cuda-ipc): they may
      // still read this rank's staging
      if (r != me_ && e.arrived && (!e.departed || e.reading == kReading) && in_use && alive(r)) return false;
    }
    return true;
  };
  quiesce(timeout_s_, quiet);
  slot_->ranks[me_].departed = 1;
  if (++slot_->departed == slot_->expected) slot_->used = 0;
  left_ = true;
  c_.lock.notify();
  return !unsafe_;
}

void Call::abandon(const std::string& why) {
  if (joined_ && !left_) t_.owe_departure(slot_, stamp_, me_, why);
}

bool Call::claim(int32_t t, const std::vector<int32_t>& after, double timeout_s, const Stalled& stalled) {
  Locked lock(c_);
  const auto open = [&] {
    for (int32_t d : after)
      if (slot_->states[d] != uint8_t(TransferState::kEnqueued)) return d;
    return -1;
  };
  if (!wait_locked(timeout_s, [&] { return open() < 0; }, [&] { return stalled(open()); })) return false;
  slot_->states[t] = uint8_t(TransferState::kEnqueuing);
  slot_->claimer[t] = static_cast<int8_t>(me_);
  slot_->ranks[me_].busy = 1;
  return true;
}

void Call::enqueued(int32_t t) {
  Locked lock(c_);
  slot_->states[t] = uint8_t(TransferState::kEnqueued);
  slot_->ranks[me_].busy = 0;
  c_.lock.notify();
}

bool Call::await(int32_t t, double timeout_s, const Stalled& stalled) {
  Locked lock(c_);
  return wait_locked(timeout_s, [&] { return slot_->states[t] == uint8_t(TransferState::kEnqueued); },
                     [&] { return stalled(t); });
}

std::string Call::fail(const std::string& why) {
  Locked lock(c_);
  return fail_locked(why);
}

std::string Call::error() {
  Locked lock(c_);
  return slot_->error;
}

int32_t Call::settle(const std::vector<int32_t>& ts, double timeout_s, std::vector<int32_t>& enqueued) {
  Locked lock(c_);
  const auto busy = [&] {
    for (int32_t t : ts)
      if (slot_->states[t] == uint8_t(TransferState::kEnqueuing) && alive(slot_->claimer[t])) return t;
    return -1;
  };
  quiesce(timeout_s, [&] { return busy() < 0; });
  enqueued.clear();
  for (int32_t t : ts)
    if (slot_->states[t] == uint8_t(TransferState::kEnqueued)) enqueued.push_back(t);
  return busy();
}

// After the rendezvous: every rank's contribution from its staging (this rank's own buffers for
// itself), the same checks, placement, plan and layout as every other rank, the streams and this
// rank's local work. Inputs of other ranks point at their staged rows. "" or the error.
std::string prepare(shm::Transport& t, Call& call, RowStaging& rows, Contribution& mine, const Decision& decision,
                    const Decider::Site& site, std::vector<Contribution>& parts,
                    std::vector<std::shared_ptr<shm::Segment>>& held, Layout& layout,
                    std::unique_ptr<Streams>& streams) {
  const int32_t n = static_cast<int32_t>(parts.size()), me = mine.rank;
  std::vector<std::vector<int64_t>> staged_row(n);
  std::string err;
  const auto where = call.staged();
  for (int32_t r = 0; r < n && err.empty(); ++r) {
    if (r == me) continue;
    try {
      held[r] = t.staging_of(where[r].first, where[r].second);
      const uint8_t *host = nullptr, *locator = nullptr;
      err = unstage(*held[r], r, rows, parts[r], staged_row[r], host, locator);
      if (err.empty()) err = rows.pin(held[r]);
      if (err.empty() && parts[r].error.empty()) parts[r].input = rows.rows_of(where[r].first, host, locator);
    } catch (const std::exception& e) {
      err = std::string("rank ") + std::to_string(r) + "'s staged rows: " + e.what();
    }
  }
  if (!rows.copies_outlive_executor()) call.done_reading();
  if (!err.empty()) return err;
  parts[me] = std::move(mine);
  std::shared_ptr<OpConfig> config;
  err = check_parts(parts, n, config);
  if (!err.empty()) return err;
  std::vector<int64_t> demand;
  err = place(parts, *config, layout, demand);
  if (!err.empty()) return err;
  for (int32_t r = 0; r < n; ++r)  // the copies read other ranks' rows where they are staged
    if (r != me)
      for (size_t k = 0; k < parts[r].slices.size(); ++k)
        if (staged_row[r][k] >= 0) parts[r].slices[k].input_row = staged_row[r][k];
  std::shared_ptr<const ExternalPlan> planned;
  {
    std::lock_guard<std::mutex> lock(t.planning);
    err = plan_for(*config, demand, planned, false, -1, agreed_decision(parts, decision));
  }
  if (!err.empty()) return err;
  decide_next(*config, site, demand);
  lay_out(parts, *planned, *config, parts[me].row_bytes, layout);
  if (layout.transfers.size() > size_t(shm::kMaxTransfers))
    return "the plan has " + std::to_string(layout.transfers.size()) + " transfers, more than the " +
           std::to_string(shm::kMaxTransfers) + " the multi-process transports track per call";
  streams = rows.streams(parts[me], layout, err);
  if (!streams) return err;
  write_local(layout, parts, me, *streams);  // reads only this rank's own slices' input rows
  return "";
}

}  // namespace

std::vector<Piece> staged_pieces(const Contribution& c, const std::vector<int64_t>& staged_row, uint8_t* staging) {
  std::vector<Piece> pieces;
  for (size_t k = 0; k < c.slices.size(); ++k)
    if (staged_row[k] >= 0)
      pieces.push_back({c.input + c.slices[k].input_row * c.row_bytes, staging + staged_row[k] * c.row_bytes,
                        c.slices[k].rows * c.row_bytes});
  return pieces;
}

std::string HostStagedRows::pin(const std::shared_ptr<shm::Segment>& segment) {
  held_.push_back(segment);
  return bounce_.pin(*segment);
}

std::string HostStagedRows::stage(const Contribution& c, const std::vector<int64_t>& staged_row, int64_t,
                                  uint8_t* host, uint8_t*) {
  return bounce_.to_host(staged_pieces(c, staged_row, host), timeout_s_);
}

std::unique_ptr<Streams> HostStagedRows::streams(const Contribution& mine, const Layout& layout, std::string& error) {
  return bounce_.streams(layout, mine.rank, error);
}

bool HostStagedRows::settle(Streams& streams, Clock::time_point deadline) {
  if (bounce_.settle(streams, deadline)) return true;
  // copies that never completed may still read these segments: they stay mapped (and pinned)
  // until the process exits (their names go with the transport, shm::Transport's destructor)
  static auto* never_unmapped = new std::vector<std::shared_ptr<shm::Segment>>;  // never destroyed
  static std::mutex never_unmapped_mu;
  std::lock_guard<std::mutex> lock(never_unmapped_mu);
  never_unmapped->insert(never_unmapped->end(), held_.begin(), held_.end());
  return false;
}

std::string run_process_collective(shm::Transport& transport, const OpConfig& config, int64_t run, int64_t site,
                                   int64_t group, Contribution mine, RowStaging& rows) {
  const int32_t n = static_cast<int32_t>(mine.axis_size), me = mine.rank;
  if (n <= 0 || me < 0 || me >= n)
    return "rank " + std::to_string(me) + " is outside the mesh axis of " + std::to_string(n) + " devices";
  if (n > shm::kMaxRanks)
    return "the multi-process transports take at most " + std::to_string(shm::kMaxRanks) +
           " ranks, the mesh axis has " + std::to_string(n);
  const double timeout_s = config.timeout_s;
  if (mine.device < 0) prefault(mine.output, mine.output_rows * mine.row_bytes);
  // the decision this process holds for the call, whose id the others compare with theirs
  const Decider::Site history{site, group};
  std::string undecided;
  const Decision decision = decision_for(config, history, undecided);
  if (mine.error.empty()) mine.error = undecided;
  mine.decision = decision.id;
  std::vector<int64_t> staged_row;
  int64_t staged_rows = 0;
  const size_t bytes = plan_staging(mine, rows, staged_row, staged_rows);
  shm::Transport::Staging staging;
  std::string local_error;
  try {
    staging = transport.acquire(bytes, config.staging_budget);
    local_error = rows.pin(staging.segment);
    if (local_error.empty()) local_error = stage(mine, rows, staged_row, staged_rows, staging.segment->data());
  } catch (const std::exception& e) {
    local_error = e.what();
  }
  Call call(transport, me, timeout_s);
  std::string err;
  bool reusable = false;
  std::unique_ptr<Streams> streams;
  const auto settle_copies = [&] {  // whether no copy of this rank reads its peers' staging any more
    return !streams || rows.settle(*streams, Clock::now() + seconds_of(timeout_s));
  };
  try {
    err = call.join(site, group, run, transport.next_sequence(site, group, me, run), n, staging.serial, local_error);
    if (err.empty()) {
      std::vector<Contribution> parts(n);
      std::vector<std::shared_ptr<shm::Segment>> held(n);
      Layout layout;
      err = prepare(transport, call, rows, mine, decision, history, parts, held, layout, streams);
      if (!err.empty()) {
        err = call.fail(err);
      } else {
        err = execute(call, layout, *streams, parts, me, timeout_s, transfer_hook(), Role::kPull);
      }
      if (rows.copies_outlive_executor()) {
        // report done reading only once no copy of this rank reads its peers' staging any more;
        // else they keep theirs (their leave() gives up at the timeout and never reuses it)
        if (settle_copies())
          call.done_reading();
        else if (err.empty())
          err = call.fail("timed out after " + std::to_string(timeout_s) + " s: rank " + std::to_string(me) +
                          "'s copies never completed");
      }
    }
    reusable = call.leave();
  } catch (const std::exception& e) {
    // the control segment's lock held past the timeout (shm.h): this rank leaves its slot later
    // and never reuses its staging; its copies still reading peers' staging keep their mappings
    if (err.empty()) err = e.what();
    call.abandon(err);
    if (rows.copies_outlive_executor()) settle_copies();
  }
  rows.release(reusable);
  if (staging.segment) transport.release(staging, reusable);
  return err;
}

Configured configured(int64_t config, const char* transport, std::string& error) {
  Configured out{shm::find(config), find_config(config)};
  if (!out.transport || !out.config) {
    error = "configuration " + std::to_string(config) + " has no " + transport +
            " transport in this process (configure() sets it up in every process)";
    out.transport = nullptr;
  }
  return out;
}

std::string run_shm_collective(int64_t run, int64_t site, int64_t group, Contribution mine) {
  std::string err;
  const Configured on = configured(mine.config, "shared-memory", err);
  if (!on.transport) return err;
  if (mine.device >= 0)
    return "the shared-memory transport moves CPU devices' rows only (GPU devices in several processes: "
           "transport='cuda-ipc' or 'cuda-host')";
  if (on.transport->staged_because().empty()) {
    CrossMemoryRows rows(static_cast<int32_t>(mine.axis_size));
    return run_process_collective(*on.transport, *on.config, run, site, group, std::move(mine), rows);
  }
  HostRows rows;
  return run_process_collective(*on.transport, *on.config, run, site, group, std::move(mine), rows);
}

std::string run_host_staged_collective(int64_t run, int64_t site, int64_t group, Contribution mine) {
  std::string err;
  const Configured on = configured(mine.config, "cuda-host", err);
  if (!on.transport) return err;
  TwinBounce bounce(*on.config, site, mine.rank);
  HostStagedRows rows(bounce, on.config->timeout_s);
  return run_process_collective(*on.transport, *on.config, run, site, group, std::move(mine), rows);
}

}  // namespace variopath
