// The pod-resources view of a Manager: the pods' containers and the devices
// they hold, in the kdm types that PodResourcesClient also returns. One read
// path for everything that reports a node's devices: PodResourcesServer
// answers List and Get from it, and an in-process reader (the publish loop
// of `kdm kubelet --publish`) calls it without a socket.
//
// Thread-safety: ListPodResources calls only the Manager's query methods,
// which are thread-safe; call it from any thread.
//
// Example:
//   std::vector<ContainerDevices> allocatable = manager->GetAllocatableDevices();
//   std::vector<PodResources> pods = ListPodResources(*manager, agent.ActivePods());
#ifndef KDM_DEVICEMANAGER_POD_RESOURCES_H_
#define KDM_DEVICEMANAGER_POD_RESOURCES_H_

#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod.h"

namespace kdm::devicemanager {

// What the node agent knows of one active pod (the Manager only knows the
// pods that hold devices).
struct ActivePod {
  std::string uid;
  std::string namespace_name;
  std::string name;
  // App containers and restartable init containers (sidecars), in start
  // order. Plain init containers are not listed.
  std::vector<std::string> containers;
};

// The ActivePod of `pod`: its sidecars (restartable init containers) in
// order, then its app containers; plain init containers are left out.
ActivePod ActivePodOf(const Pod& pod);

struct ContainerResources {
  std::string name;
  std::vector<ContainerDevices> devices;  // in the server's order
};

struct PodResources {
  std::string namespace_name;
  std::string name;
  std::vector<ContainerResources> containers;  // in the server's order
};

// Each pod of `pods`, in order, with each of its containers and the devices
// the Manager recorded for it (Manager::GetDevices: one entry per resource
// per NUMA node). A container without devices is listed with none.
std::vector<PodResources> ListPodResources(const Manager& manager,
                                           const std::vector<ActivePod>& pods);

// ListPodResources for one pod.
PodResources PodResourcesOf(const Manager& manager, const ActivePod& pod);

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_POD_RESOURCES_H_
