#include "kdm/devicemanager/pod.h"

#include "kdm/pluginapi/api_rules.h"

namespace kdm::devicemanager {

std::set<std::string> ExtendedResourcesOf(const Pod& pod) {
  std::set<std::string> out;
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const Container& c : *list) {
      for (const auto& [resource, limit] : c.limits) {
        if (pluginapi::IsExtendedResourceName(resource) && !limit.IsZero()) out.insert(resource);
      }
    }
  }
  return out;
}

}  // namespace kdm::devicemanager
