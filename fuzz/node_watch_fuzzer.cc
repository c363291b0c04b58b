// Fuzz target: the NodeInformer's readers of what the API server sends
// (kube/node_decode.h): the whole input as one LIST body, and each of its
// lines as one WATCH event.
//
// Properties of every input:
// - a refusal is DATA_LOSS;
// - a watch line is refused for its nesting (kRefused, skipped) exactly
//   when it nests deeper than kMaxNodeJsonDepth + 1, and then no JSON parser
//   saw it;
// - an accepted Node event has a name, and its version is the version to go
//   on from; a BOOKMARK has a version;
// - an accepted LIST has a version; every node in it has a name; every
//   refused item is named by its index.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.h"
#include "kdm/base/json_depth.h"
#include "kdm/kube/node_decode.h"

namespace {

const std::vector<std::string>& Keys() {
  static const std::vector<std::string> keys = {"kdm.io/devices", "other"};
  return keys;
}

void CheckLine(std::string_view line) {
  using kdm::kube::WatchEvent;
  kdm::StatusOr<WatchEvent> e = kdm::kube::DecodeWatchLine(line, Keys());
  const bool deep = kdm::FindJsonDepthViolation(line, kdm::kube::kMaxNodeJsonDepth + 1).has_value();
  if (!e.ok()) {
    FUZZ_CHECK(e.status().code() == kdm::StatusCode::kDataLoss, "refusal code: " << e.status());
    FUZZ_CHECK(!deep, "a deep line reached the parser");
    return;
  }
  FUZZ_CHECK((e->kind == WatchEvent::Kind::kRefused) == deep, "refused exactly the deep lines");
  switch (e->kind) {
    case WatchEvent::Kind::kRefused:
      FUZZ_CHECK(!e->refusal.empty(), "a refusal without a reason");
      break;
    case WatchEvent::Kind::kBookmark:
      FUZZ_CHECK(!e->resource_version.empty(), "a bookmark without a version");
      break;
    case WatchEvent::Kind::kGone:
      break;
    case WatchEvent::Kind::kNode:
      FUZZ_CHECK(!e->node.name.empty(), "a node without a name");
      FUZZ_CHECK(e->resource_version == e->node.resource_version, "the version to go on from");
      for (const auto& [key, value] : e->node.annotations) {
        FUZZ_CHECK(key == "kdm.io/devices" || key == "other", "an unwanted annotation " << key);
      }
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<kdm::kube::NodeList> list = kdm::kube::DecodeNodeList(text, Keys());
  if (!list.ok()) {
    FUZZ_CHECK(list.status().code() == kdm::StatusCode::kDataLoss,
               "refusal code: " << list.status());
  } else {
    FUZZ_CHECK(!list->resource_version.empty(), "a list without a version");
    for (const auto& node : list->nodes) FUZZ_CHECK(!node.name.empty(), "a node without a name");
    for (const std::string& r : list->refused) {
      FUZZ_CHECK(r.rfind("items[", 0) == 0, "a refused item not named by its index: " << r);
    }
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t nl = text.find('\n', start);
    if (nl == std::string_view::npos) nl = text.size();
    CheckLine(text.substr(start, nl - start));
    start = nl + 1;
  }
  return 0;
}
