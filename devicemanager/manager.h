// kdm::devicemanager::Manager: the device manager an embedder (a node agent)
// drives: device plugins register with it over gRPC, it tracks which devices
// are healthy and which container holds which, survives restarts through a
// checkpoint Store, and hands the container runtime the env vars, mounts,
// device nodes and CDI names for each container.
//
// The Manager serves the device plugin Registration service on
// <plugin_dir>/kubelet.sock and keeps one endpoint (a gRPC client with a
// ListAndWatch stream) per registered plugin socket. Admission (Allocate)
// follows the kubelet's rules and texts (docs/kubelet-rules.md), with kdm's
// promises (docs/promises.md): every plugin RPC has a deadline, devices are
// reserved while the RPCs run and released on every failure path, preferred
// answers are validated, merges are deterministic, every change is one
// checkpoint transaction, and a reboot does not resurrect stale allocations.
//
// Thread-safety: every method may be called from any thread concurrently.
// One internal mutex guards the state; it is never held across a plugin RPC,
// so a hung plugin delays only the pods that use it. The active_pods and
// boot_id_provider callbacks are invoked without that mutex held, on the
// thread that calls Start() or UpdateAllocatedDevices(). Subscribe()
// callbacks run on one thread of the Manager's own, the delivery thread
// (started by Create, joined by Stop), never on the embedder's threads: an
// embedder with its own event loop posts from the callback to its loop.
// Every callback may call the Manager's query methods but must not call
// Stop(); a Subscribe() callback must not call Subscribe() or Unsubscribe().
// docs/architecture.md#threading-model lists every thread, and
// #driving-the-manager-from-an-event-loop which calls block and how long.
//
// Example:
//   kdm::devicemanager::Manager::Options options;
//   options.plugin_dir = "/var/lib/kubelet/device-plugins";
//   options.active_pods = [&] { return agent.ActivePodUids(); };
//   auto manager = kdm::devicemanager::Manager::Create(std::move(options));
//   if (!manager.ok()) return Fail(manager.status());
//   if (auto s = (*manager)->Start(); !s.ok()) return Fail(s);
//   if (auto s = (*manager)->Allocate(pod, "main"); !s.ok()) Reject(pod, s.message());
//   auto run = (*manager)->GetDeviceRunContainerOptions(pod, "main");
//   ...
//   (*manager)->Stop();
#ifndef KDM_DEVICEMANAGER_MANAGER_H_
#define KDM_DEVICEMANAGER_MANAGER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/clock.h"
#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/metrics.h"
#include "kdm/devicemanager/pod.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::devicemanager {

// One mount, device node or CDI device for the container runtime.
struct Mount {
  std::string container_path;
  std::string host_path;
  bool read_only = false;
  friend bool operator==(const Mount&, const Mount&) = default;
};
struct DeviceSpec {
  std::string container_path;
  std::string host_path;
  std::string permissions;  // cgroup permissions from "r", "w", "m"
  friend bool operator==(const DeviceSpec&, const DeviceSpec&) = default;
};

// The merged allocate responses of every device resource of one container
// (docs/kubelet-rules.md#run-options, docs/promises.md#deterministic-merges):
// envs by name, mounts and device specs by container path, annotations by
// key, CDI devices de-duplicated by name.
// Resources are merged in resource-name order; on a conflict the first
// resource's value is kept and the conflict is listed in `conflicts`.
struct RunContainerOptions {
  std::map<std::string, std::string> envs;
  std::vector<Mount> mounts;        // sorted by container path
  std::vector<DeviceSpec> devices;  // sorted by container path
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cdi_devices;  // in merge order
  // One line per conflict, e.g. `env "X": vendor.com/b's value ignored,
  // vendor.com/a's kept`.
  std::vector<std::string> conflicts;
};

// One container's recorded devices and the run options merged from their
// allocate responses, read together (Manager::GetContainerAllocation).
struct ContainerAllocation {
  // Resource -> device ids (sorted).
  std::map<std::string, std::vector<std::string>> devices;
  RunContainerOptions run;
};

