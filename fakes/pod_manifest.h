// kdm::fakes pod manifests: a Kubernetes Pod manifest (YAML or JSON, as the
// kubelet reads from --pod-manifest-path) turned into the device manager's
// plain Pod model.
//
// What is read: apiVersion ("v1"), kind ("Pod"), metadata.name (required, a
// DNS-1123 subdomain), metadata.namespace (default "default", a DNS-1123
// label), metadata.uid (when absent: DerivePodUid(namespace, name), stable
// across restarts and edits), spec.initContainers (restartPolicy "Always"
// makes a sidecar) and spec.containers (name, resources.limits,
// resources.requests, env: name and literal value; an entry with only
// valueFrom is skipped). Every other field is ignored.
//
// Resources follow the API server's validation: a resource name is native
// (cpu, memory, ephemeral-storage, storage, pods, hugepages-<size>, or under
// kubernetes.io/) or an extended resource name (domain/name); anything else
// is an unknown resource. Quantities are Kubernetes quantities (strings or
// numbers) and must not be negative. For extended (device) resources the
// count must be a whole number, a request needs a limit, and request ==
// limit; a missing request defaults to the limit, as in the API server.
//
// A YAML manifest whose aliases expand to more than kMaxManifestNodes nodes
// or kMaxManifestExpandedBytes bytes is refused (see below), cheaply.
//
// Every error is INVALID_ARGUMENT with a message "<file>: <field>: <what>",
// e.g. `gpu.yaml: spec.containers[0].resources.limits[nvidia.com/gpu]: must
// be a whole number of devices, got "1.5"`. Parsing never throws.
//
// Thread-safety: pure functions; LoadPodManifest reads one file.
//
// Example:
//   kdm::fakes::PodIdentity id;
//   auto pod = kdm::fakes::LoadPodManifest("/root/manifests/train.yaml", &id);
//   if (!pod.ok()) Reject(id, pod.status().message());
#ifndef KDM_FAKES_POD_MANIFEST_H_
#define KDM_FAKES_POD_MANIFEST_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "kdm/base/status.h"
#include "kdm/devicemanager/pod.h"

namespace kdm::fakes {

// Manifests larger than this are refused without being parsed (the kubelet
// has no limit; a fake kubelet should not load a runaway file into memory).
inline constexpr size_t kMaxManifestBytes = 1 << 20;  // 1 MiB

// Bounds on a YAML manifest once its aliases are expanded. YAML aliases
// (`*a` naming an `&a` anchor) let a few hundred bytes stand for billions of
// nodes ("billion laughs"); the reader counts every node and every byte of
// keys and scalars as it expands them, and refuses the manifest as soon as
// either count passes its limit, before the expansion is built. Real pod
// manifests have hundreds of nodes and a few KiB of text; a manifest without
// aliases within kMaxManifestBytes stays below the byte limit.
inline constexpr size_t kMaxManifestNodes = 100'000;
inline constexpr size_t kMaxManifestExpandedBytes = 4 << 20;  // 4 MiB

// The namespace and name of a manifest's pod, as far as they could be read
// (name empty when metadata.name is missing or invalid).
struct PodIdentity {
  std::string namespace_name;
  std::string name;
};

// Parses one manifest. `file_name` names the file in error messages and
// picks the syntax: ".json" is read as JSON, anything else as YAML (which
// also reads JSON, except where YAML differs: a key and its ':' on two
// lines). A NUL byte anywhere is an error. `identity` (optional) receives
// namespace and name as soon as they are known, also when a later field is
// bad.
StatusOr<devicemanager::Pod> ParsePodManifest(std::string_view text, std::string_view file_name,
                                              PodIdentity* identity = nullptr);

// Reads `path` (at most kMaxManifestBytes; a larger file is an error naming
// its size and the limit) and parses it; errors name the file's base name.
StatusOr<devicemanager::Pod> LoadPodManifest(const std::string& path,
                                             PodIdentity* identity = nullptr);

// Reads at most kMaxManifestBytes + 1 bytes of `path` (so a caller can tell
// a too-large file). NOT_FOUND / PERMISSION_DENIED / UNAVAILABLE naming it.
StatusOr<std::string> ReadManifestBytes(const std::string& path);

// A uid derived from namespace and name: a UUID-shaped string (8-4-4-4-12
// lowercase hex), the same for the same inputs in every process.
std::string DerivePodUid(std::string_view namespace_name, std::string_view name);

// True for the file names the kubelet would read: "*.yaml", "*.yml",
// "*.json", not hidden (a leading '.'), so editors' temporary and swap
// files ("~", ".swp", ".#x.yaml", "4913") are ignored.
bool IsManifestFileName(std::string_view file_name);

}  // namespace kdm::fakes

#endif  // KDM_FAKES_POD_MANIFEST_H_
