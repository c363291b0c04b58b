#include "kdm/nvml/allocate_answer.h"

#include <set>
#include <utility>

#include "kdm/base/file_system.h"

namespace kdm::nvml {

AllocateAnswerBuilder::AllocateAnswerBuilder(std::vector<GpuNode> gpus,
                                             AllocateAnswerOptions options)
    : options_(std::move(options)) {
  for (GpuNode& g : gpus) minors_[std::move(g.uuid)] = g.minor;
  if (options_.dev_root.empty()) options_.dev_root = "/";
}

StatusOr<AllocateAnswer> AllocateAnswerBuilder::Answer(const std::vector<std::string>& ids) const {
  if (ids.empty()) return InvalidArgumentError("allocate request names no GPU");
  AllocateAnswer a;
  std::set<std::string> seen;
  std::string visible;
  for (const std::string& id : ids) {
    auto it = minors_.find(id);
    if (it == minors_.end()) {
      return NotFoundError("device \"" + id + "\" is not a GPU of this plugin");
    }
    if (!seen.insert(id).second)
      return InvalidArgumentError("device \"" + id + "\" is listed twice");
    if (!visible.empty()) visible += ",";
    visible += id;
    a.device_nodes.push_back("/dev/nvidia" + std::to_string(it->second));
  }
  a.envs[kVisibleDevicesEnv] = visible;
  for (const char* node : kNvidiaControlNodes) {
    if (options_.env->Stat(JoinPath(options_.dev_root, node)).ok()) a.device_nodes.push_back(node);
  }
  if (options_.cdi) {
    for (const std::string& id : ids) a.cdi_devices.push_back(options_.cdi_kind + "=" + id);
  }
  return a;
}

}  // namespace kdm::nvml
