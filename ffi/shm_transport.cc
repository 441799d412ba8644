#include "shm_transport.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <future>
#include <random>
#include <stdexcept>
#include <thread>

#include "cma.h"

namespace variopath::shm {

namespace {

std::mutex g_mu;
std::map<int64_t, std::shared_ptr<Transport>> g_transports;

std::string control_name(const std::string& token) { return "/vpjax-" + token + "-ctl"; }

std::string new_token() {
  std::random_device rd;
  const uint64_t bits = (uint64_t(rd()) << 32) ^ rd() ^ (uint64_t(getpid()) << 16);
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(bits));
  return buf;
}

// Staging grows in powers of two from 64 KiB, so a growing demand makes few generations.
size_t staging_size(size_t bytes) {
  size_t size = size_t(64) << 10;
  while (size < bytes) size *= 2;
  return size;
}

}  // namespace

size_t within_budget(size_t bytes, size_t size, size_t held, int64_t budget, const std::string& what) {
  if (budget <= 0) return size;
  const size_t room = size_t(budget) > held ? size_t(budget) - held : 0;
  if (bytes > room)
    throw std::runtime_error("the " + what + " needs " + std::to_string(bytes) + " bytes for this call beside the " +
                             std::to_string(held) + " its calls in flight hold, more than its staging budget of " +
                             std::to_string(budget) + " bytes (configure(staging_budget=...))");
  return size <= room ? size : bytes;  // not rounded up past the budget
}

namespace {

void put(const std::shared_ptr<Transport>& t, int64_t config) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_transports[config] = t;  // a re-configuration replaces the old one (in-flight calls keep theirs)
}

}  // namespace

Transport::Transport(std::string token, std::unique_ptr<Segment> control, int32_t process, int32_t processes)
    : token_(std::move(token)), control_(std::move(control)), process_(process), processes_(processes) {}

Transport::~Transport() {
  attachment_.reset();  // while this process is still attached: it may wait for its peers
  Control& c = control();
  try {
    c.lock.lock();
    settle_departures();
    c.procs[process_].state = kLeft;
    c.lock.notify();
    c.lock.unlock();
  } catch (const std::exception&) {
    // the lock's holder is stuck: the peers will not see this process leave, only (once it
    // exits) its death; its segments go all the same
  }
  peers_.clear();
  pool_.clear();  // the staging segments unlink their names
  // and those still mapped elsewhere in this process (under copies that never completed) too
  for (int64_t s = 0; s < c.procs[process_].next_serial; ++s) unlink_name(name(process_, s));
}

std::string Transport::name(int32_t p, int64_t serial) const {
  return "/vpjax-" + token_ + "-p" + std::to_string(p) + "-" + std::to_string(serial);
}

std::string Transport::describe(int32_t p) const {
  return "process " + std::to_string(p) + " (pid " + std::to_string(control().procs[p].pid) + ")";
}

std::string Transport::gone(uint64_t mask) {
  Control& c = control();
  for (int32_t p = 0; p < processes_; ++p) {
    if (!(mask >> p & 1) || p == process_) continue;
    ProcessEntry& e = c.procs[p];
    if (e.state == kLeft) return describe(p) + " has left (it released the configuration or exited)";
    if (e.state == kAttached && !process_alive(e.pid)) {
      if (!e.reaped) {
        e.reaped = 1;
        for (int64_t s = 0; s < e.next_serial; ++s) unlink_name(name(p, s));
      }
      return describe(p) + " died";
    }
  }
  return "";
}

std::shared_ptr<Transport::Attachment> Transport::attachment(
    const std::function<std::shared_ptr<Attachment>()>& make) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!attachment_) attachment_ = make();
  return attachment_;
}

Transport::Staging Transport::acquire(size_t bytes, int64_t budget) {
  std::lock_guard<std::mutex> lock(mu_);
  Buffer* best = nullptr;
  for (auto& b : pool_)
    if (!b.busy && b.segment->size() >= bytes && (!best || b.segment->size() < best->segment->size())) best = &b;
  if (best) {
    best->busy = true;
    return {best->segment, best->serial};
  }
  // a new generation; free ones too small for this call go (their names with them)
  pool_.erase(std::remove_if(pool_.begin(), pool_.end(),
                             [&](const Buffer& b) { return !b.busy && b.segment->size() < bytes; }),
              pool_.end());
  size_t held = 0;
  for (const auto& b : pool_) held += b.segment->size();
  const size_t size = within_budget(bytes, staging_size(bytes), held, budget, "host staging (shared memory) of " + describe(process_));
  Control& c = control();
  c.lock.lock();
  const int64_t serial = c.procs[process_].next_serial++;
  c.lock.unlock();
  std::shared_ptr<Segment> seg = Segment::create(name(process_, serial), size);
  pool_.push_back({seg, serial, true});
  return {seg, serial};
}

