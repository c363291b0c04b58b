// Pod builders shared by the Manager's tests (mock and integration).
#ifndef KDM_TEST_DEVICEMANAGER_TEST_PODS_H_
#define KDM_TEST_DEVICEMANAGER_TEST_PODS_H_

#include <map>
#include <string>

#include "kdm/devicemanager/pod.h"
#include "kdm/devicemanager/quantity.h"

namespace kdm::devicemanager::testing {

// A pod "pod-<uid>" in namespace "default"; `app` and `init` map container
// names to their device limits (resource -> count), init containers in name
// order.
inline Pod MakePod(const std::string& uid,
                   const std::map<std::string, std::map<std::string, int>>& app,
                   const std::map<std::string, std::map<std::string, int>>& init = {}) {
  Pod pod;
  pod.uid = uid;
  pod.namespace_name = "default";
  pod.name = "pod-" + uid;
  auto fill = [](const std::string& name, const std::map<std::string, int>& limits) {
    Container c;
    c.name = name;
    for (const auto& [r, n] : limits) c.limits[r] = Quantity::FromInt(n);
    return c;
  };
  for (const auto& [name, limits] : init) pod.init_containers.push_back(fill(name, limits));
  for (const auto& [name, limits] : app) pod.containers.push_back(fill(name, limits));
  return pod;
}

}  // namespace kdm::devicemanager::testing

#endif  // KDM_TEST_DEVICEMANAGER_TEST_PODS_H_
