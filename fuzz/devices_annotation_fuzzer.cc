// Fuzz target: the kdm.io/devices annotation decoder (kube/annotation.h).
//
// Properties of every input:
// - a refusal is INVALID_ARGUMENT (OUT_OF_RANGE above the size bound) and
//   starts with "kdm.io/devices: ";
// - an accepted value has unique device ids, `available` within `devices`,
//   a topology (when present) over exactly those devices; it encodes to a
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
  if (!a.ok()) {
    FUZZ_CHECK(a.status().code() == kdm::StatusCode::kInvalidArgument ||
                   a.status().code() == kdm::StatusCode::kOutOfRange,
               "refusal code: " << a.status());
    FUZZ_CHECK(a.status().message().rfind("kdm.io/devices: ", 0) == 0,
               "refusal does not say what: " << a.status());
    return 0;
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
