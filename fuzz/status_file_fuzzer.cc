// Fuzz target: the status files' parser (fakes/status_file.h), every input
// read both as a pod's status file and as node.json.
//
// Properties:
// - a refusal is INVALID_ARGUMENT;
// - an accepted input renders back (RenderPodStatus / RenderNodeStatus) to
//   text that parses again, and rendering that is a fixed point: parse ->
//   render -> parse -> render gives the same text;
// - an accepted pod status has phase Admitted or Rejected; an accepted node
//   status has allocatable <= capacity and no negative count.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/fakes/status_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kdm::fakes;
  const std::string_view text(reinterpret_cast<const char*>(data), size);

  kdm::StatusOr<PodStatus> pod = ParsePodStatus(text);
  if (!pod.ok()) {
    FUZZ_CHECK(pod.status().code() == kdm::StatusCode::kInvalidArgument, pod.status());
  } else {
    FUZZ_CHECK(pod->phase == kPhaseAdmitted || pod->phase == kPhaseRejected, pod->phase);
    const std::string rendered = RenderPodStatus(*pod);
    kdm::StatusOr<PodStatus> again = ParsePodStatus(rendered);
    FUZZ_CHECK(again.ok(), "a rendered pod status does not parse: " << again.status());
    FUZZ_CHECK(RenderPodStatus(*again) == rendered, "pod rendering is not a fixed point");
  }

  kdm::StatusOr<NodeStatus> node = ParseNodeStatus(text);
  if (!node.ok()) {
    FUZZ_CHECK(node.status().code() == kdm::StatusCode::kInvalidArgument, node.status());
  } else {
    for (const auto& [resource, amounts] : node->capacity.resources) {
      FUZZ_CHECK(amounts.allocatable >= 0 && amounts.allocatable <= amounts.capacity, resource);
    }
    FUZZ_CHECK(node->registrations >= 0, node->registrations);
    const std::string rendered = RenderNodeStatus(*node);
    kdm::StatusOr<NodeStatus> again = ParseNodeStatus(rendered);
    FUZZ_CHECK(again.ok(), "a rendered node status does not parse: " << again.status());
    FUZZ_CHECK(RenderNodeStatus(*again) == rendered, "node rendering is not a fixed point");
  }
  return 0;
}
