// kube/ internal: what every informer's reader shares (kube/node_decode.h,
// kube/pod_decode.h): one WATCH line's envelope and one LIST body's items,
// each depth-checked (kdm/base/json_depth.h) before nlohmann-json sees it,
// with the same refusal texts. The readers turn the objects into their own
// types. Not installed; nlohmann-json is kdm::kube's private dependency.
//
// Thread-safety: pure functions.
#ifndef KDM_KUBE_WATCH_JSON_H_
#define KDM_KUBE_WATCH_JSON_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::kube::internal {

// object[a][b] when it is a string, else "".
std::string JsonStringAt(const nlohmann::json& object, const char* a, const char* b);

// One watch line, its envelope read.
struct RawWatchLine {
  enum class Kind { kObject, kBookmark, kGone, kRefused };
  enum class Type { kAdded, kModified, kDeleted };
  Kind kind = Kind::kObject;
  Type type = Type::kAdded;
  nlohmann::json event;          // kObject: the whole event; its "object" is an object
  std::string resource_version;  // kBookmark
  std::string refusal;           // kRefused
  const nlohmann::json& object() const { return event["object"]; }
};

// t as an informer's own event type (NodeEventType, PodEventType: each has
// kAdded, kModified and kDeleted).
template <typename EventType>
EventType EventTypeOf(RawWatchLine::Type t) {
  switch (t) {
    case RawWatchLine::Type::kModified:
      return EventType::kModified;
    case RawWatchLine::Type::kDeleted:
      return EventType::kDeleted;
    case RawWatchLine::Type::kAdded:
      break;
  }
  return EventType::kAdded;
}

// A line is refused (kRefused) when it nests deeper than max_object_depth + 1
// (the event is level 1). Errors: DATA_LOSS as BadWatchLine() words them:
// not a JSON object, no type, no object, an ERROR other than 410, a BOOKMARK
// without a version, an unknown type.
StatusOr<RawWatchLine> ReadWatchLine(std::string_view line, int max_object_depth);

// DATA_LOSS "<why>: <the line's start, quoted>".
Status BadWatchLine(std::string_view line, const std::string& why);

// One LIST body: its version and its items, each either a JSON value or a
// refusal (nested deeper than max_item_depth).
struct RawList {
  std::string resource_version;
  nlohmann::json list;
  std::vector<const nlohmann::json*> items;  // into `list`; refused ones left out
  std::vector<size_t> item_index;            // items[i]'s index in the body
  std::vector<std::string> refused;          // "items[N]: nested deeper than ..."
};

// Errors: DATA_LOSS for a body that is not a JSON object, has no
// metadata.resourceVersion, or items that are not a list.
StatusOr<RawList> ReadList(std::string_view body, int max_item_depth);

}  // namespace kdm::kube::internal

#endif  // KDM_KUBE_WATCH_JSON_H_
