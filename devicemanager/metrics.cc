// Metrics: an http::MetricRegistry; the kdm_* families that mirror the
// Manager are refreshed from GetStats()/GetCapacity() at scrape time.
#include "kdm/devicemanager/metrics.h"

#include <map>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/http/metrics.h"

namespace kdm::devicemanager {
namespace {

// The kubelet's device_plugin_alloc_duration_seconds uses the default
// Prometheus buckets.
const std::vector<double>& AllocationBuckets() {
  static const std::vector<double> b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
  return b;
}
// A checkpoint transaction is an fsync'ed SQLite commit or a file rename:
// sub-millisecond to seconds on a sick disk.
const std::vector<double>& CheckpointBuckets() {
  static const std::vector<double> b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                        0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
  return b;
}

class MetricsImpl final : public Metrics {
 public:
  MetricsImpl()
      : registrations_(
            registry_.AddCounter("kubelet_device_plugin_registration_total",
                                 "Cumulative number of device plugin registrations accepted, "
                                 "by resource.")),
        alloc_duration_(
            registry_.AddHistogram("kubelet_device_plugin_alloc_duration_seconds",
                                   "Duration in seconds of the device plugin Allocate RPC, by "
                                   "resource.")),
        checkpoint_write_family_(registry_.AddHistogram(
            "kdm_checkpoint_write_seconds", "Duration in seconds of one checkpoint transaction.")),
        checkpoint_write_(checkpoint_write_family_.Add({}, CheckpointBuckets())),
        preferred_(registry_.AddCounter(
            "kdm_preferred_allocation_total",
            "GetPreferredAllocation outcomes: ok (answer used), invalid (answer "
            "rejected), rpc_error (call failed), taken (answer lost a race), "
            "not_asked (not offered or no real choice).")),
        rpc_errors_(registry_.AddCounter("kdm_plugin_rpc_errors_total",
                                         "Device plugin RPCs that failed, by method.")),
        registration_results_(registry_.AddCounter(
            "kdm_registrations_total", "Register calls, by result (accepted, rejected).")),
        allocations_(registry_.AddCounter("kdm_allocations_total",
                                          "(container, resource) allocations committed.")),
        allocation_failures_(registry_.AddCounter("kdm_allocation_failures_total",
                                                  "Allocate calls that returned an error.")),
        checkpoint_errors_(
            registry_.AddCounter("kdm_checkpoint_errors_total", "Checkpoint writes that failed.")),
        checkpoint_retries_(
            registry_.AddCounter("kdm_checkpoint_retries_total",
                                 "Checkpoint writes tried again after a failure (the "
                                 "back-off runs from 100 ms to 5 s).")),
        snapshots_refused_(
            registry_.AddCounter("kdm_snapshots_refused_total",
                                 "ListAndWatch messages dropped for breaking the snapshot "
                                 "limits (too many devices, too long a device id).")),
        restricted_rejections_(
            registry_.AddCounter("kdm_restricted_rejections_total",
                                 "Allocations refused because the pod's namespace may "
                                 "not use a restricted resource.")),
        resources_by_state_(
            registry_.AddGauge("kdm_device_resources",
                               "Device resources by state: serving (a healthy device), "
                               "unhealthy (devices, none healthy: all unhealthy or the "
                               "plugin is gone and the grace period runs), no_devices "
                               "(known, no device advertised yet), removed (grace "
                               "period expired).")),
        endpoints_by_state_(registry_.AddGauge("kdm_plugin_endpoints",
                                               "Plugin endpoints by state: connected (a live "
                                               "ListAndWatch stream), stopped (the resource's last "
                                               "plugin went away; its grace period runs).")),
        capacity_(registry_.AddGauge("kdm_resource_capacity_devices",
                                     "Devices of a resource, healthy or not (node capacity).")),
        allocatable_(registry_.AddGauge("kdm_resource_allocatable_devices",
                                        "Healthy devices of a resource (node allocatable).")) {
    for (const char* outcome : {"ok", "invalid", "rpc_error", "taken", "not_asked"}) {
      preferred_.Add({{"outcome", outcome}});
    }
    for (const char* result : {"accepted", "rejected"}) {
      registration_results_.Add({{"result", result}});
    }
    for (const char* state : {"serving", "unhealthy", "no_devices", "removed"}) {
      resources_by_state_.Add({{"state", state}});
    }
    for (const char* state : {"connected", "stopped"}) endpoints_by_state_.Add({{"state", state}});
    allocations_.Add({});
    allocation_failures_.Add({});
    checkpoint_errors_.Add({});
    checkpoint_retries_.Add({});
    snapshots_refused_.Add({});
    restricted_rejections_.Add({});
  }

  void ObserveRegistration(const std::string& resource) override {
    registrations_.Add({{"resource_name", resource}}).Increment();
  }

  void ObserveAllocation(const std::string& resource, double seconds) override {
    alloc_duration_.Add({{"resource_name", resource}}, AllocationBuckets()).Observe(seconds);
  }

  void ObserveCheckpointWrite(double seconds) override { checkpoint_write_.Observe(seconds); }

