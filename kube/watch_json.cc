#include "kdm/kube/watch_json.h"

#include <set>
#include <utility>

#include "kdm/base/json_depth.h"
#include "kdm/base/log_value.h"

namespace kdm::kube::internal {
namespace {

using nlohmann::json;

// How much of a refused document a refusal quotes: enough for its type and
// metadata.name, which come first in what the API server writes.
constexpr size_t kQuotedPrefixBytes = 256;

std::string TooDeep(int max_depth, size_t at, std::string_view text) {
  return "nested deeper than " + std::to_string(max_depth) + " levels at byte " +
         std::to_string(at) + ": " + QuoteLogValue(text, kQuotedPrefixBytes);
}

}  // namespace

std::string JsonStringAt(const json& object, const char* a, const char* b) {
  auto outer = object.find(a);
  if (outer == object.end() || !outer->is_object()) return "";
  auto inner = outer->find(b);
  if (inner == outer->end() || !inner->is_string()) return "";
  return inner->get<std::string>();
}

Status BadWatchLine(std::string_view line, const std::string& why) {
  return DataLossError(why + ": " + QuoteLogValue(line, kQuotedPrefixBytes));
}

StatusOr<RawWatchLine> ReadWatchLine(std::string_view line, int max_object_depth) {
  RawWatchLine out;
  // The event is level 1 and its object level 2.
  if (std::optional<size_t> at = FindJsonDepthViolation(line, max_object_depth + 1)) {
    out.kind = RawWatchLine::Kind::kRefused;
    out.refusal = TooDeep(max_object_depth, *at, line);
    return out;
  }
  out.event = json::parse(line, nullptr, /*allow_exceptions=*/false);
  const json& event = out.event;
  if (!event.is_object()) return BadWatchLine(line, "not a JSON object");
  auto type_it = event.find("type");
  auto object_it = event.find("object");
  if (type_it == event.end() || !type_it->is_string()) return BadWatchLine(line, "no type");
  if (object_it == event.end() || !object_it->is_object()) return BadWatchLine(line, "no object");
  const std::string& type = type_it->get_ref<const std::string&>();
  if (type == "ERROR") {
    auto code = object_it->find("code");
    if (code != object_it->end() && code->is_number_integer() && code->get<int64_t>() == 410) {
      out.kind = RawWatchLine::Kind::kGone;
      return out;
    }
    auto message = object_it->find("message");
    return BadWatchLine(line, "ERROR event" + (message != object_it->end() && message->is_string()
                                                   ? " (" + message->get<std::string>() + ")"
                                                   : std::string()));
  }
  if (type == "BOOKMARK") {
    out.kind = RawWatchLine::Kind::kBookmark;
    out.resource_version = JsonStringAt(*object_it, "metadata", "resourceVersion");
    if (out.resource_version.empty()) {
      return BadWatchLine(line, "BOOKMARK without metadata.resourceVersion");
    }
    return out;
  }
  if (type == "ADDED") {
    out.type = RawWatchLine::Type::kAdded;
  } else if (type == "MODIFIED") {
    out.type = RawWatchLine::Type::kModified;
  } else if (type == "DELETED") {
    out.type = RawWatchLine::Type::kDeleted;
  } else {
    return BadWatchLine(line, "unknown event type");
  }
  return out;
}

StatusOr<RawList> ReadList(std::string_view body, int max_item_depth) {
  // The list is level 1, items 2, each item 3: an item may go
  // max_item_depth levels deep from there. Each item that goes deeper is
  // replaced by a number (its offset) before parsing, and refused.
  const int item_level = 3;
  std::vector<JsonDeepSpan> deep =
      FindJsonDeepSpans(body, max_item_depth + item_level - 1, item_level);
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
  RawList out;
  out.list = json::parse(deep.empty() ? body : std::string_view(replaced), nullptr,
                         /*allow_exceptions=*/false);
  const json& list = out.list;
  if (!list.is_object()) return DataLossError("not a JSON object");
  out.resource_version = JsonStringAt(list, "metadata", "resourceVersion");
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
        out.refused.push_back(
            "items[" + std::to_string(i) + "]: " +
            TooDeep(max_item_depth, span.at, body.substr(span.begin, span.end - span.begin)));
      }
      continue;
    }
    out.items.push_back(&item);
    out.item_index.push_back(i);
  }
  return out;
}

}  // namespace kdm::kube::internal
