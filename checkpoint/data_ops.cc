#include "kdm/checkpoint/data_ops.h"

#include <algorithm>

namespace kdm::checkpoint::internal {

void ApplyChange(CheckpointData& data, const Change& change) {
  auto& entries = data.entries;
  for (const std::string& uid : change.removed_pods) {
    std::erase_if(entries, [&](const PodDevicesEntry& e) { return e.pod_uid == uid; });
  }
  for (const ContainerKey& key : change.removals) {
    std::erase_if(entries, [&](const PodDevicesEntry& e) { return e.key() == key; });
  }
  for (const PodDevicesEntry& entry : change.upserts) {
    auto it = std::find_if(entries.begin(), entries.end(),
                           [&](const PodDevicesEntry& e) { return e.key() == entry.key(); });
    if (it != entries.end()) {
      *it = entry;
    } else {
      entries.push_back(entry);
    }
  }
  for (const std::string& resource : change.removed_resources) {
    data.registered_devices.erase(resource);
  }
  for (const auto& [resource, ids] : change.registered_devices) {
    data.registered_devices[resource] = ids;
  }
}

void NormalizeEntries(CheckpointData& data) {
  auto& entries = data.entries;
  std::stable_sort(
      entries.begin(), entries.end(),
      [](const PodDevicesEntry& a, const PodDevicesEntry& b) { return a.key() < b.key(); });
  std::vector<PodDevicesEntry> out;
  out.reserve(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i + 1 < entries.size() && entries[i + 1].key() == entries[i].key()) continue;
    out.push_back(std::move(entries[i]));
  }
  entries = std::move(out);
}

}  // namespace kdm::checkpoint::internal
