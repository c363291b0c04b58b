// kdm::kube::Publisher: the loop behind `kdm publish` (docs/publish.md). It
// polls a DeviceSource (the node's pod-resources API), builds the
// kdm.io/devices annotation and hands it to an AnnotationWriter (a PATCH of
// the Node object, or anything else) following three rules:
//   - dedupe: a value is written only when it differs from the last value
//     written successfully (the `updated` time does not count);
//   - rate limit: at most one write attempt per min_write_interval, however
//     fast the devices change; the newest value wins;
//   - resync: the value is written again resync after the last successful
//     write, changed or not.
// A source or writer that fails never stops the loop: the failure is logged
// (a write failure is retried at the next poll, still at most once per
// min_write_interval) and polling goes on. A successful write is logged at
// info: the first as event=first_publish, later ones as
// event=publish_written (node, resources, devices, in_use, bytes) at most
// kWrittenLogBurst a minute, the rest at debug and counted in the next
// line's suppressed=N.
//
// Time comes from Options::clock (a kdm::Clock): intervals from Now(), the
// annotation's `updated` from WallNow(), and Run()'s waits between polls are
// the clock's SleepFor(), so a FakeClock drives Step() and Run() alike.
//
// Thread-safety: Step() and Run() from one thread at a time; Stop() from
// any thread. The source and writer are called from that one thread.
//
// Example:
//   kdm::kube::Publisher p(options, &source, &writer);  // options.clock: the real one
//   std::thread loop([&] { p.Run(); });
//   ...
//   p.Stop();
//   loop.join();
#ifndef KDM_KUBE_PUBLISHER_H_
#define KDM_KUBE_PUBLISHER_H_

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/status.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::kube {

// What one poll of the node reads.
struct NodeDevices {
  // Resource -> allocatable (healthy) device id -> NUMA node.
  std::map<std::string, std::map<std::string, std::optional<int>>> allocatable;
  // Resource -> every device id some container holds.
  std::map<std::string, std::set<std::string>> in_use;
  // (namespace, name) of every pod at least one of whose containers holds a
  // device of any resource.
  std::set<std::pair<std::string, std::string>> holders;
};

// Builds the annotation of `devices`. Published resources: every resource
// with allocatable devices, plus every one named in `topologies` or
// `attributes` (with no devices if none is allocatable); a resource named
// only in `policies` is not published. Each topology's device ids must
// already be the resource's device ids. `pods` is always set: the
// fingerprints of `devices.holders` (empty when no pod holds a device).
// `policies` gives a published resource its `policy`. `warnings` (when
// given) receives one line per resource published without its matrix.
k8s::DevicesAnnotation BuildDevicesAnnotation(
    const std::string& node, const std::string& updated, const NodeDevices& devices,
    const std::map<std::string, topology::Topology>& topologies,
    const std::map<std::string, k8s::DeviceAttributes>& attributes,
    std::vector<std::string>* warnings = nullptr,
    const std::map<std::string, topology::Policy>& policies = {});

class DeviceSource {
 public:
  virtual ~DeviceSource() = default;
  // One reading of the node; an error (the socket is gone, a deadline) skips
  // this poll.
  virtual StatusOr<NodeDevices> Read() = 0;
};

class AnnotationWriter {
 public:
  virtual ~AnnotationWriter() = default;
  // Stores `value` as the kdm.io/devices annotation of Node `node`. An error
  // is retried later with the then newest value.
  virtual Status Write(const std::string& node, const std::string& value) = 0;
};

class Publisher {
 public:
  struct Options {
    std::string node;  // the Node object's name
    // Resource -> its matrix (--topology). A resource the node does not
    // have is left out (warned once) until a read has it.
    std::map<std::string, topology::Topology> topologies;
    std::map<std::string, k8s::DeviceAttributes> attributes;
    // Resource -> the policy of the node's device plugin (`policy`).
    std::map<std::string, topology::Policy> policies;
    std::chrono::milliseconds interval{std::chrono::seconds(1)};
    std::chrono::milliseconds min_write_interval{std::chrono::seconds(1)};
    std::chrono::milliseconds resync{std::chrono::minutes(5)};
    // The time seam. Null is taken as NewRealClock() too.
    std::shared_ptr<kdm::Clock> clock = NewRealClock();
  };

  enum class StepResult {
    kWritten,      // the writer took a new (or resynced) value
    kUnchanged,    // same value as the last one written, resync not due
    kRateLimited,  // a write is due but the last attempt was too recent
    kReadFailed,   // the source failed; nothing written
    kWriteFailed,  // the writer failed; retried at a later poll
  };

  // REQUIRES: source and writer outlive the Publisher.
  Publisher(Options options, DeviceSource* source, AnnotationWriter* writer);

  // One poll: read, build, and write when the rules above say so.
  StepResult Step();

  // Step() every `interval` of the clock until Stop(). Returns within about
  // one source/writer call after Stop().
  void Run();
  // Makes Run() return. Idempotent; any thread.
  void Stop();

  // Counters, for tests and logs (Step's thread, or after Run returned).
  int writes() const { return writes_; }
  int write_failures() const { return write_failures_; }
  // The last value written successfully ("" before the first).
  const std::string& last_written() const { return last_written_; }

 private:
  const Options options_;
  DeviceSource* const source_;
  AnnotationWriter* const writer_;
  const std::shared_ptr<kdm::Clock> clock_;

  // Step's thread only.
  std::optional<std::string> last_content_;  // encoded with `updated` empty
  std::string last_written_;
  std::optional<std::chrono::steady_clock::time_point> last_success_;
  std::optional<std::chrono::steady_clock::time_point> last_attempt_;
  std::set<std::string> warned_;
  // --topology resources the node did not have at the last read.
  std::set<std::string> missing_topologies_;
  bool read_failing_ = false;
  bool write_failing_ = false;
  int writes_ = 0;
  int write_failures_ = 0;
  // event=publish_written at info: kWrittenLogBurst a minute (on the clock).
  static constexpr int kWrittenLogBurst = 6;
  LogRateLimiter written_log_{kWrittenLogBurst, std::chrono::seconds(60)};

  Wakeup stop_;  // Stop() wakes it: ends Run()'s wait

  // Logs a successful write: event=first_publish for the first, then
  // event=publish_written (rate-limited). Step's thread.
  void LogWritten(const NodeDevices& devices, bool resync,
                  std::chrono::steady_clock::time_point now);
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_PUBLISHER_H_
