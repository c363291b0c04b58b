// Metrics: a prometheus-cpp registry; the kdm_* families that mirror the
// Manager are refreshed from GetStats()/GetCapacity() at scrape time.
#include "kdm/devicemanager/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"

namespace kdm::devicemanager {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

// The kubelet's device_plugin_alloc_duration_seconds uses the default
// Prometheus buckets.
const Histogram::BucketBoundaries& AllocationBuckets() {
  static const Histogram::BucketBoundaries b = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                0.5,   1,    2.5,   5,    10};
  return b;
}
// A checkpoint transaction is an fsync'ed SQLite commit or a file rename:
// sub-millisecond to seconds on a sick disk.
const Histogram::BucketBoundaries& CheckpointBuckets() {
  static const Histogram::BucketBoundaries b = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                                0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5};
  return b;
}

// Raises a monotonic counter to `value` (a mirror of a ManagerStats field).
void RaiseTo(Counter& counter, double value) {
  double delta = value - counter.Value();
  if (delta > 0) counter.Increment(delta);
}

class MetricsImpl final : public Metrics {
 public:
  MetricsImpl()
      : registry_(std::make_shared<prometheus::Registry>()),
        registrations_(prometheus::BuildCounter()
                           .Name("kubelet_device_plugin_registration_total")
                           .Help("Cumulative number of device plugin registrations accepted, "
                                 "by resource.")
                           .Register(*registry_)),
        alloc_duration_(prometheus::BuildHistogram()
                            .Name("kubelet_device_plugin_alloc_duration_seconds")
                            .Help("Duration in seconds of the device plugin Allocate RPC, by "
                                  "resource.")
                            .Register(*registry_)),
        checkpoint_write_family_(prometheus::BuildHistogram()
                                     .Name("kdm_checkpoint_write_seconds")
                                     .Help("Duration in seconds of one checkpoint transaction.")
                                     .Register(*registry_)),
        checkpoint_write_(checkpoint_write_family_.Add({}, CheckpointBuckets())),
        preferred_(prometheus::BuildCounter()
                       .Name("kdm_preferred_allocation_total")
                       .Help("GetPreferredAllocation outcomes: ok (answer used), invalid (answer "
                             "rejected), rpc_error (call failed), taken (answer lost a race), "
                             "not_asked (not offered or no real choice).")
                       .Register(*registry_)),
        rpc_errors_(prometheus::BuildCounter()
                        .Name("kdm_plugin_rpc_errors_total")
                        .Help("Device plugin RPCs that failed, by method.")
                        .Register(*registry_)),
        registration_results_(prometheus::BuildCounter()
                                  .Name("kdm_registrations_total")
                                  .Help("Register calls, by result (accepted, rejected).")
                                  .Register(*registry_)),
        allocations_(prometheus::BuildCounter()
                         .Name("kdm_allocations_total")
                         .Help("(container, resource) allocations committed.")
                         .Register(*registry_)),
        allocation_failures_(prometheus::BuildCounter()
                                 .Name("kdm_allocation_failures_total")
                                 .Help("Allocate calls that returned an error.")
                                 .Register(*registry_)),
        checkpoint_errors_(prometheus::BuildCounter()
                               .Name("kdm_checkpoint_errors_total")
                               .Help("Checkpoint writes that failed.")
                               .Register(*registry_)),
        checkpoint_retries_(prometheus::BuildCounter()
                                .Name("kdm_checkpoint_retries_total")
                                .Help("Checkpoint writes tried again after a failure (the "
                                      "back-off runs from 100 ms to 5 s).")
                                .Register(*registry_)),
        snapshots_refused_(prometheus::BuildCounter()
                               .Name("kdm_snapshots_refused_total")
                               .Help("ListAndWatch messages dropped for breaking the snapshot "
                                     "limits (too many devices, too long a device id).")
                               .Register(*registry_)),
        restricted_rejections_(prometheus::BuildCounter()
                                   .Name("kdm_restricted_rejections_total")
                                   .Help("Allocations refused because the pod's namespace may "
                                         "not use a restricted resource.")
                                   .Register(*registry_)),
        resources_by_state_(prometheus::BuildGauge()
                                .Name("kdm_device_resources")
                                .Help("Device resources by state: serving (a healthy device), "
                                      "unhealthy (devices, none healthy: all unhealthy or the "
                                      "plugin is gone and the grace period runs), no_devices "
                                      "(known, no device advertised yet), removed (grace "
                                      "period expired).")
                                .Register(*registry_)),
        endpoints_by_state_(prometheus::BuildGauge()
                                .Name("kdm_plugin_endpoints")
                                .Help("Plugin endpoints by state: connected (a live "
                                      "ListAndWatch stream), stopped (the resource's last "
                                      "plugin went away; its grace period runs).")
                                .Register(*registry_)),
        capacity_(prometheus::BuildGauge()
                      .Name("kdm_resource_capacity_devices")
                      .Help("Devices of a resource, healthy or not (node capacity).")
                      .Register(*registry_)),
        allocatable_(prometheus::BuildGauge()
                         .Name("kdm_resource_allocatable_devices")
                         .Help("Healthy devices of a resource (node allocatable).")
                         .Register(*registry_)) {
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
    std::lock_guard<std::mutex> lock(render_mu_);
    if (manager != nullptr) Refresh(*manager);
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  }

