// kdm::fakes::NodeAgent: the fake kubelet behind `kdm kubelet --root DIR`, a
// reference node agent built on the device manager.
//
// Under DIR it runs:
//   device-plugins/kubelet.sock  device plugin registration (the Manager)
//   pod-resources/kubelet.sock   pod-resources v1 (PodResourcesServer)
//   state/                       the checkpoint (SQLite or kubelet JSON)
//   manifests/                   static pod manifests, watched (inotify)
//   status/                      <namespace>_<name>.json per pod, node.json
// and optionally Prometheus metrics on HOST:PORT.
//
// Pods come from manifests (see pod_manifest.h): a new file admits its pod
// (Manager::Allocate for the init containers in order, then the app
// containers), a changed file frees the old version and admits the new one,
// a removed file frees the pod's devices (Manager::RemovePod, then
// Manager::UpdateAllocatedDevices) and deletes its status file. A rejected
// pod stays rejected until its file changes. The Manager's active pods are
// the pods admitted from manifests. A pod uid belongs to one manifest: a
// second file with the same uid (or the same namespace/name) is rejected
// with reason DuplicatePod naming both files, and removing one file never
// frees devices that a pod of another file holds.
//
// Admission runs on worker threads (AdmissionQueue): pods that share no
// device resource are admitted side by side, so a plugin that hangs until
// its deadline delays only the pods that ask for its resource; pods that
// share one are admitted in manifest order.
//
// Health changes are coalesced: the node status and the retries of pods
// waiting for plugins run at most every 100 ms however fast a plugin flaps,
// and `event=device_health` lines are rate-limited per resource (the count
// of lines left out follows as `suppressed=N`).
//
// Restart: the Manager restores every allocation from the store. A pod that
// held devices before the restart is re-admitted with the same devices once
// its plugins have registered again; until then it stays active (its
// devices are not collected) and its old status file is left as it was. A
// pod whose status file says Admitted but whose devices were not restored
// (the checkpoint was lost or quarantined) waits up to registration_grace
// for its plugins before it is judged, and then gets devices nobody holds.
//
// Threads: one Asio thread runs the watcher, the per-file state and status
// writes; the admission workers run the Manager's blocking calls; the
// Manager, the pod-resources server and the metrics server own theirs.
// Stop() joins them all without waiting for a plugin: it first ends the io
// thread (from then on nothing is admitted and no status file is written),
// then cancels the plugin RPCs in flight (Manager::CancelPluginCalls), so a
// plugin hung in GetPreferredAllocation, Allocate or PreStartContainer does
// not hold the stop until its deadline. A pod whose admission was cut short
// keeps the status file it had (event=admission_cancelled).
//
// Thread-safety: Start/Stop from one thread; ActivePods() and manager() from
// any thread.
//
// Example:
//   kdm::fakes::NodeAgent::Options o;
//   o.root = "/tmp/node";
//   auto agent = kdm::fakes::NodeAgent::Start(o);
//   if (!agent.ok()) return Fail(agent.status());
//   WaitForSignal();
//   (*agent)->Stop();
#ifndef KDM_FAKES_NODE_AGENT_H_
#define KDM_FAKES_NODE_AGENT_H_

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/paths.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/metrics.h"
#include "kdm/devicemanager/pod.h"
#include "kdm/devicemanager/pod_resources_server.h"
#include "kdm/k8s/devices_annotation.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::fakes {

// Parses `--restrict` values, each "RESOURCE=NS1,NS2,...", into
// NodeAgent::Options::restrictions. INVALID_ARGUMENT naming the value and
// the problem: no '=', an invalid (non-extended) resource name, an empty
// namespace list or an empty namespace, a namespace that is not a DNS-1123
// label, the same resource twice.
// Example: ParseRestrictions({"nvidia.com/gpu=ml,research"}).
StatusOr<std::map<std::string, std::set<std::string>>> ParseRestrictions(
    const std::vector<std::string>& values);

