#include "kdm/topology/node_score.h"

#include <algorithm>

#include "kdm/topology/allocator.h"

namespace kdm::topology {

StatusOr<double> NodeScore(const Topology& topology, const std::vector<int>& available, int size,
                           std::chrono::milliseconds budget) {
  AllocateOptions options;
  options.budget = budget;
  KDM_ASSIGN_OR_RETURN(Allocation best,
                       Allocate(topology, available, {}, size, Policy::kBestSet, options));
  if (size == 1) return 100.0;
  const double pairs = static_cast<double>(size) * (size - 1) / 2;
  return std::min(100.0, static_cast<double>(best.score) * 100.0 / (pairs * kNodeScorePairUnit));
}

}  // namespace kdm::topology