 private:
  void Refresh(const Manager& manager) {
    const ManagerStats stats = manager.GetStats();
    RaiseTo(preferred_.Add({{"outcome", "ok"}}), static_cast<double>(stats.preferred_ok));
    RaiseTo(preferred_.Add({{"outcome", "invalid"}}), static_cast<double>(stats.preferred_invalid));
    RaiseTo(preferred_.Add({{"outcome", "rpc_error"}}),
            static_cast<double>(stats.preferred_rpc_error));
    RaiseTo(preferred_.Add({{"outcome", "taken"}}), static_cast<double>(stats.preferred_taken));
    RaiseTo(preferred_.Add({{"outcome", "not_asked"}}),
            static_cast<double>(stats.preferred_not_asked));
    for (const auto& [method, count] : stats.rpc_errors) {
      RaiseTo(rpc_errors_.Add({{"method", method}}), static_cast<double>(count));
    }
    RaiseTo(registration_results_.Add({{"result", "accepted"}}),
            static_cast<double>(stats.registrations_accepted));
    RaiseTo(registration_results_.Add({{"result", "rejected"}}),
            static_cast<double>(stats.registrations_rejected));
    RaiseTo(allocations_.Add({}), static_cast<double>(stats.allocations));
    RaiseTo(allocation_failures_.Add({}), static_cast<double>(stats.allocation_failures));
    RaiseTo(checkpoint_errors_.Add({}), static_cast<double>(stats.checkpoint_errors));
    RaiseTo(checkpoint_retries_.Add({}), static_cast<double>(stats.checkpoint_retries));
    RaiseTo(snapshots_refused_.Add({}), static_cast<double>(stats.snapshots_refused));
    RaiseTo(restricted_rejections_.Add({}), static_cast<double>(stats.restricted_rejections));
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
      capacity_.Remove(&capacity_.Add({{"resource_name", gone}}));
      allocatable_.Remove(&allocatable_.Add({{"resource_name", gone}}));
    }
    shown_resources_ = std::move(present);
  }

  const std::shared_ptr<prometheus::Registry> registry_;
  Family<Counter>& registrations_;
  Family<Histogram>& alloc_duration_;
  Family<Histogram>& checkpoint_write_family_;
  Histogram& checkpoint_write_;
  Family<Counter>& preferred_;
  Family<Counter>& rpc_errors_;
  Family<Counter>& registration_results_;
  Family<Counter>& allocations_;
  Family<Counter>& allocation_failures_;
  Family<Counter>& checkpoint_errors_;
  Family<Counter>& checkpoint_retries_;
  Family<Counter>& snapshots_refused_;
  Family<Counter>& restricted_rejections_;
  Family<Gauge>& resources_by_state_;
  Family<Gauge>& endpoints_by_state_;
  Family<Gauge>& capacity_;
  Family<Gauge>& allocatable_;

  std::mutex render_mu_;                   // one Refresh at a time
  std::set<std::string> shown_resources_;  // guarded by render_mu_
};

}  // namespace

std::shared_ptr<Metrics> Metrics::Create() { return std::make_shared<MetricsImpl>(); }

}  // namespace kdm::devicemanager