void Transport::release(const Staging& staging, bool reusable) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = pool_.begin(); it != pool_.end(); ++it)
    if (it->serial == staging.serial) {
      if (reusable)
        it->busy = false;
      else
        pool_.erase(it);  // unlinked now; a late reader keeps its mapping
      return;
    }
}

std::shared_ptr<Segment> Transport::staging_of(int32_t p, int64_t serial) {
  std::lock_guard<std::mutex> lock(mu_);
  if (p == process_) {
    for (const auto& b : pool_)
      if (b.serial == serial) return b.segment;
    throw std::runtime_error("staging segment " + name(p, serial) + " is not this process's");
  }
  const auto key = std::make_pair(p, serial);
  auto it = peers_.find(key);
  if (it != peers_.end()) return it->second;
  // a new generation: forget the mappings no call holds of p's segments that p removed (retired
  // generations, whose memory, pinned for cuda-host, goes with the last mapping), and of any
  // peer's past 128
  for (it = peers_.begin(); it != peers_.end();)
    it = it->second.use_count() == 1 && ((it->first.first == p && !name_exists(it->second->name())) ||
                                         peers_.size() >= 128)
             ? peers_.erase(it)
             : std::next(it);
  return peers_[key] = Segment::open(name(p, serial), false);
}

int64_t Transport::next_sequence(int64_t site, int64_t group, int32_t rank, int64_t run) {
  std::lock_guard<std::mutex> lock(mu_);
  Count& count = sequence_[{site, group, rank}];  // a device runs its programs one after another
  if (count.run != run) count = {run, 0};
  return count.calls++;
}

void Transport::owe_departure(Slot* slot, int64_t stamp, int32_t rank, const std::string& why) {
  std::lock_guard<std::mutex> lock(owed_mu_);
  owed_.push_back({slot, stamp, rank, why});
}

void Transport::settle_departures() {
  std::vector<Owed> owed;
  {
    std::lock_guard<std::mutex> lock(owed_mu_);
    owed.swap(owed_);
  }
  for (const Owed& o : owed) {
    Slot& s = *o.slot;  // its rank never left, so nobody reused the slot: the stamp is a check
    if (!s.used || s.stamp != o.stamp || !s.ranks[o.rank].arrived || s.ranks[o.rank].departed) continue;
    if (!s.failed) {
      s.failed = 1;
      std::strncpy(s.error, ("rank " + std::to_string(o.rank) + " gave up: " + o.why).c_str(), kErrorBytes - 1);
    }
    s.ranks[o.rank].departed = 1;
    if (++s.departed == s.expected) s.used = 0;
  }
  if (!owed.empty()) control().lock.notify();
}

std::string create(int64_t config, int32_t processes, double timeout_s) {
  if (processes < 1 || processes > kMaxProcesses)
    throw std::invalid_argument("the shared-memory transport takes 1 to " + std::to_string(kMaxProcesses) +
                                " processes, got " + std::to_string(processes));
  const std::string token = new_token();
  auto seg = Segment::create(control_name(token), sizeof(Control));
  Control& c = *reinterpret_cast<Control*>(seg->data());  // zero-filled by ftruncate
  c.lock.init(seconds_of(timeout_s));
  c.processes = processes;
  c.procs[0].pid = getpid();
  c.procs[0].probe = probe_address();
  c.procs[0].state = kAttached;
  c.magic = kMagic;
  std::string name = seg->name();
  put(std::make_shared<Transport>(token, std::move(seg), 0, processes), config);
  return name;
}

void attach(int64_t config, const std::string& name, int32_t process, int32_t processes) {
  const std::string prefix = "/vpjax-", suffix = "-ctl";
  if (name.size() != prefix.size() + 16 + suffix.size() || name.compare(0, prefix.size(), prefix) != 0)
    throw std::invalid_argument("not a variopath control segment name: " + name);
  std::unique_ptr<Segment> seg;
  try {
    seg = Segment::open(name, true);
  } catch (const std::exception& err) {
    throw std::runtime_error(std::string(err.what()) +
                             " (the processes of one configuration must share /dev/shm: one host, one container)");
  }
  if (seg->size() < sizeof(Control)) throw std::runtime_error(name + " is too small for a control segment");
  Control& c = *reinterpret_cast<Control*>(seg->data());
  if (c.magic != kMagic) throw std::runtime_error(name + " is not a control segment of this variopath_jax build");
  if (c.processes != processes)
    throw std::runtime_error("process 0 configured " + std::to_string(c.processes) + " processes, this one " +
                             std::to_string(processes));
  if (process < 1 || process >= processes)
    throw std::invalid_argument("process index " + std::to_string(process) + " is outside 1.." +
                                std::to_string(processes - 1));
  c.lock.lock();
  const bool taken = c.procs[process].state != kAbsent;
  if (!taken) {
    c.procs[process].pid = getpid();
    c.procs[process].probe = probe_address();
    c.procs[process].state = kAttached;
    c.lock.notify();
  }
  c.lock.unlock();
  if (taken) throw std::runtime_error("process index " + std::to_string(process) + " attached twice");
  put(std::make_shared<Transport>(name.substr(prefix.size(), 16), std::move(seg), process, processes), config);
}

