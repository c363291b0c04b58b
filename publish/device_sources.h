// Where the publish loop reads the node's devices (kube::DeviceSource):
// over a pod-resources socket (`kdm publish`, beside a real kubelet or `kdm
// kubelet`), or from a devicemanager::Manager in the same process (`kdm
// kubelet --publish`: no dial of its own socket). Both read the same
// answers — the Manager source through devicemanager::ListPodResources,
// which the pod-resources server answers List from — and turn them into
// kube::NodeDevices the same way (NodeDevicesOf).
//
// Thread-safety: Read() from one thread at a time (the loop's).
//
// Example:
//   auto source = std::make_unique<publish::ManagerSource>(
//       &agent->manager(), [&] { return agent->ActivePods(); });
//   StatusOr<kube::NodeDevices> now = source->Read();
#ifndef KDM_PUBLISH_DEVICE_SOURCES_H_
#define KDM_PUBLISH_DEVICE_SOURCES_H_

#include <functional>
#include <memory>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod_resources.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/kube/publisher.h"

namespace kdm::publish {

// The NodeDevices of a pod-resources reading: `allocatable` (id -> NUMA
// node; a device listed on several NUMA nodes keeps the first, a NUMA node
// outside 0..2^20 counts as none), the ids any container of `pods` holds,
// and as holders the pods with at least one such id.
kube::NodeDevices NodeDevicesOf(const std::vector<devicemanager::ContainerDevices>& allocatable,
                                const std::vector<devicemanager::PodResources>& pods);

// Reads the node through a pod-resources socket: GetAllocatableResources
// (id -> NUMA node) and List (ids in use). Errors: the client's.
class PodResourcesSource final : public kube::DeviceSource {
 public:
  explicit PodResourcesSource(std::unique_ptr<devicemanager::PodResourcesClient> client)
      : client_(std::move(client)) {}
  StatusOr<kube::NodeDevices> Read() override;

 private:
  std::unique_ptr<devicemanager::PodResourcesClient> client_;
};

// Reads the node from a Manager in this process: its allocatable (healthy)
// devices and the devices of the active pods' containers, as the
// pod-resources server would answer. Never fails; no socket, no RPC.
class ManagerSource final : public kube::DeviceSource {
 public:
  // REQUIRES: `manager` not null and outlives the source; `active_pods`
  // thread-safe (it is called on the loop's thread). Null active_pods: no
  // pod is active.
  ManagerSource(const devicemanager::Manager* manager,
                std::function<std::vector<devicemanager::ActivePod>()> active_pods)
      : manager_(manager), active_pods_(std::move(active_pods)) {}
  StatusOr<kube::NodeDevices> Read() override;

 private:
  const devicemanager::Manager* const manager_;
  const std::function<std::vector<devicemanager::ActivePod>()> active_pods_;
};

}  // namespace kdm::publish

#endif  // KDM_PUBLISH_DEVICE_SOURCES_H_
