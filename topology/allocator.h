// The topology-aware allocator: given the free devices of a node, the devices
// a request must keep (must_include) and a size, it returns the set to hand
// out.
//
// Policies:
//  - kPacked (the default, kDefaultPolicy): the objective of NVIDIA's go-gpuallocator best-effort
//    policy, solved exactly. Split all available devices into groups of
//    `size` (one smaller group holds the remainder) so that one full group
//    holds must_include, maximise the sum of group scores, and return the best
//    full group holding must_include. Ties, in order: the packing whose
//    weakest full group scores highest; the group's own score (higher); fewer
//    NUMA nodes; the lowest indices.
//  - kBestSet: maximise the chosen set's own score. Ties: the packed score of
//    what remains (higher), fewer NUMA nodes, the lowest indices.
//  - kFirstFit: must_include plus the lowest available indices (the kubelet's
//    behaviour without a preferred allocation), for comparison.
//
// The search is exact: memoised dynamic programming over subsets for the
// packing, branch and bound for the best set. A budget bounds the time on
// large inputs (more than about 16 devices): when it runs out the result is
// the best found (a greedy set) and `optimal` is false. Above 64 available
// devices only the greedy search runs.
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   kdm::StatusOr<Allocation> a =
//       Allocate(topology, /*available=*/{0, 1, 2, 3, 4, 5, 6, 7},
//                /*must_include=*/{}, /*size=*/2, Policy::kPacked);
//   if (a.ok()) Use(a->chosen);  // {0, 3} on dgx1-v100
#ifndef KDM_TOPOLOGY_ALLOCATOR_H_
#define KDM_TOPOLOGY_ALLOCATOR_H_

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/topology/topology.h"

namespace kdm::topology {

enum class Policy { kPacked, kBestSet, kFirstFit };

// The policy every part of kdm takes when none is named: `kdm plugin
// --policy`, `kdm topo --policy`, `kdm extender --policy` (as its ranking) and
// the extender's prediction for a node whose annotation names no policy (what
// an unconfigured kdm plugin answers). One value, so that a scheduler and a
// node never disagree on what "best" is.
inline constexpr Policy kDefaultPolicy = Policy::kPacked;

// "packed", "best-set" or "first-fit"; INVALID_ARGUMENT naming the word
// otherwise.
StatusOr<Policy> ParsePolicy(std::string_view name);
std::string_view PolicyName(Policy policy);

struct AllocateOptions {
  // Wall-clock time the exact search may take before it settles for the best
  // set found so far.
  std::chrono::milliseconds budget{50};
};

struct Allocation {
  std::vector<int> chosen;  // sorted device indices, exactly `size` of them
  int64_t score = 0;        // SetScore(chosen)
  // The best total score of a packing of all available devices into groups
  // of `size` (one smaller group holds the remainder) in which `chosen` is a
  // group.
  int64_t packed_score = 0;
  // True when the search finished: `chosen` is the policy's best set and
  // `packed_score` is exact. False when the budget ran out.
  bool optimal = true;
};

// Chooses `size` devices from `available` (device indices of `topology`),
// keeping every device of `must_include`.
// On success the result has exactly `size` sorted indices, all in
// `available`, holding `must_include`.
// On failure: INVALID_ARGUMENT when size < 1, an index is outside the
// topology or listed twice, a must_include device is not available, or
// must_include is larger than size; RESOURCE_EXHAUSTED when size is above the
// number of available devices. Each message names the device or the numbers.
StatusOr<Allocation> Allocate(const Topology& topology, const std::vector<int>& available,
                              const std::vector<int>& must_include, int size, Policy policy,
                              const AllocateOptions& options = {});

// Allocate with device ids instead of indices; returns the chosen ids in index
// order. INVALID_ARGUMENT naming an id the topology does not know.
StatusOr<std::vector<std::string>> AllocateIds(const Topology& topology,
                                               const std::vector<std::string>& available,
                                               const std::vector<std::string>& must_include,
                                               int size, Policy policy,
                                               const AllocateOptions& options = {});

}  // namespace kdm::topology

#endif  // KDM_TOPOLOGY_ALLOCATOR_H_
