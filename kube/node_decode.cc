#include "kdm/kube/node_decode.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/kube/watch_json.h"

namespace kdm::kube {
namespace {

using nlohmann::json;

// The wanted annotations of `metadata` (an object), each copied once with
// room for the annotation reader's padding.
void ReadAnnotations(const json& metadata, const std::vector<std::string>& keys, NodeObject* node) {
  if (keys.empty()) return;
  auto annotations = metadata.find("annotations");
  if (annotations == metadata.end() || annotations->is_null()) return;
  if (!annotations->is_object()) {
    node->annotations_error = "metadata.annotations: must be an object";
    return;
  }
  for (const std::string& key : keys) {
    auto value = annotations->find(key);
    if (value == annotations->end()) continue;
    if (!value->is_string()) {
      node->annotations_error = "metadata.annotations['" + key + "']: must be a string";
      continue;
    }
    const std::string& text = value->get_ref<const std::string&>();
    std::string copy;
    copy.reserve(text.size() + k8s::DecodePadding());
    copy.assign(text);
    node->annotations.emplace(key, std::move(copy));
  }
}

StatusOr<NodeObject> ToNode(const json& object, const std::vector<std::string>& annotation_keys) {
  if (!object.is_object()) return InvalidArgumentError("the object is not a JSON object");
  NodeObject node;
  node.name = internal::JsonStringAt(object, "metadata", "name");
  if (node.name.empty()) return InvalidArgumentError("the object has no metadata.name");
  node.resource_version = internal::JsonStringAt(object, "metadata", "resourceVersion");
  // A name was found: metadata is there and an object.
  ReadAnnotations(*object.find("metadata"), annotation_keys, &node);
  return node;
}

}  // namespace

StatusOr<WatchEvent> DecodeWatchLine(std::string_view line,
                                     const std::vector<std::string>& annotation_keys) {
  KDM_ASSIGN_OR_RETURN(internal::RawWatchLine raw,
                       internal::ReadWatchLine(line, kMaxNodeJsonDepth));
  WatchEvent out;
  switch (raw.kind) {
    case internal::RawWatchLine::Kind::kRefused:
      out.kind = WatchEvent::Kind::kRefused;
      out.refusal = std::move(raw.refusal);
      return out;
    case internal::RawWatchLine::Kind::kGone:
      out.kind = WatchEvent::Kind::kGone;
      return out;
    case internal::RawWatchLine::Kind::kBookmark:
      out.kind = WatchEvent::Kind::kBookmark;
      out.resource_version = std::move(raw.resource_version);
      return out;
    case internal::RawWatchLine::Kind::kObject:
      break;
  }
  out.type = internal::EventTypeOf<NodeEventType>(raw.type);
  StatusOr<NodeObject> node = ToNode(raw.object(), annotation_keys);
  if (!node.ok()) return internal::BadWatchLine(line, std::string(node.status().message()));
  out.node = std::move(*node);
  out.resource_version = out.node.resource_version;
  return out;
}

StatusOr<NodeList> DecodeNodeList(std::string_view body,
                                  const std::vector<std::string>& annotation_keys) {
  KDM_ASSIGN_OR_RETURN(internal::RawList raw, internal::ReadList(body, kMaxNodeJsonDepth));
  NodeList out;
  out.resource_version = std::move(raw.resource_version);
  out.refused = std::move(raw.refused);
  for (size_t i = 0; i < raw.items.size(); ++i) {
    StatusOr<NodeObject> node = ToNode(*raw.items[i], annotation_keys);
    if (!node.ok()) {
      return DataLossError("items[" + std::to_string(raw.item_index[i]) +
                           "]: " + node.status().message());
    }
    out.nodes.push_back(std::move(*node));
  }
  return out;
}

}  // namespace kdm::kube