struct CapacityReport {
  // capacity = healthy + unhealthy; allocatable = healthy
  // (docs/kubelet-rules.md#capacity).
  struct Amounts {
    int64_t capacity = 0;
    int64_t allocatable = 0;
    friend bool operator==(const Amounts&, const Amounts&) = default;
  };
  std::map<std::string, Amounts> resources;
  // Resources whose grace period expired (and not registered since).
  std::vector<std::string> deleted;
};

// A NUMA topology hint for one resource.
struct TopologyHint {
  std::vector<int64_t> numa_nodes;  // sorted
  bool preferred = false;
  friend bool operator==(const TopologyHint&, const TopologyHint&) = default;
};
// Per resource: std::nullopt = no preference (no device has topology); an
// empty vector = no placement can satisfy the request.
using TopologyHints = std::map<std::string, std::optional<std::vector<TopologyHint>>>;

// Devices of one resource on one NUMA node, as the pod-resources API reports
// them (one entry per NUMA node; devices without topology: numa_node empty).
struct ContainerDevices {
  std::string resource_name;
  std::vector<std::string> device_ids;
  std::optional<int64_t> numa_node;
  friend bool operator==(const ContainerDevices&, const ContainerDevices&) = default;
};

// A device whose health changed, as seen in a ListAndWatch snapshot (or all
// devices of a resource whose plugin went away, or whose grace expired).
struct DeviceHealthEvent {
  std::string resource_name;
  std::string device_id;
  bool healthy = false;
  friend bool operator==(const DeviceHealthEvent&, const DeviceHealthEvent&) = default;
};

// Counters, each exported as a Prometheus metric (docs/metrics.md). Monotonic.
struct ManagerStats {
  int64_t registrations_accepted = 0;
  int64_t registrations_rejected = 0;
  // GetPreferredAllocation outcomes.
  int64_t preferred_ok = 0;         // answer validated and used
  int64_t preferred_invalid = 0;    // answer rejected, kdm's choice used
  int64_t preferred_rpc_error = 0;  // RPC failed, kdm's choice used
  int64_t preferred_not_asked = 0;  // plugin does not offer it, or no real choice
  int64_t preferred_taken = 0;      // valid answer lost a race, kdm's choice used
  // Plugin RPC errors by method name ("Allocate", "ListAndWatch", ...).
  std::map<std::string, int64_t> rpc_errors;
  int64_t allocations = 0;          // (container, resource) allocations committed
  int64_t allocation_failures = 0;  // Allocate() calls that returned an error
  int64_t checkpoint_errors = 0;    // store writes that failed
  // Retries of checkpoint writes that failed after a snapshot, a stream end
  // or a grace expiry (those are kept pending and retried until they land;
  // docs/architecture.md "Error policy").
  int64_t checkpoint_retries = 0;
  // ListAndWatch messages dropped for breaking the snapshot limits (more than
  // 100,000 devices, or a device id longer than 253 bytes).
  int64_t snapshots_refused = 0;
  // Allocate() calls refused by Options::restrictions.
  int64_t restricted_rejections = 0;
  // Not a counter: plugin endpoints now, by state. "connected": a live
  // ListAndWatch stream; "stopped": the resource's last endpoint went away
  // and its grace period runs.
  std::map<std::string, int64_t> endpoints_by_state;
};

