// kdm::nvml::HealthMonitor: watches the GPUs' health through one NVML event
// set and applies health_rules.h and HealthState (recovery) to what arrives.
//
// Start():
//  - with DP_DISABLE_HEALTHCHECKS=all (checks.disabled) nothing is created
//    and no thread runs: every GPU stays healthy;
//  - otherwise one event set (nvmlEventSetCreate; its failure is Start's
//    error), and per GPU the supported part of {Xid critical 0x8, double-bit
//    ECC 0x2} (EventMaskFor, ANDed with nvmlDeviceGetSupportedEventTypes:
//    NVML registers all or nothing). A GPU whose types cannot be read, that
//    supports none of them, or whose registration fails is logged with a
//    warning, listed in Unmonitored() and stays healthy;
//  - one thread, owned by the monitor and joined by Stop(), that waits with
//    nvmlEventSetWait_v2 and `wait_timeout` (so Stop() returns within about
//    one timeout). An event is classified (ClassifyEvent); an unhealthy
//    verdict marks its GPU unhealthy and restarts its recovery window. A wait
//    that answers 15 (a GPU of the set is lost, NVML does not say which)
//    probes every GPU with nvmlDeviceGetUUID: each that answers 15 is lost
//    for good; when none does, every GPU is marked unhealthy (as NVIDIA's
//    plugin does; they may recover). After each wait, GPUs whose recovery
//    window has passed become healthy again. Any other wait error is logged
//    (once per distinct code in a row); after any answer but an event or a
//    timeout the thread pauses one timeout, so it never spins.
//
// Events that change nothing (application Xids such as 13, which a
// workload can cause at will, skipped Xids, events of an unknown handle) are
// logged through a LogRateLimiter per GPU: at most kSkippedLogBurst lines in
// each kSkippedLogWindow of Options::clock, the rest counted as
// `suppressed=N` on the next line let through, or on an
// `event=health_event_skipped_suppressed gpu=... suppressed=N` line once the
// window is over (checked after every wait).
//
// Each change of health is reported at once, on the monitor's thread, to
// `on_change` with every GPU's health and what changed. The callback must not
// call Stop().
//
// Time is read from Options::clock (a kdm::Clock), so tests move the clock
// of the recovery window with a FakeClock. The waits are NVML's own
// (nvmlEventSetWait_v2 with wait_timeout), in real time.
//
// Thread-safety: Health(), Unmonitored() and Stop() may be called from any
// thread. The Api's functions are called from the monitor's thread (and the
// registration from Start's caller).
//
// Example:
//   HealthMonitor::Options o;
//   o.on_change = [&](const auto& health, const auto&) { Publish(health); };
//   auto m = HealthMonitor::Start(lib->api(), {{uuid, handle}}, std::move(o));
//   ...
//   (*m)->Stop();
#ifndef KDM_NVML_HEALTH_MONITOR_H_
#define KDM_NVML_HEALTH_MONITOR_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/nvml/health_rules.h"
#include "kdm/nvml/health_state.h"
#include "kdm/nvml/library.h"

namespace kdm::nvml {

struct MonitoredGpu {
  std::string uuid;
  DeviceHandle handle = nullptr;
};

struct HealthChange {
  std::string uuid;
  bool healthy = true;
  // "Xid 79", "double-bit ECC error", "GPU lost", "recovered after 30000ms
  // without a critical event", ...
  std::string reason;
};

class HealthMonitor {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  using ChangeCallback = std::function<void(const std::map<std::string, bool>& health,
                                            const std::vector<HealthChange>& changes)>;

  struct Options {
    HealthChecks checks;
    // The recovery window; nullopt: an unhealthy GPU stays unhealthy.
    std::optional<std::chrono::milliseconds> recovery;
    // The timeout of each nvmlEventSetWait_v2 (bounds Stop and the recovery
    // check's lateness).
    std::chrono::milliseconds wait_timeout{100};
    // The clock of the recovery window. Null is taken as NewRealClock() too.
    std::shared_ptr<Clock> clock = NewRealClock();
    ChangeCallback on_change;
  };

  // See above. `api` (whose functions must all be set) must outlive the
  // monitor. Errors: the event set cannot be created (the NVML error named),
  // or INVALID_ARGUMENT for a GPU listed twice.
  static StatusOr<std::unique_ptr<HealthMonitor>> Start(const Api& api,
                                                        std::vector<MonitoredGpu> gpus,
                                                        Options options);

  // Stop().
  ~HealthMonitor();
  HealthMonitor(const HealthMonitor&) = delete;
  HealthMonitor& operator=(const HealthMonitor&) = delete;

  // Ends the thread (within about one wait timeout), joins it, frees the
  // event set. Idempotent.
  void Stop();

  // Every GPU's health now.
  std::map<std::string, bool> Health() const;
  // The GPUs that could not register for events (sorted).
  std::vector<std::string> Unmonitored() const { return unmonitored_; }
  // Events the thread has received (any verdict).
  uint64_t EventsSeenForTest() const { return events_seen_.load(); }

 private:
  HealthMonitor(const Api& api, std::vector<MonitoredGpu> gpus, Options options);

  // Lines of events that change nothing, per GPU and window.
  static constexpr int kSkippedLogBurst = 5;
  static constexpr std::chrono::seconds kSkippedLogWindow{1};
  // The key of events whose handle is none of ours.
  static constexpr char kUnknownGpuKey[] = "*unknown*";

  void Run();
  // Handles one wait's answer at `now`; returns the changes.
  std::vector<HealthChange> OnWait(Return ret, const EventData& data, TimePoint now);
  std::vector<HealthChange> OnGpuLost();
  TimePoint Now() const;
  std::string Describe(Return ret) const;

  const Api& api_;
  const std::vector<MonitoredGpu> gpus_;
  const Options options_;
  EventSetHandle set_ = nullptr;
  std::vector<std::string> unmonitored_;
  std::atomic<uint64_t> events_seen_{0};
  // Touched by the monitor's thread only.
  LogRateLimiter skipped_log_{kSkippedLogBurst, kSkippedLogWindow};

  mutable Mutex mu_;
  HealthState state_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;

  // Set by Start, joined by Stop; touched by the owner's thread only.
  std::thread thread_;
  std::atomic<bool> stopped_{false};
};

}  // namespace kdm::nvml

#endif  // KDM_NVML_HEALTH_MONITOR_H_
