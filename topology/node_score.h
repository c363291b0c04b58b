// NodeScore: how well a node can serve a request of `size` devices, on the
// scale of the GPU topology-aware scheduling KEP, so a scheduler can rank
// nodes: the best achievable set score x 100 / (pairs x 1800), where pairs =
// size x (size - 1) / 2 and 1800 is the score of an NV18 pair. The result is
// capped at 100; a request of one device scores 100 (it has no pairs to lose).
//
// Thread-safety: a free function without shared state; safe from any thread.
//
// Example:
//   kdm::StatusOr<double> s = NodeScore(*Preset("dgx1-v100"), {0, 1, 2, 3}, 2);
//   // (200 + 50) x 100 / (1 x 1800) = 13.9
#ifndef KDM_TOPOLOGY_NODE_SCORE_H_
#define KDM_TOPOLOGY_NODE_SCORE_H_

#include <chrono>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/topology/topology.h"

namespace kdm::topology {

// The score of one pair joined by 18 NVLinks, the normalisation unit.
inline constexpr int kNodeScorePairUnit = 1800;

// The best set is found as Allocate's best-set policy finds it (exact, within
// `budget`; the best found otherwise). Errors as Allocate: INVALID_ARGUMENT for
// size < 1 or a bad index, RESOURCE_EXHAUSTED when size is above the number of
// available devices.
StatusOr<double> NodeScore(const Topology& topology, const std::vector<int>& available, int size,
                           std::chrono::milliseconds budget = std::chrono::milliseconds(50));

}  // namespace kdm::topology

#endif  // KDM_TOPOLOGY_NODE_SCORE_H_
