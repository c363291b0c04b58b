#include "kdm/topology/allocator.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <unordered_map>
#include <utility>

#include "kdm/topology/search.h"

namespace kdm::topology {

StatusOr<Policy> ParsePolicy(std::string_view name) {
  if (name == "packed") return Policy::kPacked;
  if (name == "best-set") return Policy::kBestSet;
  if (name == "first-fit") return Policy::kFirstFit;
  return InvalidArgumentError("unknown policy '" + std::string(name) +
                              "' (expected packed, best-set or first-fit)");
}

std::string_view PolicyName(Policy policy) {
  switch (policy) {
    case Policy::kPacked:
      return "packed";
    case Policy::kBestSet:
      return "best-set";
    case Policy::kFirstFit:
      return "first-fit";
  }
  return "packed";
}

namespace {

std::string Name(const Topology& t, int i) {
  return std::to_string(i) + " ('" + t.Device(i).id + "')";
}

Status Validate(const Topology& t, const std::vector<int>& available,
                const std::vector<int>& must_include, int size) {
  if (size < 1) return InvalidArgumentError("size must be at least 1, got " + std::to_string(size));
  std::vector<char> in_available(t.size(), 0);
  for (int i : available) {
    if (i < 0 || i >= t.size()) {
      return InvalidArgumentError("available device index " + std::to_string(i) +
                                  " is outside the topology (" + std::to_string(t.size()) +
                                  " devices)");
    }
    if (in_available[i]) {
      return InvalidArgumentError("device " + Name(t, i) + " is listed twice in available");
    }
    in_available[i] = 1;
  }
  std::vector<char> in_must(t.size(), 0);
  for (int i : must_include) {
    if (i < 0 || i >= t.size()) {
      return InvalidArgumentError("must-include device index " + std::to_string(i) +
                                  " is outside the topology (" + std::to_string(t.size()) +
                                  " devices)");
    }
    if (in_must[i]) {
      return InvalidArgumentError("device " + Name(t, i) + " is listed twice in must-include");
    }
    in_must[i] = 1;
    if (!in_available[i]) {
      return InvalidArgumentError("must-include device " + Name(t, i) + " is not in available");
    }
  }
  if (static_cast<int>(must_include.size()) > size) {
    return InvalidArgumentError(std::to_string(must_include.size()) +
                                " must-include devices do not fit in a set of size " +
                                std::to_string(size));
  }
  if (size > static_cast<int>(available.size())) {
    return ResourceExhaustedError("size " + std::to_string(size) + " is above the " +
                                  std::to_string(available.size()) + " available devices");
  }
  return OkStatus();
}

}  // namespace

StatusOr<Allocation> Allocate(const Topology& topology, const std::vector<int>& available,
                              const std::vector<int>& must_include, int size, Policy policy,
                              const AllocateOptions& options) {
  KDM_RETURN_IF_ERROR(Validate(topology, available, must_include, size));
  internal::Search search(topology, available, must_include, size,
                          std::chrono::steady_clock::now() + options.budget);
  internal::Result r;
  switch (policy) {
    case Policy::kPacked:
      r = search.Packed();
      break;
    case Policy::kBestSet:
      r = search.BestSet();
      break;
    case Policy::kFirstFit:
      r = search.FirstFit();
      break;
  }
  Allocation a;
  a.chosen = std::move(r.chosen);
  std::sort(a.chosen.begin(), a.chosen.end());
  a.score = r.score;
  a.packed_score = r.packed_score;
  a.optimal = r.optimal;
  return a;
}

StatusOr<std::vector<std::string>> AllocateIds(const Topology& topology,
                                               const std::vector<std::string>& available,
                                               const std::vector<std::string>& must_include,
                                               int size, Policy policy,
                                               const AllocateOptions& options) {
  auto to_indices = [&](const std::vector<std::string>& ids,
                        const char* what) -> StatusOr<std::vector<int>> {
    std::vector<int> out;
    out.reserve(ids.size());
    for (const std::string& id : ids) {
      auto i = topology.IndexOf(id);
      if (!i) {
        return InvalidArgumentError(std::string(what) + " device id '" + id +
                                    "' is not in the topology");
      }
      out.push_back(*i);
    }
    return out;
  };
  KDM_ASSIGN_OR_RETURN(std::vector<int> avail, to_indices(available, "available"));
  KDM_ASSIGN_OR_RETURN(std::vector<int> must, to_indices(must_include, "must-include"));
  KDM_ASSIGN_OR_RETURN(Allocation a, Allocate(topology, avail, must, size, policy, options));
  std::vector<std::string> ids;
  for (int i : a.chosen) ids.push_back(topology.Device(i).id);
  return ids;
}

}  // namespace kdm::topology