// Checks the device requirements of every container (init and app) of
// `pod`: its NVIDIA_REQUIRE_* env (kube/requirements.h) against the
// attributes of each device resource it asks for (a limit above 0). A
// resource without attributes is not checked; NVIDIA_DISABLE_REQUIRE=true
// skips the container. OK when all hold; otherwise FAILED_PRECONDITION
// (unmet) or INVALID_ARGUMENT (a value that does not parse), the message
// naming the container and resource first: "container main, resource
// nvidia.com/gpu: NVIDIA_REQUIRE_CUDA: cuda 11.8 does not satisfy cuda>=12.2".
Status CheckDeviceRequirements(const devicemanager::Pod& pod,
                               const std::map<std::string, k8s::DeviceAttributes>& attributes);

class NodeAgent {
 public:
  struct Options {
    // Required. Created (0755) when missing.
    std::string root;
    checkpoint::StoreKind checkpoint = checkpoint::StoreKind::kSqlite;
    // HOST:PORT for /metrics and /healthz; empty: no metrics server.
    std::string metrics_addr;
    // How long a resource whose plugin went away stays before it is deleted.
    std::chrono::milliseconds grace_period{std::chrono::minutes(5)};
    // Deadline of every plugin RPC (GetPreferredAllocation, Allocate,
    // registration steps).
    std::chrono::milliseconds rpc_timeout{std::chrono::seconds(10)};
    // Deadline of PreStartContainer (the kubelet's is 30 s).
    std::chrono::milliseconds pre_start_timeout{pluginapi::kPreStartContainerTimeout};
    // At start, how long a pod that was admitted before the restart (its
    // status file says Admitted, or the checkpoint holds its devices) waits
    // for the plugins of its resources to register before it is judged. A
    // plugin re-registers within seconds of a kubelet restart; without this
    // wait such a pod is rejected "unregistered" for good when the
    // checkpoint was lost.
    std::chrono::milliseconds registration_grace{std::chrono::seconds(30)};
    // Pods admitted at the same time (worker threads). Pods that share a
    // device resource are admitted one after another, in manifest order;
    // pods that share none do not wait for each other.
    int admission_threads = 8;
    // Quiet time before a manifest change is acted on.
    std::chrono::milliseconds manifest_debounce{std::chrono::milliseconds(100)};
    // Resource -> the namespaces whose pods may use it (Manager::Options::
    // restrictions). A pod of another namespace asking for it is rejected
    // with reason "RestrictedResource".
    std::map<std::string, std::set<std::string>> restrictions;
    // Resource -> what is known of its devices (`kdm kubelet --attributes`).
    // A pod whose container's NVIDIA_REQUIRE_* these do not meet is
    // rejected with reason "UnmetDeviceRequirement" before any device is
    // allocated (CheckDeviceRequirements).
    std::map<std::string, k8s::DeviceAttributes> attributes;
    // Resource -> device id -> NVML's index of that GPU (from `--publish
    // --topology RESOURCE=nvml`), written with the device in node.json.
    std::map<std::string, std::map<std::string, int>> gpu_indexes;
  };

  // Creates the directories, opens the checkpoint, starts the Manager, the
  // pod-resources server, the optional metrics server and the manifest
  // watcher, and admits the manifests already present. Errors name the
  // failing part (bad options, an unusable directory or store, a socket or
  // port that cannot be served); nothing is left running on error.
  static StatusOr<std::unique_ptr<NodeAgent>> Start(Options options);

  // Stops if running.
  virtual ~NodeAgent() = default;

  // Stops the watcher, the servers and the Manager and joins every thread,
  // cancelling plugin RPCs in flight (see the file comment). Idempotent.
  virtual void Stop() = 0;

  // The metrics server's port (0 when there is none).
  virtual int metrics_port() const = 0;

  // The pods admitted now (and those waiting for their plugins after a
  // restart), as the pod-resources API reports them.
  virtual std::vector<devicemanager::ActivePod> ActivePods() const = 0;

  // The agent's Manager, for in-process readers of its devices (the publish
  // loop of `kdm kubelet --publish`: devicemanager::ListPodResources over
  // it and ActivePods() answers what the pod-resources socket would, with
  // no dial). Its query methods are thread-safe. Valid until the agent is
  // destroyed; stop its readers before Stop().
  virtual const devicemanager::Manager& manager() const = 0;
  // The metrics the metrics server shows; null when it has none (no
  // metrics_addr). Valid until the agent is destroyed.
  virtual devicemanager::Metrics* metrics() const = 0;
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_NODE_AGENT_H_
