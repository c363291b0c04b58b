// Fuzz target: the PodInformer's readers of what the API server sends
// (kube/pod_decode.h): the whole input as one LIST body, and each of its
// lines as one WATCH event.
//
// Properties of every input:
// - a refusal is DATA_LOSS;
// - a watch line is refused for its nesting (kRefused, skipped) exactly
//   when it nests deeper than kMaxPodJsonDepth + 1, and then no JSON parser
//   saw it;
// - an accepted Pod event has a uid, a name and a namespace (the k8s::Pod's
//   too), and its version is the version to go on from; a BOOKMARK has a
//   version;
// - a pod with an error has no containers, and its error is at most 512
//   bytes; a pod without one has only plain init containers and sidecars
//   marked restartable;
// - an accepted LIST has a version; every pod in it has an identity; every
//   refused item is named by its index.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/base/json_depth.h"
#include "kdm/kube/pod_decode.h"

namespace {

void CheckPod(const kdm::kube::PodObject& p) {
  FUZZ_CHECK(!p.uid.empty() && !p.name.empty() && !p.namespace_name.empty(),
             "a pod without its identity");
  FUZZ_CHECK(p.pod.uid == p.uid && p.pod.name == p.name && p.pod.namespace_name == p.namespace_name,
             "the k8s::Pod's identity differs");
  FUZZ_CHECK(p.error.size() <= 512, "an error of " << p.error.size() << " bytes");
  if (!p.error.empty()) {
    FUZZ_CHECK(p.pod.containers.empty() && p.pod.init_containers.empty(),
               "containers kept with an error");
  }
  for (const auto& c : p.pod.containers) FUZZ_CHECK(!c.restartable, "a restartable app container");
}

void CheckLine(std::string_view line) {
  using kdm::kube::PodWatchEvent;
  kdm::StatusOr<PodWatchEvent> e = kdm::kube::DecodePodWatchLine(line);
  const bool deep = kdm::FindJsonDepthViolation(line, kdm::kube::kMaxPodJsonDepth + 1).has_value();
  if (!e.ok()) {
    FUZZ_CHECK(e.status().code() == kdm::StatusCode::kDataLoss, "refusal code: " << e.status());
    FUZZ_CHECK(!deep, "a deep line reached the parser");
    return;
  }
  FUZZ_CHECK((e->kind == PodWatchEvent::Kind::kRefused) == deep, "refused exactly the deep lines");
  switch (e->kind) {
    case PodWatchEvent::Kind::kRefused:
      FUZZ_CHECK(!e->refusal.empty(), "a refusal without a reason");
      break;
    case PodWatchEvent::Kind::kBookmark:
      FUZZ_CHECK(!e->resource_version.empty(), "a bookmark without a version");
      break;
    case PodWatchEvent::Kind::kGone:
      break;
    case PodWatchEvent::Kind::kPod:
      CheckPod(e->pod);
      FUZZ_CHECK(e->resource_version == e->pod.resource_version, "the version to go on from");
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<kdm::kube::PodList> list = kdm::kube::DecodePodList(text);
  if (!list.ok()) {
    FUZZ_CHECK(list.status().code() == kdm::StatusCode::kDataLoss,
               "refusal code: " << list.status());
  } else {
    FUZZ_CHECK(!list->resource_version.empty(), "a list without a version");
    for (const auto& pod : list->pods) CheckPod(pod);
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
