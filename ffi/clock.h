// The clock every deadline and pacing interval in ffi/ is measured on, and a span of seconds
// (a timeout, bytes over a rate) as its duration.
#pragma once

#include <chrono>

namespace variopath {

using Clock = std::chrono::steady_clock;

inline Clock::duration seconds_of(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace variopath
