#include "kdm/devicemanager/run_options.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

namespace kdm::devicemanager {

RunContainerOptions MergeRunOptions(std::vector<ResourceRunOptions> responses,
                                    std::vector<RunOptionsConflict>* conflicts) {
  std::stable_sort(responses.begin(), responses.end(),
                   [](const ResourceRunOptions& a, const ResourceRunOptions& b) {
                     return a.resource_name < b.resource_name;
                   });
  RunContainerOptions out;
  std::map<std::string, std::string> env_owner, annotation_owner;
  std::map<std::string, std::pair<Mount, std::string>> mounts;
  std::map<std::string, std::pair<DeviceSpec, std::string>> devices;
  std::set<std::string> cdi_seen;
  auto conflict = [&](const std::string& what, const std::string& kept_by,
                      const std::string& ignored_from) {
    out.conflicts.push_back(what + ": " + ignored_from + "'s value ignored, " + kept_by +
                            "'s kept");
    if (conflicts != nullptr) conflicts->push_back({what, kept_by, ignored_from});
  };
  for (const ResourceRunOptions& resource : responses) {
    const v1beta1::ContainerAllocateResponse& r = resource.response;
    const std::string& res = resource.resource_name;
    for (const auto& [k, v] : r.envs()) {
      auto [it, inserted] = out.envs.emplace(k, v);
      if (inserted) {
        env_owner[k] = res;
      } else if (it->second != v) {
        conflict("env \"" + k + "\"", env_owner[k], res);
      }
    }
    for (const auto& m : r.mounts()) {
      Mount mm{m.container_path(), m.host_path(), m.read_only()};
      auto [it, inserted] = mounts.emplace(m.container_path(), std::make_pair(mm, res));
      if (!inserted && !(it->second.first == mm)) {
        conflict("mount \"" + m.container_path() + "\"", it->second.second, res);
      }
    }
    for (const auto& d : r.devices()) {
      DeviceSpec dd{d.container_path(), d.host_path(), d.permissions()};
      auto [it, inserted] = devices.emplace(d.container_path(), std::make_pair(dd, res));
      if (!inserted && !(it->second.first == dd)) {
        conflict("device \"" + d.container_path() + "\"", it->second.second, res);
      }
    }
    for (const auto& [k, v] : r.annotations()) {
      auto [it, inserted] = out.annotations.emplace(k, v);
      if (inserted) {
        annotation_owner[k] = res;
      } else if (it->second != v) {
        conflict("annotation \"" + k + "\"", annotation_owner[k], res);
      }
    }
    for (const auto& cdi : r.cdi_devices()) {
      if (cdi_seen.insert(cdi.name()).second) out.cdi_devices.push_back(cdi.name());
    }
  }
  for (auto& [path, m] : mounts) out.mounts.push_back(m.first);
  for (auto& [path, d] : devices) out.devices.push_back(d.first);
  return out;
}

}  // namespace kdm::devicemanager
