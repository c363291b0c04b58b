#include "kdm/devicemanager/pod_resources.h"

namespace kdm::devicemanager {

ActivePod ActivePodOf(const Pod& pod) {
  ActivePod out{
      .uid = pod.uid, .namespace_name = pod.namespace_name, .name = pod.name, .containers = {}};
  for (const Container& c : pod.init_containers) {
    if (c.restartable) out.containers.push_back(c.name);
  }
  for (const Container& c : pod.containers) out.containers.push_back(c.name);
  return out;
}

PodResources PodResourcesOf(const Manager& manager, const ActivePod& pod) {
  PodResources out{.namespace_name = pod.namespace_name, .name = pod.name, .containers = {}};
  out.containers.reserve(pod.containers.size());
  for (const std::string& container : pod.containers) {
    out.containers.push_back(
        {.name = container, .devices = manager.GetDevices(pod.uid, container)});
  }
  return out;
}

std::vector<PodResources> ListPodResources(const Manager& manager,
                                           const std::vector<ActivePod>& pods) {
  std::vector<PodResources> out;
  out.reserve(pods.size());
  for (const ActivePod& pod : pods) out.push_back(PodResourcesOf(manager, pod));
  return out;
}

}  // namespace kdm::devicemanager