class Manager {
 public:
  struct Options {
    // Directory of kubelet.sock and the plugins' sockets (created 0750). A
    // relative path is made absolute by Create, against the working
    // directory then; <plugin_dir>/kubelet.sock must fit a unix socket path.
    std::string plugin_dir = std::string(pluginapi::kDevicePluginPath);
    // Where allocations live across restarts. Null: an in-memory store.
    std::shared_ptr<checkpoint::Store> store;
    // Deadline of dialing a plugin, GetDevicePluginOptions, and the wait for
    // its first ListAndWatch message (each).
    std::chrono::milliseconds registration_timeout{pluginapi::kDialTimeout};
    // Deadline of GetPreferredAllocation and Allocate.
    std::chrono::milliseconds rpc_timeout{10'000};
    // Deadline of PreStartContainer.
    std::chrono::milliseconds pre_start_timeout{pluginapi::kPreStartContainerTimeout};
    // How long a resource whose last plugin disconnected stays (unhealthy)
    // before it is removed from capacity.
    std::chrono::milliseconds grace_period{std::chrono::minutes(5)};
    // The uids of the pods that are active now; used by
    // UpdateAllocatedDevices() and after a reboot. Null: no pod is active.
    std::function<std::set<std::string>()> active_pods;
    // The time seam: the grace period, checkpoint retries and log summaries
    // are its timers (docs/architecture.md#timers-on-your-loop). Null is taken
    // as NewRealClock() too.
    std::shared_ptr<Clock> clock = NewRealClock();
    // The OS seam: the plugin directory (creation, mode, stale sockets) and
    // the boot id. Not owned; must outlive the Manager.
    Env* env = Env::Default();
    // Null: env->ReadBootId().
    std::function<StatusOr<std::string>()> boot_id_provider;
    // NUMA alignment without a topology manager. Off (the kubelet's default,
    // topology manager policy "none"): candidates in device order. On: for each
    // resource the Manager takes the preferred topology hint with the fewest,
    // then lowest, NUMA nodes (docs/kubelet-rules.md#topology-hints), and
    // devices on those nodes are offered first (only those, to
    // GetPreferredAllocation, when they suffice).
    bool align_numa = false;
    // Where registrations, Allocate durations and checkpoint write times are
    // reported (docs/metrics.md). Null: nowhere.
    std::shared_ptr<Metrics> metrics;
    // The largest message accepted from a plugin, in bytes (4 MiB). A bigger
    // ListAndWatch message ends that plugin's stream (gRPC refuses it with
    // RESOURCE_EXHAUSTED before buffering it): the plugin counts as
    // disconnected, its devices turn unhealthy (capacity kept) and the grace
    // period runs, as for any stream end. At least 4096.
    int max_plugin_message_bytes = 4 << 20;
    // Register calls handled at once (each may wait for its plugin up to
    // registration_timeout). A call beyond them waits for a slot, holding no
    // thread. At least 1.
    int max_registrations_in_flight = 16;
    // Register calls waiting for one of those slots (a node agent restart
    // makes every plugin register at once); one more is answered
    // RESOURCE_EXHAUSTED `too many Register calls (16 in flight, 256
    // waiting, the limits); try again later` at once. At least 0.
    int max_registrations_waiting = 256;
    // The longest a Register call waits for a slot (less when its own
    // deadline is sooner); then RESOURCE_EXHAUSTED `waited 5000ms for one of
    // 16 Register slots (all held by calls in flight); try again later`.
    // Shorter than the SDK's Register deadline (10 s). Positive.
    std::chrono::milliseconds registration_wait{5'000};
    // Admission restrictions: resource name -> the namespaces whose pods may
    // use it. Allocate() refuses (PERMISSION_DENIED, before any device is
    // reserved) every container of a pod outside the list when any container
    // of that pod asks for the resource: `resource "<r>" is restricted to
    // namespaces <a>, <b>; pod namespace "<ns>" is not allowed`. Keys must be
    // extended resource names, lists non-empty DNS-1123 labels. Empty: no
    // restriction.
    std::map<std::string, std::set<std::string>> restrictions;
  };

  using HealthCallback = std::function<void(const std::vector<DeviceHealthEvent>& events)>;

  // Validates `options` (no I/O). INVALID_ARGUMENT naming the bad field.
  static StatusOr<std::unique_ptr<Manager>> Create(Options options);

  // Stops if running.
  virtual ~Manager() = default;

  // Creates the plugin directory, restores the checkpoint (allocations, and
  // each registered resource with no devices until its plugin registers;
  // after a reboot only allocations of active pods), removes every plugin
  // socket so plugins re-register, and serves Registration. Errors: the
  // directory or the store is unusable, Registration cannot be served,
  // Start called twice.
  virtual Status Start() = 0;
  // Stops serving, closes every endpoint, cancels timers, joins every
  // thread. Idempotent; also safe without Start().
  virtual void Stop() = 0;

  // For a shutdown that must not wait for a hung plugin: cancels every
  // plugin RPC in flight (GetPreferredAllocation, Allocate,
  // PreStartContainer) and fails every later Allocate,
  // GetDeviceRunContainerOptions and GetContainerAllocation that needs a
  // plugin with CANCELLED, at once; nothing is reserved or recorded for
  // them. A registration in flight (its GetDevicePluginOptions, its wait for
  // the first device list) fails with CANCELLED too, and later ones are
  // refused; ListAndWatch streams are left to Stop(). Returns how many RPCs
  // were in flight. Idempotent; call Stop() afterwards.
  virtual int CancelPluginCalls() = 0;

  // Allocates devices for every device resource in `container`'s limits
  // (docs/kubelet-rules.md#allocation: its rules and texts). OK when nothing is
  // needed. On error no device stays reserved and nothing is recorded for the
  // failing resource.
  virtual Status Allocate(const Pod& pod, const std::string& container) = 0;

  // Merged run options of the container's recorded devices; calls
  // PreStartContainer (with its deadline) for every resource whose plugin
  // asks for it. Errors: PreStartContainer failed, its endpoint stopped.
  virtual StatusOr<RunContainerOptions> GetDeviceRunContainerOptions(
      const Pod& pod, const std::string& container) = 0;

  // The container's recorded devices and the run options merged from them,
  // in one call: the devices are exactly those the options come from.
  // Calls PreStartContainer as GetDeviceRunContainerOptions does; the same
  // errors. A container with no devices: empty devices and run options.
  virtual StatusOr<ContainerAllocation> GetContainerAllocation(const Pod& pod,
                                                               const std::string& container) = 0;

  // OK when every extended resource that a container of `pod` asks for (a
  // non-zero limit) is registered, possibly with no devices yet; otherwise
  // FAILED_PRECONDITION `cannot allocate unregistered device <r>` for the
  // first such resource in name order. Allocate skips a resource that no
  // plugin registered, as the kubelet's device manager does (the kubelet
  // then refuses the pod for lack of the resource on the node); an agent
  // without that node-level check calls this before Allocate.
  virtual Status CheckResourcesRegistered(const Pod& pod) const = 0;

  virtual CapacityReport GetCapacity() const = 0;

  // Garbage collection: drops the devices of pods the active_pods callback
  // does not list.
  virtual Status UpdateAllocatedDevices() = 0;
  // Drops every device record of the pod.
  virtual Status RemovePod(const std::string& pod_uid) = 0;

  virtual StatusOr<TopologyHints> GetTopologyHints(const Pod& pod,
                                                   const std::string& container) const = 0;
  virtual StatusOr<TopologyHints> GetPodTopologyHints(const Pod& pod) const = 0;

  // Healthy devices of every resource (pod-resources GetAllocatableResources).
  virtual std::vector<ContainerDevices> GetAllocatableDevices() const = 0;
  // Devices recorded for one container (pod-resources List/Get).
  virtual std::vector<ContainerDevices> GetDevices(const std::string& pod_uid,
                                                   const std::string& container) const = 0;
  // Pod uids with recorded devices, sorted.
  virtual std::vector<std::string> GetPodsWithDevices() const = 0;

  // Calls `callback` with every batch of device health changes that the
  // Manager takes in after Subscribe() was called (none from before, even
  // if still undelivered). Returns an id for Unsubscribe(); after
  // Unsubscribe returns the callback is not running and will not run again.
  //
  // Order: changes are delivered in the order the Manager took them in
  // (snapshot order per resource, and one order across resources), on the
  // delivery thread, one callback at a time; a batch holds every change
  // still undelivered when the thread came round (the changes of one or
  // more snapshots, in order).
  //
  // Bound: while callbacks are slow the undelivered changes wait in one
  // queue. When it holds more than a bound of changes (1024, or twice what
  // the last coalescing kept), pending changes of the same (resource,
  // device) collapse into one: the latest state wins, and the change keeps
  // the place where that device first appeared. A subscriber may then miss
  // a flip that was undone meanwhile (unhealthy then healthy again), never
  // the final state; the queue holds at most about one change per device.
  //
  // Stop() delivers every change taken in before it, then joins the
  // delivery thread; no callback runs after Stop() returns.
  virtual int64_t Subscribe(HealthCallback callback) = 0;
  virtual void Unsubscribe(int64_t id) = 0;

  virtual ManagerStats GetStats() const = 0;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_MANAGER_H_