  std::string Render(const Manager* manager) override {
    kdm::MutexLock lock(&render_mu_);
    if (manager != nullptr) Refresh(*manager);
    for (const CounterSource& s : counter_sources_)
      s.counter.RaiseTo(static_cast<double>(s.read()));
    return registry_.Text();
  }

  void AddCounterSource(const std::string& name, const std::string& help,
                        std::function<uint64_t()> read) override {
    kdm::MutexLock lock(&render_mu_);
    counter_sources_.push_back({registry_.AddCounter(name, help).Add({}), std::move(read)});
  }

 private:
  void Refresh(const Manager& manager) ABSL_EXCLUSIVE_LOCKS_REQUIRED(render_mu_) {
    const ManagerStats stats = manager.GetStats();
    preferred_.Add({{"outcome", "ok"}}).RaiseTo(static_cast<double>(stats.preferred_ok));
    preferred_.Add({{"outcome", "invalid"}}).RaiseTo(static_cast<double>(stats.preferred_invalid));
    preferred_.Add({{"outcome", "rpc_error"}})
        .RaiseTo(static_cast<double>(stats.preferred_rpc_error));
    preferred_.Add({{"outcome", "taken"}}).RaiseTo(static_cast<double>(stats.preferred_taken));
    preferred_.Add({{"outcome", "not_asked"}})
        .RaiseTo(static_cast<double>(stats.preferred_not_asked));
    for (const auto& [method, count] : stats.rpc_errors) {
      rpc_errors_.Add({{"method", method}}).RaiseTo(static_cast<double>(count));
    }
    registration_results_.Add({{"result", "accepted"}})
        .RaiseTo(static_cast<double>(stats.registrations_accepted));
    registration_results_.Add({{"result", "rejected"}})
        .RaiseTo(static_cast<double>(stats.registrations_rejected));
    allocations_.Add({}).RaiseTo(static_cast<double>(stats.allocations));
    allocation_failures_.Add({}).RaiseTo(static_cast<double>(stats.allocation_failures));
    checkpoint_errors_.Add({}).RaiseTo(static_cast<double>(stats.checkpoint_errors));
    checkpoint_retries_.Add({}).RaiseTo(static_cast<double>(stats.checkpoint_retries));
    snapshots_refused_.Add({}).RaiseTo(static_cast<double>(stats.snapshots_refused));
    restricted_rejections_.Add({}).RaiseTo(static_cast<double>(stats.restricted_rejections));
    for (const auto& [state, n] : stats.endpoints_by_state) {
      endpoints_by_state_.Add({{"state", state}}).Set(static_cast<double>(n));
    }

    const CapacityReport capacity = manager.GetCapacity();
    std::map<std::string, double> states = {
        {"serving", 0}, {"unhealthy", 0}, {"no_devices", 0}, {"removed", 0}};
    std::set<std::string> present;
    for (const auto& [resource, amounts] : capacity.resources) {
      present.insert(resource);
      capacity_.Add({{"resource_name", resource}}).Set(static_cast<double>(amounts.capacity));
      allocatable_.Add({{"resource_name", resource}}).Set(static_cast<double>(amounts.allocatable));
      if (amounts.allocatable > 0) {
        states["serving"]++;
      } else if (amounts.capacity > 0) {
        states["unhealthy"]++;
      } else {
        states["no_devices"]++;
      }
    }
    for (const std::string& resource : capacity.deleted) {
      if (present.count(resource) == 0) states["removed"]++;
    }
    for (const auto& [state, n] : states) resources_by_state_.Add({{"state", state}}).Set(n);
    // A resource that left the report leaves the exposition too.
    for (const std::string& gone : shown_resources_) {
      if (present.count(gone) != 0) continue;
      capacity_.Remove({{"resource_name", gone}});
      allocatable_.Remove({{"resource_name", gone}});
    }
    shown_resources_ = std::move(present);
  }

  http::MetricRegistry registry_;
  const http::CounterFamily registrations_;
  const http::HistogramFamily alloc_duration_;
  const http::HistogramFamily checkpoint_write_family_;
  const http::Histogram checkpoint_write_;
  const http::CounterFamily preferred_;
  const http::CounterFamily rpc_errors_;
  const http::CounterFamily registration_results_;
  const http::CounterFamily allocations_;
  const http::CounterFamily allocation_failures_;
  const http::CounterFamily checkpoint_errors_;
  const http::CounterFamily checkpoint_retries_;
  const http::CounterFamily snapshots_refused_;
  const http::CounterFamily restricted_rejections_;
  const http::GaugeFamily resources_by_state_;
  const http::GaugeFamily endpoints_by_state_;
  const http::GaugeFamily capacity_;
  const http::GaugeFamily allocatable_;

  kdm::Mutex render_mu_;  // one Refresh at a time
  struct CounterSource {
    http::Counter counter;
    std::function<uint64_t()> read;
  };
  std::vector<CounterSource> counter_sources_ ABSL_GUARDED_BY(render_mu_);
  std::set<std::string> shown_resources_ ABSL_GUARDED_BY(render_mu_);
};

}  // namespace

std::shared_ptr<Metrics> Metrics::Create() { return std::make_shared<MetricsImpl>(); }

}  // namespace kdm::devicemanager
