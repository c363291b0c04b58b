// kube::DecodeWatchLine / kube::DecodeNodeList: the NodeInformer's readers
// of what the API server sends, as pure functions (the informer and the
// fuzzer, fuzz/node_watch_fuzzer.cc, share them): one line of a WATCH
// stream, or one LIST body, turned into NodeObjects, a version, or an error.
//
// Nesting: a document (a watch line, a LIST item) nested deeper than
// kMaxNodeJsonDepth levels is refused before any JSON parser sees it, by a
// linear scan (kdm/base/json_depth.h): a Node is about 8 levels deep, and a
// parser that recurses once per level is one deep document away from a
// stack overflow. A refused watch line or LIST item is reported and skipped;
// the rest of the stream or list is used.
//
// The envelope (event types, bookmarks, 410, the LIST's version and items)
// and the nesting check are read by kube/watch_json.h, which the Pod
// readers (kube/pod_decode.h) share.
//
// Thread-safety: pure functions.
#ifndef KDM_KUBE_NODE_DECODE_H_
#define KDM_KUBE_NODE_DECODE_H_

#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::kube {

// The deepest nesting accepted in a watch event or a LIST item (the event or
// item itself is level 1; a Node uses about 8).
inline constexpr int kMaxNodeJsonDepth = 64;

// One Node as the informer parsed it, once: its name, resourceVersion and
// the annotations its user asked for (NodeInformer::Options::annotation_keys).
// No JSON text is kept or handed over: a user never parses a node again.
struct NodeObject {
  std::string name;
  std::string resource_version;
  // Each wanted annotation the node has, by key. Each value has
  // k8s::DecodePadding() bytes of spare capacity, so that
  // k8s::DecodeNodeDevices reads it in place.
  std::map<std::string, std::string, std::less<>> annotations;
  // Non-empty when the node's annotations could not be read: "metadata.
  // annotations: must be an object", or "metadata.annotations['KEY']: must
  // be a string" for a wanted KEY. The node is still handed over (a bad
  // annotation is its user's to report, not a reason to LIST again).
  std::string annotations_error;
};

enum class NodeEventType { kAdded, kModified, kDeleted };

struct WatchEvent {
  enum class Kind {
    kNode,      // ADDED, MODIFIED or DELETED: `type` and `node`
    kBookmark,  // only `resource_version` moves on
    kGone,      // ERROR with code 410: LIST again
    kRefused,   // nested too deep: `refusal` says why; skip it, read on
  };
  Kind kind = Kind::kNode;
  NodeEventType type = NodeEventType::kAdded;
  NodeObject node;
  // The version to watch from after this event; empty: unchanged.
  std::string resource_version;
  std::string refusal;
};

// One line of a WATCH stream (without its '\n'). Errors (the stream cannot
// be trusted any more: LIST again): DATA_LOSS naming what was wrong: not a
// JSON object, no type, no object, an unknown type, an ERROR event other
// than 410 (with its message), a BOOKMARK without a version, a Node
// without a name.
StatusOr<WatchEvent> DecodeWatchLine(std::string_view line,
                                     const std::vector<std::string>& annotation_keys);

struct NodeList {
  std::string resource_version;
  std::vector<NodeObject> nodes;
  // One line per item refused for its nesting (and skipped): its index,
  // where it went too deep and the start of its text.
  std::vector<std::string> refused;
};

// A LIST body (a NodeList). Errors: DATA_LOSS for a body that is not a JSON
// object, has no metadata.resourceVersion, items that are not a list, or an
// item that is not a Node with a name ("items[3]: ...").
StatusOr<NodeList> DecodeNodeList(std::string_view body,
                                  const std::vector<std::string>& annotation_keys);

}  // namespace kdm::kube

#endif  // KDM_KUBE_NODE_DECODE_H_
