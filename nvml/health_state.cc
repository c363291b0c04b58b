#include "kdm/nvml/health_state.h"

namespace kdm::nvml {
namespace {

Status UnknownDevice(const std::string& id) {
  return NotFoundError("device \"" + id + "\" is not a GPU of this plugin");
}

}  // namespace

HealthState::HealthState(const std::vector<std::string>& ids,
                         std::optional<std::chrono::milliseconds> recovery)
    : recovery_(recovery) {
  for (const std::string& id : ids) devices_[id];
}

StatusOr<bool> HealthState::MarkUnhealthy(const std::string& id, TimePoint now) {
  auto it = devices_.find(id);
  if (it == devices_.end()) return UnknownDevice(id);
  const bool changed = it->second.healthy;
  it->second.healthy = false;
  it->second.last_event = now;
  return changed;
}

StatusOr<bool> HealthState::MarkLost(const std::string& id) {
  auto it = devices_.find(id);
  if (it == devices_.end()) return UnknownDevice(id);
  const bool changed = it->second.healthy;
  it->second.healthy = false;
  it->second.lost = true;
  return changed;
}

std::vector<std::string> HealthState::Recover(TimePoint now) {
  std::vector<std::string> recovered;
  if (!recovery_) return recovered;
  for (auto& [id, e] : devices_) {
    if (!e.healthy && !e.lost && e.last_event + *recovery_ <= now) {
      e.healthy = true;
      recovered.push_back(id);
    }
  }
  return recovered;
}

std::optional<HealthState::TimePoint> HealthState::NextRecovery() const {
  std::optional<TimePoint> next;
  if (!recovery_) return next;
  for (const auto& [id, e] : devices_) {
    if (e.healthy || e.lost) continue;
    TimePoint at = e.last_event + *recovery_;
    if (!next || at < *next) next = at;
  }
  return next;
}

StatusOr<bool> HealthState::Healthy(const std::string& id) const {
  auto it = devices_.find(id);
  if (it == devices_.end()) return UnknownDevice(id);
  return it->second.healthy;
}

bool HealthState::Lost(const std::string& id) const {
  auto it = devices_.find(id);
  return it != devices_.end() && it->second.lost;
}

std::map<std::string, bool> HealthState::Snapshot() const {
  std::map<std::string, bool> out;
  for (const auto& [id, e] : devices_) out[id] = e.healthy;
  return out;
}

}  // namespace kdm::nvml
