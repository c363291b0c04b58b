// kube::DecodePodWatchLine / kube::DecodePodList: the PodInformer's readers
// of what the API server sends, as pure functions (the informer and the
// fuzzer, fuzz/pod_watch_fuzzer.cc, share them): one line of a WATCH
// stream of Pods, or one LIST body, turned into PodObjects, a version, or an
// error. The envelope (event types, bookmarks, 410, the LIST's version) and
// the nesting check are node_decode.h's, word for word: a document nested
// deeper than kMaxPodJsonDepth is refused before any JSON parser sees it,
// reported and skipped.
//
// A pod is read once: identity, node, phase, deletion, and its containers as
// a k8s::Pod (names, every resource's limits and requests as k8s::Quantity,
// init containers in order with restartPolicy Always as `restartable`). No
// JSON text is kept or handed over.
//
// Thread-safety: pure functions.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(PodWatchEvent e, DecodePodWatchLine(line));
//   if (e.kind == PodWatchEvent::Kind::kPod && e.pod.error.empty()) Use(e.pod.pod);
#ifndef KDM_KUBE_POD_DECODE_H_
#define KDM_KUBE_POD_DECODE_H_

#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/k8s/pod.h"

namespace kdm::kube {

// The deepest nesting accepted in a watch event or a LIST item (the event or
// item itself is level 1; a Pod uses about 10).
inline constexpr int kMaxPodJsonDepth = 64;

// One Pod as the informer parsed it.
struct PodObject {
  // metadata.uid, .namespace, .name: never empty.
  std::string uid, namespace_name, name;
  std::string node_name;  // spec.nodeName ("" unbound)
  std::string phase;      // status.phase ("" when absent)
  std::string resource_version;
  bool deleting = false;  // metadata.deletionTimestamp is set
  // uid, namespace_name and name as above; init_containers (in order) and
  // containers: name, limits, requests (every resource), restartable
  // (restartPolicy "Always" on an init container). env is not read.
  k8s::Pod pod;
  // Non-empty when the pod could not be read past its identity: the first
  // field that was wrong, named, e.g. "spec.containers[1].resources.limits
  // ['nvidia.com/gpu']: invalid quantity ...", "spec.nodeName: must be a
  // string" (at most 512 bytes, cut with "..."). Then pod.init_containers and pod.containers are
  // empty. The pod is still handed over (a bad pod is its user's to report, not a reason to LIST
  // again).
  std::string error;
};

enum class PodEventType { kAdded, kModified, kDeleted };

struct PodWatchEvent {
  enum class Kind {
    kPod,       // ADDED, MODIFIED or DELETED: `type` and `pod`
    kBookmark,  // only `resource_version` moves on
    kGone,      // ERROR with code 410: LIST again
    kRefused,   // nested too deep: `refusal` says why; skip it, read on
  };
  Kind kind = Kind::kPod;
  PodEventType type = PodEventType::kAdded;
  PodObject pod;
  // The version to watch from after this event; empty: unchanged.
  std::string resource_version;
  std::string refusal;
};

// One line of a WATCH stream (without its '\n'). Errors (the stream cannot
// be trusted any more: LIST again): DATA_LOSS naming what was wrong: not a
// JSON object, no type, no object, an unknown type, an ERROR event other
// than 410 (with its message), a BOOKMARK without a version, a Pod without
// metadata.uid, .name or .namespace (each a non-empty string).
StatusOr<PodWatchEvent> DecodePodWatchLine(std::string_view line);

struct PodList {
  std::string resource_version;
  std::vector<PodObject> pods;
  // One line per item refused for its nesting (and skipped): its index,
  // where it went too deep and the start of its text.
  std::vector<std::string> refused;
};

// A LIST body (a PodList). Errors: DATA_LOSS for a body that is not a JSON
// object, has no metadata.resourceVersion, items that are not a list, or an
// item that is not a Pod with a uid, name and namespace ("items[3]: ...").
StatusOr<PodList> DecodePodList(std::string_view body);

}  // namespace kdm::kube

#endif  // KDM_KUBE_POD_DECODE_H_
