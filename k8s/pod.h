// kdm::k8s::Pod: the plain C++ pod model an embedder hands to the device
// manager, and the extender reads from kube-scheduler. Only what device
// allocation needs: identity, the containers in start order, and their
// resource limits and requests. No Kubernetes client, no protobuf.
//
// The one home of the pod's device request rules
// (docs/kubelet-rules.md#allocation): ContainerDeviceRequests (request ==
// limit, whole counts) and EffectiveDeviceRequests (app containers summed,
// sidecars, the largest init container). The device manager's Ledger and the
// extender both call them.
//
// Container order matters: init containers run first, one after the other,
// in the order of `init_containers`; a restartable init container (restart
// policy Always, a "sidecar") keeps running next to the app containers.
// Devices of a finished, non-restartable init container are handed over to
// the containers that follow it in the same pod
// (docs/kubelet-rules.md#init-containers-and-sidecars).
//
// For extended resources (devices) Kubernetes requires request == limit; a
// limit alone is the request, and a container whose request for a device
// resource differs from its limit (or has no limit) is refused.
//
// Thread-safety: plain values.
//
// Example:
//   Pod pod{.uid = "0f3c...", .namespace_name = "default", .name = "train"};
//   Container c{.name = "main"};
//   c.limits["vendor.com/gpu"] = Quantity::FromInt(2);
//   pod.containers.push_back(c);
#ifndef KDM_K8S_POD_H_
#define KDM_K8S_POD_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/k8s/quantity.h"

namespace kdm::k8s {

struct Container {
  std::string name;
  // Resource name -> quantity. Device resources are read from `limits`.
  std::map<std::string, Quantity> limits;
  std::map<std::string, Quantity> requests;
  // Init containers only: restartPolicy Always, i.e. a sidecar.
  bool restartable = false;
  // Environment variables with a literal value (name, value), in manifest
  // order, each name once (a later entry of the same name replaces the
  // earlier value, as the kubelet does). The device manager does not read
  // them; the node agent checks NVIDIA_REQUIRE_* against them.
  std::vector<std::pair<std::string, std::string>> env;
};

// What role a container plays in its pod.
enum class ContainerKind {
  kInit,     // non-restartable init container: runs to completion first
  kSidecar,  // restartable init container: keeps running
  kApp,      // app container
};

struct Pod {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::vector<Container> init_containers;  // in start order
  std::vector<Container> containers;       // app containers

  // The container named `name` (init or app), or nullptr.
  const Container* FindContainer(std::string_view name) const {
    for (const Container& c : init_containers) {
      if (c.name == name) return &c;
    }
    for (const Container& c : containers) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }

  // True if `name` is one of `init_containers` (sidecars included).
  bool IsInitContainer(std::string_view name) const {
    for (const Container& c : init_containers) {
      if (c.name == name) return true;
    }
    return false;
  }

  // The role of container `name`, or nullopt if the pod has no such container.
  std::optional<ContainerKind> KindOf(std::string_view name) const {
    for (const Container& c : init_containers) {
      if (c.name == name) return c.restartable ? ContainerKind::kSidecar : ContainerKind::kInit;
    }
    for (const Container& c : containers) {
      if (c.name == name) return ContainerKind::kApp;
    }
    return std::nullopt;
  }
};

// The extended resources (k8s::IsExtendedResourceName) that a container of
// `pod`, init or app, asks for with a non-zero limit: the resources that only
// a device plugin can provide. Sorted.
std::set<std::string> ExtendedResourcesOf(const Pod& pod);

// Which resources count as devices: the device manager's are the registered
// ones (Ledger::IsDeviceResource), the extender's every extended resource.
using IsDeviceResourceFn = std::function<bool(const std::string& resource)>;

// The device resources named in `container`'s limits with their counts;
// zero counts are left out. INVALID_ARGUMENT naming the container, resource
// and value: a request without a limit, a request != its limit, a negative,
// fractional or too large (Quantity::kMaxDeviceCount) count.
StatusOr<std::map<std::string, int64_t>> ContainerDeviceRequests(
    const Container& container, const IsDeviceResourceFn& is_device);

// The pod's effective device requests: per resource the larger of (the sum
// over app containers and sidecars) and, for each plain init container, (its
// own count + the sidecars started before it). Zero counts are left out.
// Errors: ContainerDeviceRequests' for the first container that has one, in
// start order; OUT_OF_RANGE when a sum does not fit int64_t (never wrapped).
StatusOr<std::map<std::string, int64_t>> EffectiveDeviceRequests(
    const Pod& pod, const IsDeviceResourceFn& is_device);

}  // namespace kdm::k8s

#endif  // KDM_K8S_POD_H_
