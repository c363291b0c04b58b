#include "kdm/kube/node_decode.h"

#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "kdm/base/json_depth.h"
#include "kdm/base/log_value.h"
#include "kdm/k8s/devices_annotation.h"

namespace kdm::kube {
namespace {

using nlohmann::json;

// How much of a refused document a refusal quotes: enough for its type and
// metadata.name, which come first in what the API server writes.
constexpr size_t kQuotedPrefixBytes = 256;

std::string StringAt(const json& object, const char* a, const char* b) {
  auto outer = object.find(a);
  if (outer == object.end() || !outer->is_object()) return "";
  auto inner = outer->find(b);
  if (inner == outer->end() || !inner->is_string()) return "";
  return inner->get<std::string>();
}

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
  node.name = StringAt(object, "metadata", "name");
  if (node.name.empty()) return InvalidArgumentError("the object has no metadata.name");
  node.resource_version = StringAt(object, "metadata", "resourceVersion");
  // A name was found: metadata is there and an object.
  ReadAnnotations(*object.find("metadata"), annotation_keys, &node);
  return node;
}

std::string TooDeep(size_t at, std::string_view text) {
  return "nested deeper than " + std::to_string(kMaxNodeJsonDepth) + " levels at byte " +
         std::to_string(at) + ": " + QuoteLogValue(text, kQuotedPrefixBytes);
}

}  // namespace

StatusOr<WatchEvent> DecodeWatchLine(std::string_view line,
                                     const std::vector<std::string>& annotation_keys) {
  WatchEvent out;
  // The event is level 1 and its object level 2.
  if (std::optional<size_t> at = FindJsonDepthViolation(line, kMaxNodeJsonDepth + 1)) {
    out.kind = WatchEvent::Kind::kRefused;
    out.refusal = TooDeep(*at, line);
    return out;
  }
  json event = json::parse(line, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const std::string& why) {
    return DataLossError(why + ": " + QuoteLogValue(line, kQuotedPrefixBytes));
  };
  if (!event.is_object()) return bad("not a JSON object");
  auto type_it = event.find("type");
  auto object_it = event.find("object");
  if (type_it == event.end() || !type_it->is_string()) return bad("no type");
  if (object_it == event.end() || !object_it->is_object()) return bad("no object");
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == "ERROR") {
    auto code = object_it->find("code");
    if (code != object_it->end() && code->is_number_integer() && code->get<int64_t>() == 410) {
      out.kind = WatchEvent::Kind::kGone;
      return out;
    }
    auto message = object_it->find("message");
    return bad("ERROR event" + (message != object_it->end() && message->is_string()
                                    ? " (" + message->get<std::string>() + ")"
                                    : std::string()));
  }
  if (type == "BOOKMARK") {
    out.kind = WatchEvent::Kind::kBookmark;
    out.resource_version = StringAt(*object_it, "metadata", "resourceVersion");
    if (out.resource_version.empty()) return bad("BOOKMARK without metadata.resourceVersion");
    return out;
  }
  if (type == "ADDED") {
    out.type = NodeEventType::kAdded;
  } else if (type == "MODIFIED") {
    out.type = NodeEventType::kModified;
  } else if (type == "DELETED") {
    out.type = NodeEventType::kDeleted;
  } else {
    return bad("unknown event type");
  }
  StatusOr<NodeObject> node = ToNode(*object_it, annotation_keys);
  if (!node.ok()) return bad(std::string(node.status().message()));
  out.node = std::move(*node);
  out.resource_version = out.node.resource_version;
  return out;
}

StatusOr<NodeList> DecodeNodeList(std::string_view body,
                                  const std::vector<std::string>& annotation_keys) {
  // The list is level 1, items 2, each item 3: an item may go
  // kMaxNodeJsonDepth levels deep from there. Each item that goes deeper is
  // replaced by a number (its offset) before parsing, and refused.
  const int item_level = 3;
  std::vector<JsonDeepSpan> deep =
      FindJsonDeepSpans(body, kMaxNodeJsonDepth + item_level - 1, item_level);
  std::string replaced;
  std::set<int64_t> replaced_at;
  if (!deep.empty()) {
    size_t from = 0;
    for (const JsonDeepSpan& span : deep) {
      replaced.append(body.substr(from, span.begin - from));
      replaced.append(std::to_string(span.begin));
      replaced_at.insert(static_cast<int64_t>(span.begin));
      from = span.end;
    }
    replaced.append(body.substr(from));
  }
  json list = json::parse(deep.empty() ? body : std::string_view(replaced), nullptr,
                          /*allow_exceptions=*/false);
  if (!list.is_object()) return DataLossError("not a JSON object");
  NodeList out;
  out.resource_version = StringAt(list, "metadata", "resourceVersion");
  if (out.resource_version.empty()) {
    return DataLossError("no metadata.resourceVersion in the list");
  }
  auto items = list.find("items");
  if (items == list.end() || items->is_null()) return out;
  if (!items->is_array()) return DataLossError("items: not a list");
  for (size_t i = 0; i < items->size(); ++i) {
    const json& item = (*items)[i];
    if (item.is_number_integer() && replaced_at.count(item.get<int64_t>()) != 0) {
      const size_t begin = static_cast<size_t>(item.get<int64_t>());
      for (const JsonDeepSpan& span : deep) {
        if (span.begin != begin) continue;
        out.refused.push_back("items[" + std::to_string(i) + "]: " +
                              TooDeep(span.at, body.substr(span.begin, span.end - span.begin)));
      }
      continue;
    }
    StatusOr<NodeObject> node = ToNode(item, annotation_keys);
    if (!node.ok()) {
      return DataLossError("items[" + std::to_string(i) + "]: " + node.status().message());
    }
    out.nodes.push_back(std::move(*node));
  }
  return out;
}

}  // namespace kdm::kube
