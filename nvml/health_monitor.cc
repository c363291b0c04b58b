#include "kdm/nvml/health_monitor.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "kdm/base/log_value.h"

namespace kdm::nvml {
namespace {

std::vector<std::string> Uuids(const std::vector<MonitoredGpu>& gpus) {
  std::vector<std::string> ids;
  ids.reserve(gpus.size());
  for (const MonitoredGpu& g : gpus) ids.push_back(g.uuid);
  return ids;
}

std::string Hex(unsigned long long v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%llx", v);
  return buf;
}

}  // namespace

HealthMonitor::HealthMonitor(const Api& api, std::vector<MonitoredGpu> gpus, Options options)
    : api_(api),
      gpus_(std::move(gpus)),
      options_(std::move(options)),
      state_(Uuids(gpus_), options_.recovery) {}

std::string HealthMonitor::Describe(Return ret) const {
  const char* text = api_.ErrorString ? api_.ErrorString(ret) : nullptr;
  std::string s = text && *text ? text : "NVML error";
  return s + " (NVML error " + std::to_string(ret) + ")";
}

HealthMonitor::TimePoint HealthMonitor::Now() const { return options_.clock->Now(); }

StatusOr<std::unique_ptr<HealthMonitor>> HealthMonitor::Start(const Api& api,
                                                              std::vector<MonitoredGpu> gpus,
                                                              Options options) {
  if (!options.clock) options.clock = NewRealClock();
  std::set<std::string> seen;
  for (const MonitoredGpu& g : gpus) {
    if (!seen.insert(g.uuid).second) {
      return InvalidArgumentError("GPU " + QuoteLogValue(g.uuid) + " is listed twice");
    }
  }
  std::unique_ptr<HealthMonitor> m(new HealthMonitor(api, std::move(gpus), std::move(options)));
  const HealthChecks& checks = m->options_.checks;
  if (checks.disabled) {
    spdlog::warn("event=health_checks_disabled env={} gpus={}", kDisableHealthChecksEnv,
                 m->gpus_.size());
    m->stopped_ = true;
    return m;
  }
  if (Return ret = api.EventSetCreate(&m->set_); ret != kSuccess) {
    m->set_ = nullptr;
    m->stopped_ = true;
    return Status(StatusCode::kUnavailable, "nvmlEventSetCreate: " + m->Describe(ret));
  }
  const unsigned long long wanted = EventMaskFor(checks);
  for (const MonitoredGpu& g : m->gpus_) {
    unsigned long long supported = 0;
    std::string problem;
    if (Return ret = api.DeviceGetSupportedEventTypes(g.handle, &supported); ret != kSuccess) {
      problem = "nvmlDeviceGetSupportedEventTypes: " + m->Describe(ret);
    } else if ((supported & wanted) == 0) {
      problem =
          "supports none of the event types " + Hex(wanted) + " (supported " + Hex(supported) + ")";
    } else if (Return reg = api.DeviceRegisterEvents(g.handle, supported & wanted, m->set_);
               reg != kSuccess) {
      problem = "nvmlDeviceRegisterEvents(" + Hex(supported & wanted) + "): " + m->Describe(reg);
    }
    if (!problem.empty()) {
      spdlog::warn("event=health_unmonitored gpu={} error={} action=stays_healthy",
                   QuoteLogValue(g.uuid), QuoteLogValue(problem));
      m->unmonitored_.push_back(g.uuid);
      continue;
    }
    spdlog::info("event=health_registered gpu={} events={}", QuoteLogValue(g.uuid),
                 Hex(supported & wanted));
  }
  std::sort(m->unmonitored_.begin(), m->unmonitored_.end());
  m->thread_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

HealthMonitor::~HealthMonitor() { Stop(); }

void HealthMonitor::Stop() {
  if (stopped_.exchange(true)) return;
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
  if (set_ != nullptr) {
    api_.EventSetFree(set_);
    set_ = nullptr;
  }
}

std::map<std::string, bool> HealthMonitor::Health() const {
  MutexLock lock(&mu_);
  return state_.Snapshot();
}

void HealthMonitor::Run() {
  Return last_error = kSuccess;
  const unsigned timeout_ms = static_cast<unsigned>(options_.wait_timeout.count());
  while (true) {
    {
      MutexLock lock(&mu_);
      if (stop_) return;
    }
    EventData data{};
    const Return ret = api_.EventSetWait_v2(set_, &data, timeout_ms);
    const TimePoint now = Now();
    std::vector<HealthChange> changes = OnWait(ret, data, now);
    for (const auto& [key, suppressed] : skipped_log_.Flush(now)) {
      if (key == kUnknownGpuKey) {
        spdlog::warn("event=health_event_unknown_gpu_suppressed suppressed={}", suppressed);
      } else {
        spdlog::info("event=health_event_skipped_suppressed gpu={} suppressed={}",
                     QuoteLogValue(key), suppressed);
      }
    }
    if (ret != kSuccess && ret != kErrorTimeout) {
      if (ret != last_error && ret != kErrorGpuIsLost) {
        spdlog::warn("event=health_wait_failed error={} action=retry",
                     QuoteLogValue("nvmlEventSetWait_v2: " + Describe(ret)));
      }
      last_error = ret;
      // Never spin on an error (NVML may answer 15 on every wait once a GPU
      // is lost): pause one timeout (Stop ends the pause).
      MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(Condition(&stop_), absl::FromChrono(options_.wait_timeout));
    } else {
      last_error = kSuccess;
    }
    if (changes.empty()) continue;
    std::map<std::string, bool> health;
    {
      MutexLock lock(&mu_);
      health = state_.Snapshot();
    }
    for (const HealthChange& c : changes) {
      if (c.healthy) {
        spdlog::info("event=gpu_healthy gpu={} reason={}", QuoteLogValue(c.uuid),
                     QuoteLogValue(c.reason));
      } else {
        spdlog::warn("event=gpu_unhealthy gpu={} reason={}", QuoteLogValue(c.uuid),
                     QuoteLogValue(c.reason));
      }
    }
    if (options_.on_change) options_.on_change(health, changes);
  }
}

std::vector<HealthChange> HealthMonitor::OnWait(Return ret, const EventData& data, TimePoint now) {
  std::vector<HealthChange> changes;
  if (ret == kSuccess) {
    events_seen_.fetch_add(1);
    const MonitoredGpu* gpu = nullptr;
    for (const MonitoredGpu& g : gpus_) {
      if (g.handle == data.device) gpu = &g;
    }
    HealthVerdict v = ClassifyEvent(options_.checks, data.event_type, data.event_data);
    // A workload causes application Xids at will: both lines are
    // rate-limited, and what they leave out is counted.
    if (gpu == nullptr) {
      if (std::optional<int64_t> suppressed = skipped_log_.Admit(kUnknownGpuKey, now)) {
        spdlog::warn(
            "event=health_event_unknown_gpu type={} data={} verdict={} action=ignore "
            "suppressed={}",
            Hex(data.event_type), data.event_data, QuoteLogValue(v.reason), *suppressed);
      }
    } else if (!v.unhealthy) {
      if (std::optional<int64_t> suppressed = skipped_log_.Admit(gpu->uuid, now)) {
        spdlog::info("event=health_event_skipped gpu={} reason={} suppressed={}",
                     QuoteLogValue(gpu->uuid), QuoteLogValue(v.reason), *suppressed);
      }
    } else {
      MutexLock lock(&mu_);
      StatusOr<bool> changed = state_.MarkUnhealthy(gpu->uuid, now);
      if (changed.ok() && *changed) changes.push_back({gpu->uuid, false, v.reason});
    }
  } else if (ret == kErrorGpuIsLost) {
    changes = OnGpuLost();
  }
  MutexLock lock(&mu_);
  for (std::string& id : state_.Recover(now)) {
    changes.push_back({std::move(id), true,
                       "recovered after " + std::to_string(options_.recovery->count()) +
                           "ms without a critical event"});
  }
  return changes;
}

std::vector<HealthChange> HealthMonitor::OnGpuLost() {
  std::vector<std::string> lost;
  for (const MonitoredGpu& g : gpus_) {
    char uuid[kUuidBufferSize] = {};
    if (api_.DeviceGetUUID(g.handle, uuid, kUuidBufferSize) == kErrorGpuIsLost) {
      lost.push_back(g.uuid);
    }
  }
  std::vector<HealthChange> changes;
  MutexLock lock(&mu_);
  if (lost.empty()) {
    // NVML said a GPU is lost but every probe answers: NVIDIA's plugin marks
    // every GPU unhealthy; they may recover with a window.
    spdlog::warn("event=gpu_lost_unnamed action=mark_all_unhealthy gpus={}", gpus_.size());
    const TimePoint now = Now();
    for (const MonitoredGpu& g : gpus_) {
      StatusOr<bool> changed = state_.MarkUnhealthy(g.uuid, now);
      if (changed.ok() && *changed) {
        changes.push_back({g.uuid, false, "a GPU was lost (NVML did not say which)"});
      }
    }
    return changes;
  }
  for (const std::string& id : lost) {
    StatusOr<bool> changed = state_.MarkLost(id);
    if (changed.ok() && *changed) changes.push_back({id, false, "GPU lost"});
  }
  return changes;
}

}  // namespace kdm::nvml
