// kdm::devicemanager::Metrics and MetricsServer: the Prometheus metrics of one
// node agent and the HTTP endpoint that serves them (docs/metrics.md lists
// every metric).
//
// Metrics keeps a prometheus-cpp registry (hidden). Events are observed as
// they happen (registrations, allocation durations, checkpoint writes); the
// kdm_* gauges and counters that mirror the Manager's state (capacity,
// endpoints, preferred-allocation outcomes, RPC errors) are collected from
// the Manager at scrape time by Render().
//
// MetricsServer serves HTTP/1.1 on HOST:PORT with one owned thread:
// GET /metrics (text exposition 0.0.4), GET /healthz ("ok"), 404 otherwise.
// Requests are bounded (header size, body size, read timeout).
//
// Thread-safety: every method of both classes may be called from any thread
// concurrently.
//
// Example:
//   auto metrics = kdm::devicemanager::Metrics::Create();
//   options.metrics = metrics;  // Manager::Options
//   auto server = kdm::devicemanager::MetricsServer::Start("127.0.0.1:0",
//                                                         metrics, manager.get());
//   if (!server.ok()) return Fail(server.status());
//   std::cout << "metrics on port " << (*server)->port() << "\n";
//   ...
//   (*server)->Stop();
#ifndef KDM_DEVICEMANAGER_METRICS_H_
#define KDM_DEVICEMANAGER_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kdm/base/status.h"

namespace kdm::devicemanager {

class Manager;

class Metrics {
 public:
  static std::shared_ptr<Metrics> Create();
  virtual ~Metrics() = default;

  // kubelet_device_plugin_registration_total{resource_name} += 1.
  virtual void ObserveRegistration(const std::string& resource) = 0;
  // kubelet_device_plugin_alloc_duration_seconds{resource_name}: one
  // allocation (the plugin's Allocate RPC) took `seconds`.
  virtual void ObserveAllocation(const std::string& resource, double seconds) = 0;
  // kdm_checkpoint_write_seconds: one checkpoint transaction took `seconds`.
  virtual void ObserveCheckpointWrite(double seconds) = 0;

  // The text exposition (format 0.0.4) of every metric. With a non-null
  // `manager`, first refreshes the kdm_* metrics from manager->GetStats()
  // and manager->GetCapacity().
  virtual std::string Render(const Manager* manager) = 0;

  // A counter kept by another part of the process (kdm kubelet --publish's
  // kdm_publish_annotation_too_large_total): `read` gives its value at each
  // Render (on the metrics server's thread), so it must stay valid while the
  // metrics are served. A name must be new.
  virtual void AddCounterSource(const std::string& name, const std::string& help,
                                std::function<uint64_t()> read) = 0;
};

class MetricsServer {
 public:
  // Listens on `host_port` ("127.0.0.1:9400", "[::1]:0", "localhost:0";
  // port 0 = any free port) and serves on one owned thread. `manager` may
  // be null; if not, it must outlive the server. Errors: INVALID_ARGUMENT
  // for a malformed address, UNAVAILABLE naming the address when it cannot
  // be bound.
  static StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& host_port,
                                                        std::shared_ptr<Metrics> metrics,
                                                        const Manager* manager);
  // Stops if running.
  virtual ~MetricsServer() = default;

  // The bound port (the real one when 0 was asked).
  virtual int port() const = 0;
  // Closes the listener and every connection, joins the thread. Idempotent.
  virtual void Stop() = 0;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_METRICS_H_
