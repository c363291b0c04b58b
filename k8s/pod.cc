#include "kdm/k8s/pod.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "kdm/k8s/names.h"

namespace kdm::k8s {
namespace {

std::string DoubleQuoted(const std::string& s) { return "\"" + s + "\""; }

// (*sums)[r] += n, refused rather than wrapped.
Status AddCount(const std::string& resource, int64_t n, std::map<std::string, int64_t>* sums) {
  std::optional<int64_t> sum = CheckedAdd((*sums)[resource], n);
  if (!sum) {
    return OutOfRangeError("the pod's containers together request more than " +
                           std::to_string(std::numeric_limits<int64_t>::max()) + " of resource " +
                           DoubleQuoted(resource));
  }
  (*sums)[resource] = *sum;
  return OkStatus();
}

}  // namespace

std::set<std::string> ExtendedResourcesOf(const Pod& pod) {
  std::set<std::string> out;
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const Container& c : *list) {
      for (const auto& [resource, limit] : c.limits) {
        if (IsExtendedResourceName(resource) && !limit.IsZero()) out.insert(resource);
      }
    }
  }
  return out;
}

StatusOr<std::map<std::string, int64_t>> ContainerDeviceRequests(
    const Container& container, const IsDeviceResourceFn& is_device) {
  std::map<std::string, int64_t> out;
  for (const auto& [resource, request] : container.requests) {
    if (is_device(resource) && !container.limits.count(resource)) {
      return InvalidArgumentError("container " + DoubleQuoted(container.name) + " requests " +
                                  request.ToString() + " of resource " + DoubleQuoted(resource) +
                                  " without a limit; devices need request == limit");
    }
  }
  for (const auto& [resource, limit] : container.limits) {
    if (!is_device(resource)) continue;
    auto req = container.requests.find(resource);
    if (req != container.requests.end() && !(req->second == limit)) {
      return InvalidArgumentError("container " + DoubleQuoted(container.name) + " requests " +
                                  req->second.ToString() + " of resource " +
                                  DoubleQuoted(resource) + " but its limit is " + limit.ToString() +
                                  "; devices need request == limit");
    }
    StatusOr<int64_t> count = limit.DeviceCount();
    if (!count.ok()) {
      return count.status().WithPrefix("container " + DoubleQuoted(container.name) + " resource " +
                                       DoubleQuoted(resource));
    }
    if (*count > 0) out[resource] = *count;
  }
  return out;
}

StatusOr<std::map<std::string, int64_t>> EffectiveDeviceRequests(
    const Pod& pod, const IsDeviceResourceFn& is_device) {
  std::map<std::string, int64_t> apps;      // app containers + sidecars
  std::map<std::string, int64_t> sidecars;  // sidecars started so far
  std::map<std::string, int64_t> init_max;
  for (const Container& c : pod.init_containers) {
    KDM_ASSIGN_OR_RETURN(auto reqs, ContainerDeviceRequests(c, is_device));
    if (c.restartable) {
      for (const auto& [r, n] : reqs) {
        KDM_RETURN_IF_ERROR(AddCount(r, n, &apps));
        KDM_RETURN_IF_ERROR(AddCount(r, n, &sidecars));
      }
      for (const auto& [r, n] : sidecars) init_max[r] = std::max(init_max[r], n);
    } else {
      std::map<std::string, int64_t> during = sidecars;
      for (const auto& [r, n] : reqs) KDM_RETURN_IF_ERROR(AddCount(r, n, &during));
      for (const auto& [r, n] : during) init_max[r] = std::max(init_max[r], n);
    }
  }
  for (const Container& c : pod.containers) {
    KDM_ASSIGN_OR_RETURN(auto reqs, ContainerDeviceRequests(c, is_device));
    for (const auto& [r, n] : reqs) KDM_RETURN_IF_ERROR(AddCount(r, n, &apps));
  }
  std::map<std::string, int64_t> out = std::move(apps);
  for (const auto& [r, n] : init_max) out[r] = std::max(out[r], n);
  for (auto it = out.begin(); it != out.end();) {
    it = it->second > 0 ? std::next(it) : out.erase(it);
  }
  return out;
}

}  // namespace kdm::k8s