void ready(int64_t config, bool cross_memory) {
  auto t = find(config);
  if (!t) throw std::runtime_error("configuration " + std::to_string(config) + " has no shared-memory transport");
  Control& c = t->control();
  std::string bad;
  std::vector<std::pair<pid_t, uint64_t>> peers(t->processes());
  c.lock.lock();
  for (int32_t p = 0; p < t->processes() && bad.empty(); ++p) {
    if (c.procs[p].state == kAbsent)
      bad = "process " + std::to_string(p) + " did not attach to the shared-memory transport";
    else if (c.procs[p].state == kLeft)
      bad = t->describe(p) + " left while the transport was being set up";
    else if (!process_alive(c.procs[p].pid))
      bad = t->describe(p) + " is not running as seen from process " + std::to_string(t->process()) +
            " (it died, or runs in another pid namespace)";
    peers[p] = {c.procs[p].pid, c.procs[p].probe};
  }
  c.lock.unlock();
  if (!bad.empty()) throw std::runtime_error(bad);
  if (t->process() == 0) t->unlink_control();  // every process has it mapped
  uint64_t readable = 0;
  std::string unreadable = cross_memory ? "" : "VARIOPATH_SHM_CMA=0 in process " + std::to_string(t->process());
  for (int32_t p = 0; p < t->processes() && cross_memory; ++p) {
    const std::string why = p == t->process() ? "" : probe(peers[p].first, peers[p].second);
    if (why.empty())
      readable |= uint64_t(1) << p;
    else if (unreadable.empty())
      unreadable = "process " + std::to_string(t->process()) + " cannot read " + t->describe(p) + "'s memory: " + why;
  }
  c.lock.lock();
  c.procs[t->process()].readable = readable;
  std::strncpy(c.procs[t->process()].unreadable, unreadable.c_str(), kErrorBytes - 1);
  c.lock.unlock();
}

void agree(int64_t config) {
  auto t = find(config);
  if (!t) throw std::runtime_error("configuration " + std::to_string(config) + " has no shared-memory transport");
  Control& c = t->control();
  const uint64_t all = t->processes() == 64 ? ~uint64_t(0) : (uint64_t(1) << t->processes()) - 1;
  std::string why;
  c.lock.lock();
  for (int32_t p = 0; p < t->processes() && why.empty(); ++p)
    if (c.procs[p].readable != all) why = c.procs[p].unreadable[0] ? c.procs[p].unreadable : t->describe(p) + " is not ready";
  c.lock.unlock();
  t->set_staged_because(why);
}

void release(int64_t config) {
  std::shared_ptr<Transport> t;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    auto it = g_transports.find(config);
    if (it == g_transports.end()) return;
    t = std::move(it->second);
    g_transports.erase(it);
  }
}

void release_all() {
  std::map<int64_t, std::shared_ptr<Transport>> all;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    all.swap(g_transports);
  }
}

std::vector<int32_t> pids(int64_t config) {
  auto t = find(config);
  std::vector<int32_t> out;
  if (!t) return out;
  Control& c = t->control();
  c.lock.lock();
  for (int32_t p = 0; p < t->processes(); ++p) out.push_back(c.procs[p].pid);
  c.lock.unlock();
  return out;
}

void hold_lock(int64_t config, double seconds) {
  auto t = find(config);
  if (!t) throw std::runtime_error("configuration " + std::to_string(config) + " has no shared-memory transport");
  std::promise<void> held;
  std::thread([t, seconds, &held] {
    try {
      t->control().lock.lock();
    } catch (...) {
      held.set_exception(std::current_exception());
      return;
    }
    held.set_value();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    t->control().lock.unlock();
  }).detach();
  held.get_future().get();
}

int32_t slots_in_use(int64_t config) {
  auto t = find(config);
  if (!t) throw std::runtime_error("configuration " + std::to_string(config) + " has no shared-memory transport");
  Control& c = t->control();
  int32_t used = 0;
  c.lock.lock();
  for (const Slot& s : c.slots) used += s.used && !(s.failed && s.departed == s.arrived);  // else reusable
  c.lock.unlock();
  return used;
}

std::shared_ptr<Transport> find(int64_t config) {
  std::lock_guard<std::mutex> lock(g_mu);
  auto it = g_transports.find(config);
  return it == g_transports.end() ? nullptr : it->second;
}

}  // namespace variopath::shm
