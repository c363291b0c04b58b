// Helpers for the scheduler tests: annotations and Node objects built from
// presets with kdm's own encoder.
#ifndef KDM_TEST_SCHEDULER_SCHEDULER_TEST_UTIL_H_
#define KDM_TEST_SCHEDULER_SCHEDULER_TEST_UTIL_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/scheduler/extender_json.h"
#include "kdm/topology/presets.h"

namespace kdm::scheduler::test {

inline constexpr char kGpu[] = "nvidia.com/gpu";

// The annotation of a node with `t`'s devices, the ones at `available` free.
inline std::string MakeAnnotation(const std::string& node, const topology::Topology& t,
                                  const std::vector<int>& available,
                                  std::optional<k8s::DeviceAttributes> attributes = {},
                                  bool with_matrix = true) {
  k8s::ResourceInput in;
  for (const auto& d : t.devices()) in.allocatable[d.id] = d.numa;
  for (const auto& d : t.devices()) in.in_use.insert(d.id);
  for (int i : available) in.in_use.erase(t.Device(i).id);
  in.topology = with_matrix ? &t : nullptr;
  in.attributes = attributes;
  k8s::DevicesAnnotation a{.node = node, .updated = "2026-11-24T23:00:00Z"};
  a.resources[kGpu] = k8s::BuildResourceDevices(in);
  return k8s::EncodeDevicesAnnotation(a);
}

// A Node object's JSON with the annotation (when given).
inline std::string MakeNode(const std::string& name, const std::optional<std::string>& annotation) {
  std::string out = "{\"kind\":\"Node\",\"apiVersion\":\"v1\",\"metadata\":{\"name\":";
  AppendJsonString(name, &out);
  out += ",\"labels\":{\"kubernetes.io/hostname\":";
  AppendJsonString(name, &out);
  out += "}";
  if (annotation) {
    out += ",\"annotations\":{\"kdm.io/devices\":";
    AppendJsonString(*annotation, &out);
    out += "}";
  }
  out += "},\"status\":{\"capacity\":{\"cpu\":\"64\",\"nvidia.com/gpu\":\"8\"}}}";
  return out;
}

// A pod asking `gpus` devices in one container, with optional env.
inline std::string MakePod(int gpus, const std::map<std::string, std::string>& env = {}) {
  std::string out =
      "{\"metadata\":{\"name\":\"train\",\"namespace\":\"ml\"},\"spec\":{\"containers\":[{"
      "\"name\":\"main\",\"env\":[";
  bool first = true;
  for (const auto& [k, v] : env) {
    if (!first) out += ",";
    first = false;
    out += "{\"name\":";
    AppendJsonString(k, &out);
    out += ",\"value\":";
    AppendJsonString(v, &out);
    out += "}";
  }
  out += "],\"resources\":{\"limits\":{\"cpu\":\"4\",\"nvidia.com/gpu\":\"" + std::to_string(gpus) +
         "\"},\"requests\":{\"nvidia.com/gpu\":\"" + std::to_string(gpus) + "\"}}}]}}";
  return out;
}

inline std::string MakeArgs(const std::string& pod, const std::vector<std::string>& nodes) {
  std::string out = "{\"Pod\":" + pod + ",\"Nodes\":{\"metadata\":{},\"items\":[";
  for (size_t i = 0; i < nodes.size(); ++i) out += (i ? "," : "") + nodes[i];
  return out + "]},\"NodeNames\":null}";
}

}  // namespace kdm::scheduler::test

#endif  // KDM_TEST_SCHEDULER_SCHEDULER_TEST_UTIL_H_
