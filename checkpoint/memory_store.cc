#include <utility>

#include "kdm/checkpoint/data_ops.h"
#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint {
namespace {

class MemoryStore final : public Store {
 public:
  StatusOr<CheckpointData> Load() override {
    CheckpointData out = data_;
    internal::NormalizeEntries(out);
    return out;
  }

  Status Apply(const Change& change) override {
    internal::ApplyChange(data_, change);
    return OkStatus();
  }

  Status Replace(const CheckpointData& data) override {
    data_ = data;
    internal::NormalizeEntries(data_);
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
