// kdm::fakes status files: what `kdm kubelet` writes under DIR/status/, and
// the one parser of them (`kdm get capacity`, the soak and the agent itself
// read them back through it). This file is the schema's only home.
//
//   <namespace>_<name>.json   one pod's admission result:
//     {"phase": "Admitted" | "Rejected", "reason": "...", "message": "...",
//      "containers": [{"name": ..., "devices": {"<resource>": ["id", ...]},
//                      "envs": {...}, "mounts": [...], "device_specs": [...],
//                      "annotations": {...}, "cdi_devices": [...]}]}
//   node.json                 the node: capacity and allocatable per
//                             resource, plugins and their state, deleted
//                             resources, registrations accepted.
// Every file is written atomically (temp file, fsync, rename, fsync of the
// directory): a reader sees the old or the new content, whole. The format
// carries no version: a reader takes every key the writer writes, ignores
// keys it does not know, and refuses a file that lacks one or holds a value
// of the wrong type.
//
// Thread-safety: pure functions, except the file functions (file system).
//
// Example:
//   PodStatus s{.phase = "Rejected", .reason = "UnexpectedAdmissionError",
//               .message = "Allocate failed due to ..., which is unexpected"};
//   KDM_RETURN_IF_ERROR(WriteFileAtomically(dir + "/" +
//       PodStatusFileName("default", "train"), RenderPodStatus(s)));
//   StatusOr<NodeStatus> node = ReadNodeStatusFile(dir + "/node.json");
#ifndef KDM_FAKES_STATUS_FILE_H_
#define KDM_FAKES_STATUS_FILE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/devicemanager/manager.h"

