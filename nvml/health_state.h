// kdm::nvml::HealthState: the health of a plugin's GPUs, with the optional
// recovery kdm adds to NVIDIA's rules. NVIDIA's plugin never marks a GPU
// healthy again once an event made it unhealthy; with a recovery window
// (`kdm plugin --nvml --health-recovery DURATION`) a GPU is healthy again once
// the window has passed with no new critical event on it. A lost GPU never
// recovers: it needs a reset, after which the plugin is restarted.
//
// Time is given, never read: every call takes `now`, so tests step through a
// window in microseconds and the HealthMonitor passes its clock's time.
//
// Thread-safety: none; one owner (the HealthMonitor's thread, or a test).
//
// Example:
//   HealthState state({"GPU-a", "GPU-b"}, std::chrono::seconds(60));
//   state.MarkUnhealthy("GPU-a", now);          // true: it changed
//   state.Recover(now + std::chrono::seconds(59));  // {}
//   state.Recover(now + std::chrono::seconds(60));  // {"GPU-a"}
#ifndef KDM_NVML_HEALTH_STATE_H_
#define KDM_NVML_HEALTH_STATE_H_

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::nvml {

class HealthState {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  // Every id starts healthy. `recovery`: the window, nullopt for none (a
  // device stays unhealthy). REQUIRES: a window, when given, is positive.
  HealthState(const std::vector<std::string>& ids,
              std::optional<std::chrono::milliseconds> recovery);

  // A critical event on `id` at `now`: the device is unhealthy and its
  // recovery window (re)starts. True when its health changed. NOT_FOUND
  // naming the id when it is not one of the devices.
  StatusOr<bool> MarkUnhealthy(const std::string& id, TimePoint now);
  // `id` is lost: unhealthy for good. True when its health changed.
  // NOT_FOUND naming the id when it is not one of the devices.
  StatusOr<bool> MarkLost(const std::string& id);

  // Marks healthy every device whose window ended at or before `now` (never a
  // lost one); returns their ids, sorted. Always empty without a window.
  std::vector<std::string> Recover(TimePoint now);
  // When the next device would recover; nullopt when none will.
  std::optional<TimePoint> NextRecovery() const;

  // NOT_FOUND for an unknown id.
  StatusOr<bool> Healthy(const std::string& id) const;
  bool Lost(const std::string& id) const;
  // id -> healthy, every device.
  std::map<std::string, bool> Snapshot() const;

 private:
  struct Entry {
    bool healthy = true;
    bool lost = false;
    TimePoint last_event{};
  };
  std::map<std::string, Entry> devices_;
  std::optional<std::chrono::milliseconds> recovery_;
};

}  // namespace kdm::nvml

#endif  // KDM_NVML_HEALTH_STATE_H_
