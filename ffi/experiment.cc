#include "experiment.h"

#include <cmath>

namespace variopath {

std::string check_experiment(const std::vector<ExperimentTransfer>& ts, size_t routes) {
  size_t step_first = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const ExperimentTransfer& t = ts[i];
    const std::string name = "transfer " + std::to_string(i);
    if (t.route < 0 || static_cast<size_t>(t.route) >= routes) return name + ": route does not exist";
    if (t.nbytes < 0) return name + ": negative byte count";
    if (!(t.cap >= 0 && std::isfinite(t.cap))) return name + ": cap must be >= 0 (0: unpaced)";
    if (i > 0 && t.step < ts[i - 1].step) return name + ": steps must not decrease";
    if (i == 0 || t.step != ts[i - 1].step) step_first = i;
    if (t.after >= static_cast<int32_t>(i) || (t.after >= 0 && static_cast<size_t>(t.after) < step_first))
      return name + ": after must name an earlier transfer of the same step, or be -1";
  }
  return "";
}

}  // namespace variopath