namespace kdm::fakes {

inline constexpr char kPhaseAdmitted[] = "Admitted";
inline constexpr char kPhaseRejected[] = "Rejected";
// The kubelet's reason for a device manager admission failure.
inline constexpr char kReasonUnexpectedAdmissionError[] = "UnexpectedAdmissionError";
// kdm's reason for a manifest that cannot be read as a valid Pod.
inline constexpr char kReasonInvalidManifest[] = "InvalidManifest";
// kdm's reason for a second manifest defining an already-defined pod.
inline constexpr char kReasonDuplicatePod[] = "DuplicatePod";
// kdm's reason for a pod outside the namespaces allowed a resource
// (`kdm kubelet --restrict`).
inline constexpr char kReasonRestrictedResource[] = "RestrictedResource";
// kdm's reason for a container whose NVIDIA_REQUIRE_* the node's devices do
// not meet (or that cannot be read); see CheckDeviceRequirements.
inline constexpr char kReasonUnmetDeviceRequirement[] = "UnmetDeviceRequirement";

// The kubelet's message for a device manager Allocate error:
// "Allocate failed due to <error>, which is unexpected".
std::string AdmissionFailureMessage(std::string_view error);

struct ContainerStatus {
  std::string name;
  // Resource -> device ids (sorted).
  std::map<std::string, std::vector<std::string>> devices;
  devicemanager::RunContainerOptions run;
};

struct PodStatus {
  std::string phase;                        // kPhaseAdmitted or kPhaseRejected
  std::string reason;                       // empty when admitted
  std::string message;                      // empty when admitted
  std::vector<ContainerStatus> containers;  // init containers, then app ones
};

// Pretty-printed JSON with exactly the keys above (plus a trailing newline).
// RunContainerOptions::conflicts is not written.
std::string RenderPodStatus(const PodStatus& status);

// Parses what RenderPodStatus writes (ParsePodStatus(RenderPodStatus(s))
// gives s back, without run.conflicts). INVALID_ARGUMENT naming the first
// problem and where: not valid JSON, not a JSON object, a missing key (e.g.
// `"containers"[0]["envs"] is missing`), a value of the wrong type, a phase
// other than Admitted or Rejected.
StatusOr<PodStatus> ParsePodStatus(std::string_view text);

// "<namespace>_<name>.json".
std::string PodStatusFileName(std::string_view namespace_name, std::string_view name);
// For a manifest whose pod name cannot be read: "manifest_<file name>.json".
std::string ManifestStatusFileName(std::string_view manifest_file_name);

// One device of the node, healthy or not (node.json "devices").
struct NodeDevice {
  std::string resource;
  std::string id;
  bool healthy = false;
  std::vector<int64_t> numa_nodes;  // sorted; empty when unknown or none
  std::string model;                // "" when the agent does not know it
  // NVML's index of the GPU (what nvidia-smi shows), when the agent read
  // the node's GPUs through NVML (`--publish --topology RESOURCE=nvml`).
  std::optional<int> index;
  friend bool operator==(const NodeDevice&, const NodeDevice&) = default;
};

// A pod the agent knows but has not judged yet (node.json "pending_pods").
struct PendingPod {
  std::string namespace_name;
  std::string name;
  std::string reason;  // kReasonWaitingForPlugins, kReasonAdmitting, ...
  friend bool operator==(const PendingPod&, const PendingPod&) = default;
};

// Why a pod is pending: its plugins have not registered (yet) since a
// restart; an admission runs for it now; it waits for another manifest's
// admission of the same uid to end.
inline constexpr char kReasonWaitingForPlugins[] = "WaitingForPlugins";
inline constexpr char kReasonAdmitting[] = "Admitting";
inline constexpr char kReasonWaitingForOtherAdmission[] = "WaitingForOtherAdmission";

struct NodeStatus {
  devicemanager::CapacityReport capacity;
  int64_t registrations = 0;  // registrations accepted since the agent started
  // Added after the first release of the schema: a file an older agent
  // wrote lacks them (std::nullopt), and nullopt is not written.
  std::optional<std::vector<NodeDevice>> devices;  // sorted by (resource, id)
  std::optional<std::vector<PendingPod>> pending_pods;
};

// {"capacity": {"<r>": n}, "allocatable": {"<r>": n},
//  "plugins": [{"resource": r, "state": s, "devices": n, "healthy": n}],
//  "deleted_resources": [...], "registrations": n,
//  "devices": [{"resource": r, "id": id, "healthy": b, "numa_nodes": [n],
//               "model": m}],
//  "pending_pods": [{"namespace": ns, "name": n, "reason": r}]}
// "devices" and "pending_pods" are the only optional keys (an older agent
// does not write them); within them every key is required.
// A plugin's state is derived from its resource's counts: "Healthy" (some
// device allocatable), "Unhealthy" (devices, none healthy: the plugin
// disconnected or reports every device unhealthy), "Pending" (no devices:
// restored from the checkpoint and waiting for the plugin to register).
std::string RenderNodeStatus(const NodeStatus& status);

// A plugin's state in node.json, derived from its resource's counts as
// above: "Healthy", "Unhealthy" or "Pending".
std::string_view PluginState(const devicemanager::CapacityReport::Amounts& amounts);

// Parses what RenderNodeStatus writes (the plugins are derived data: each
// must agree with its resource's counts). INVALID_ARGUMENT naming the first
// problem and where: not valid JSON, not a JSON object, a missing key, a
// value of the wrong type (`"capacity" is not an object`), a negative
// count, allocatable above capacity, capacity and allocatable naming
// different resources, a plugin that disagrees with its counts.
StatusOr<NodeStatus> ParseNodeStatus(std::string_view text);

// The largest status file the readers below take. The writer stays far
// below it: node.json holds counts, a pod's file its containers' run options.
inline constexpr uintmax_t kMaxStatusFileBytes = 16 << 20;

// Reads and parses one status file. NOT_FOUND when `path` does not exist;
// UNAVAILABLE when it cannot be read; INVALID_ARGUMENT "<path>: <problem>"
// for a file that is not a regular file, is larger than
// kMaxStatusFileBytes, or does not parse (as above).
StatusOr<PodStatus> ReadPodStatusFile(const std::string& path);
StatusOr<NodeStatus> ReadNodeStatusFile(const std::string& path);

// Writes `contents` to `path` atomically (see above) with
// Env::WriteFileAtomically, mode 0644. On error `path` is unchanged; the
// error names the path and the failing step. The temporary file is
// ".<name>.tmp-XXXXXX" (TempFileNaming::kHiddenRandom) beside `path`.
Status WriteFileAtomically(const std::string& path, std::string_view contents,
                           Env* env = Env::Default());

// Removes the temporary files of WriteFileAtomically that a process killed
// between creating and renaming one left in `dir` (regular files named
// ".<name>.tmp-XXXXXX", X a letter or digit; nothing else is touched),
// logging each (`event=stale_temp_file_removed`). Call it before anything
// writes to `dir`: it cannot tell a dead writer's file from a live one's.
// Returns the paths removed; a directory that cannot be read is logged and
// gives none.
std::vector<std::string> RemoveStaleTempFiles(const std::string& dir, Env* env = Env::Default());

// The pod status files in `dir` (not node.json) that say "Admitted" and list
// at least one device: pods that the checkpoint should hold after a
// restart. Files that ReadPodStatusFile refuses are skipped. Sorted file
// names.
std::vector<std::string> AdmittedStatusFilesWithDevices(const std::string& dir);

}  // namespace kdm::fakes

#endif  // KDM_FAKES_STATUS_FILE_H_
