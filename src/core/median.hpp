// The median of a sample: the tuner, its striped measurement and the CLI's benchmarks report
// medians over repeats, and share this one definition. Internal to the library (the CLI reaches it
// through src/).
#pragma once

#include <algorithm>
#include <vector>

namespace nvio::detail {

// The middle value, or the mean of the middle two for an even count; 0 for an empty sample.
inline double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 == 1 ? values[mid] : (values[mid - 1] + values[mid]) / 2;
}

}  // namespace nvio::detail
