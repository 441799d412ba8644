#include "shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <stdexcept>

namespace variopath::shm {

namespace {

std::runtime_error sys_error(const std::string& what, const std::string& name) {
  return std::runtime_error(what + " shared-memory segment " + name + ": " + std::strerror(errno));
}

uint8_t* map(int fd, size_t bytes, bool writable, const std::string& name) {
  void* p = mmap(nullptr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) throw sys_error("cannot map", name);
  return static_cast<uint8_t*>(p);
}

}  // namespace

std::unique_ptr<Segment> Segment::create(const std::string& name, size_t bytes) {
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw sys_error("cannot create", name);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    errno = e;
    throw sys_error("cannot size (is /dev/shm full?)", name);
  }
  uint8_t* data = nullptr;
  try {
    data = map(fd, bytes, true, name);
  } catch (...) {
    close(fd);
    shm_unlink(name.c_str());
    throw;
  }
  close(fd);
  return std::unique_ptr<Segment>(new Segment(name, data, bytes, true, true));
}

std::unique_ptr<Segment> Segment::open(const std::string& name, bool writable) {
  const int fd = shm_open(name.c_str(), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) throw sys_error("cannot open", name);
  struct stat st{};
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    throw sys_error("cannot size", name);
  }
  uint8_t* data = nullptr;
  try {
    data = map(fd, static_cast<size_t>(st.st_size), writable, name);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  return std::unique_ptr<Segment>(new Segment(name, data, static_cast<size_t>(st.st_size), false, writable));
}

Segment::~Segment() {
  if (unpin_) unpin_();
  munmap(data_, size_);
  unlink();
}

std::string Segment::pin_once(const std::function<std::string(Undo& undo)>& pin) {
  std::lock_guard<std::mutex> lock(pin_mu_);
  if (!pin_tried_) {
    pin_tried_ = true;
    pin_error_ = pin(unpin_);
  }
  return pin_error_;
}

void Segment::unlink() {
  if (owner_) shm_unlink(name_.c_str());
  owner_ = false;
}

bool unlink_name(const std::string& name) { return shm_unlink(name.c_str()) == 0; }

bool name_exists(const std::string& name) {
  const int fd = shm_open(name.c_str(), O_RDONLY, 0);
  if (fd >= 0) close(fd);
  return fd >= 0 || errno != ENOENT;
}

void SharedLock::init(Clock::duration patience) {
  pthread_mutexattr_t attr;
  pthread_mutexattr_init(&attr);
  pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&mutex, &attr);
  pthread_mutexattr_destroy(&attr);
  generation.store(0);
  holder_pid.store(0);
  holder_tid.store(0);
  patience_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(patience).count();
}

bool SharedLock::lock() {
  timespec until{};
  clock_gettime(CLOCK_MONOTONIC, &until);
  const int64_t at = int64_t(until.tv_sec) * 1000000000 + until.tv_nsec + patience_ns;
  until = {static_cast<time_t>(at / 1000000000), static_cast<long>(at % 1000000000)};
  const int rc = pthread_mutex_clocklock(&mutex, CLOCK_MONOTONIC, &until);
  if (rc == ETIMEDOUT) {
    char s[32];
    std::snprintf(s, sizeof s, "%g", double(patience_ns) / 1e9);
    throw LockTimeout(std::string("the shared-memory transport's lock was held for more than ") + s +
                      " s by pid " + std::to_string(holder_pid.load()) + " (thread " +
                      std::to_string(holder_tid.load()) + "): that process is stopped or stuck");
  }
  if (rc != 0 && rc != EOWNERDEAD)
    throw std::runtime_error(std::string("the shared-memory transport's lock: ") + std::strerror(rc));
  holder_pid.store(getpid());
  holder_tid.store(static_cast<int32_t>(gettid()));
  if (rc == EOWNERDEAD) {
    pthread_mutex_consistent(&mutex);
    return true;
  }
  return false;
}

void SharedLock::unlock() {
  if (holder_tid.load() != static_cast<int32_t>(gettid()) || holder_pid.load() != getpid()) return;
  holder_tid.store(0);
  holder_pid.store(0);
  pthread_mutex_unlock(&mutex);
}

void SharedLock::notify() {
  generation.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&generation), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

void SharedLock::wait(Clock::time_point until, Clock::duration slice) {
  const uint32_t seen = generation.load(std::memory_order_acquire);
  unlock();
  auto left = std::min(until - Clock::now(), slice);
  if (left > Clock::duration::zero()) {
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    // a non-private futex: the word lives in memory shared with other processes
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&generation), FUTEX_WAIT, seen, &ts, nullptr, 0);
  }
  lock();
}

bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  // a process that exited but was not reaped yet still answers kill(): read its state
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;  // no procfs: trust kill()
  const auto close_paren = line.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= line.size()) return true;
  const char state = line[close_paren + 2];
  return state != 'Z' && state != 'X';
}

}  // namespace variopath::shm
