#include <algorithm>
#include <utility>

#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {
namespace {

class MemoryStore final : public Store {
 public:
  StatusOr<CheckpointData> Load() override {
    CheckpointData out = data_;
    std::sort(out.entries.begin(), out.entries.end(),
              [](const PodDevicesEntry& a, const PodDevicesEntry& b) { return a.key() < b.key(); });
    return out;
  }

  Status Apply(const Change& change) override {
    auto& entries = data_.entries;
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
      data_.registered_devices.erase(resource);
    }
    for (const auto& [resource, ids] : change.registered_devices) {
      data_.registered_devices[resource] = ids;
    }
    return OkStatus();
  }

  Status Replace(const CheckpointData& data) override {
    data_ = data;
    return OkStatus();
  }

  Status SetBootId(const std::string& boot_id) override {
    data_.boot_id = boot_id;
    return OkStatus();
  }

  std::string Describe() const override { return "memory"; }

 private:
  CheckpointData data_;
};

}  // namespace

std::unique_ptr<Store> NewMemoryStore() { return std::make_unique<MemoryStore>(); }

}  // namespace kdm::checkpoint
