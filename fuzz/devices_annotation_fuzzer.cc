// Fuzz target: the kdm.io/devices annotation reader (k8s/devices_annotation.h).
//
// Properties of every input:
// - the extender's reader (DecodeNodeDevices) gives the same verdict as
//   DecodeDevicesAnnotation, with an empty topology cache and with the one
//   cache every input of the run shares (a verdict never depends on what
//   was read before), and the same free devices, pods and policies;
// - a refusal is INVALID_ARGUMENT (OUT_OF_RANGE above the size bound) and
//   starts with "kdm.io/devices: ";
// - an accepted value has unique device ids, `available` within `devices`,
//   a topology (when present) over exactly those devices, `pods` sorted
//   without duplicates and within kMaxAnnotationPods; it encodes to a
//   value that decodes to an equal annotation, and encoding is a fixed point.
#include <cstddef>
#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/k8s/devices_annotation.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  kdm::StatusOr<kdm::k8s::DevicesAnnotation> a = kdm::k8s::DecodeDevicesAnnotation(text);
  static kdm::k8s::TopologyCache* shared = new kdm::k8s::TopologyCache(size_t{256} << 10);
  kdm::k8s::TopologyCache fresh;
  for (kdm::k8s::TopologyCache* cache : {&fresh, shared}) {
    kdm::StatusOr<kdm::k8s::NodeDevices> view = kdm::k8s::DecodeNodeDevices(text, cache);
    FUZZ_CHECK(view.ok() == a.ok(), "verdicts differ: " << view.status() << " vs " << a.status());
    if (!a.ok()) {
      FUZZ_CHECK(view.status() == a.status(),
                 "messages differ: " << view.status() << " vs " << a.status());
      continue;
    }
    FUZZ_CHECK(view->pods == a->pods, "pods differ");
    for (const auto& [name, r] : a->resources) {
      auto it = view->resources.find(name);
      FUZZ_CHECK(it != view->resources.end(), "resource " << name << " missing");
      FUZZ_CHECK(it->second.device_count == static_cast<int>(r.devices.size()), "count");
      FUZZ_CHECK(it->second.available.size() == r.available.size(), "available");
      FUZZ_CHECK(it->second.policy == r.policy, "policy");
      FUZZ_CHECK((it->second.topology != nullptr) == r.topology.has_value(), "topology");
      if (r.topology) {
        const kdm::topology::Topology& t = it->second.topology->topology;
        FUZZ_CHECK(t.size() == r.topology->size(), "topology size");
        for (int i = 0; i < t.size(); ++i) {
          FUZZ_CHECK(t.Device(i).numa == r.topology->Device(i).numa, "numa " << i);
          for (int j = 0; j < t.size(); ++j) {
            FUZZ_CHECK(t.LinkBetween(i, j) == r.topology->LinkBetween(i, j), "link");
          }
        }
      }
    }
  }
  if (!a.ok()) {
    FUZZ_CHECK(a.status().code() == kdm::StatusCode::kInvalidArgument ||
                   a.status().code() == kdm::StatusCode::kOutOfRange,
               "refusal code: " << a.status());
    FUZZ_CHECK(a.status().message().rfind("kdm.io/devices: ", 0) == 0,
               "refusal does not say what: " << a.status());
    return 0;
  }
  if (a->pods) {
    FUZZ_CHECK(a->pods->size() <= kdm::k8s::kMaxAnnotationPods, "pods: " << a->pods->size());
    for (size_t i = 1; i < a->pods->size(); ++i) {
      FUZZ_CHECK((*a->pods)[i - 1] < (*a->pods)[i], "pods not sorted and unique at " << i);
    }
  }
  for (const auto& [name, r] : a->resources) {
    std::set<std::string> ids;
    for (const auto& d : r.devices) FUZZ_CHECK(ids.insert(d.id).second, "duplicate " << d.id);
    for (const std::string& id : r.available) FUZZ_CHECK(ids.count(id), "available " << id);
    if (r.topology) {
      FUZZ_CHECK(r.topology->size() == static_cast<int>(r.devices.size()), "matrix size");
      for (size_t i = 0; i < r.devices.size(); ++i) {
        FUZZ_CHECK(r.topology->Device(static_cast<int>(i)).id == r.devices[i].id, "row " << i);
      }
    }
  }
  std::string encoded = kdm::k8s::EncodeDevicesAnnotation(*a);
  kdm::StatusOr<kdm::k8s::DevicesAnnotation> back = kdm::k8s::DecodeDevicesAnnotation(encoded);
  // Names that are not UTF-8 are written with replacement characters, so
  // only the second round is exact.
  FUZZ_CHECK(back.ok(), "the encoding does not decode: " << back.status() << "\n" << encoded);
  std::string again = kdm::k8s::EncodeDevicesAnnotation(*back);
  FUZZ_CHECK(again == encoded, "encoding is not a fixed point:\n" << encoded << "\n" << again);
  if (encoded.size() <= kdm::k8s::kMaxAnnotationBytes && back.ok()) {
    kdm::StatusOr<kdm::k8s::DevicesAnnotation> third = kdm::k8s::DecodeDevicesAnnotation(again);
    FUZZ_CHECK(third.ok() && *third == *back, "decode(encode(x)) != x");
  }
  return 0;
}
