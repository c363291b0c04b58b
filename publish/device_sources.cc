#include "kdm/publish/device_sources.h"

#include <optional>
#include <utility>

namespace kdm::publish {

kube::NodeDevices NodeDevicesOf(const std::vector<devicemanager::ContainerDevices>& allocatable,
                                const std::vector<devicemanager::PodResources>& pods) {
  kube::NodeDevices out;
  for (const auto& d : allocatable) {
    auto& ids = out.allocatable[d.resource_name];
    std::optional<int> numa;
    if (d.numa_node && *d.numa_node >= 0 && *d.numa_node <= 1 << 20) {
      numa = static_cast<int>(*d.numa_node);
    }
    for (const std::string& id : d.device_ids) {
      // A device on several NUMA nodes is listed once per node: the first wins.
      ids.emplace(id, numa);
    }
  }
  for (const auto& pod : pods) {
    bool holds = false;
    for (const auto& c : pod.containers) {
      for (const auto& d : c.devices) {
        out.in_use[d.resource_name].insert(d.device_ids.begin(), d.device_ids.end());
        holds = holds || !d.device_ids.empty();
      }
    }
    if (holds) out.holders.emplace(pod.namespace_name, pod.name);
  }
  return out;
}

StatusOr<kube::NodeDevices> PodResourcesSource::Read() {
  KDM_ASSIGN_OR_RETURN(std::vector<devicemanager::ContainerDevices> allocatable,
                       client_->GetAllocatableResources());
  KDM_ASSIGN_OR_RETURN(std::vector<devicemanager::PodResources> pods, client_->List());
  return NodeDevicesOf(allocatable, pods);
}

StatusOr<kube::NodeDevices> ManagerSource::Read() {
  std::vector<devicemanager::ActivePod> active;
  if (active_pods_) active = active_pods_();
  return NodeDevicesOf(manager_->GetAllocatableDevices(),
                       devicemanager::ListPodResources(*manager_, active));
}

}  // namespace kdm::publish
