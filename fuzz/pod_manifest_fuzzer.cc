// Fuzz target: the pod manifest reader (fakes/pod_manifest.h), both syntaxes:
// every input is parsed as "pod.yaml" and as "pod.json".
//
// Properties of every accepted input:
// - the pod has a uid, a DNS-1123 name and namespace, at least one app
//   container, unique container names; the identity out-parameter matches;
// - every extended (device) resource has a whole, non-negative count in
//   limits and request == limit;
// - the pod written back as a JSON manifest parses (as JSON and as YAML) to
//   the same pod: parse -> serialize -> parse is the identity;
// - a document both readers accept gives the same pod (YAML is not quite a
//   superset of JSON, so one may refuse what the other accepts).
// Rejections must carry a message that starts with the file name.
#include <cstddef>
#include <cstdint>
#include <exception>
#include <set>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/fakes/pod_manifest.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"
#include "nlohmann/json.hpp"

namespace {

using kdm::devicemanager::Container;
using kdm::devicemanager::Pod;

nlohmann::json ContainerJson(const Container& c, bool init) {
  nlohmann::json out = {{"name", c.name}};
  if (init && c.restartable) out["restartPolicy"] = "Always";
  nlohmann::json limits = nlohmann::json::object();
  nlohmann::json requests = nlohmann::json::object();
  for (const auto& [name, q] : c.limits) limits[name] = q.ToString();
  for (const auto& [name, q] : c.requests) requests[name] = q.ToString();
  out["resources"] = {{"limits", limits}, {"requests", requests}};
  nlohmann::json env = nlohmann::json::array();
  for (const auto& [name, value] : c.env) env.push_back({{"name", name}, {"value", value}});
  out["env"] = env;
  return out;
}

// The pod as a JSON manifest; empty when a string is not valid UTF-8 (JSON
// cannot carry it, so there is no round trip to check).
std::string ManifestJson(const Pod& pod) {
  nlohmann::json init = nlohmann::json::array();
  nlohmann::json apps = nlohmann::json::array();
  for (const Container& c : pod.init_containers) init.push_back(ContainerJson(c, true));
  for (const Container& c : pod.containers) apps.push_back(ContainerJson(c, false));
  nlohmann::json doc = {
      {"apiVersion", "v1"},
      {"kind", "Pod"},
      {"metadata", {{"name", pod.name}, {"namespace", pod.namespace_name}, {"uid", pod.uid}}},
      {"spec", {{"initContainers", init}, {"containers", apps}}}};
  try {
    return doc.dump();
  } catch (const std::exception&) {
    return "";
  }
}

bool SameContainers(const std::vector<Container>& a, const std::vector<Container>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].limits != b[i].limits || a[i].requests != b[i].requests ||
        a[i].restartable != b[i].restartable || a[i].env != b[i].env) {
      return false;
    }
  }
  return true;
}

bool SamePod(const Pod& a, const Pod& b) {
  return a.uid == b.uid && a.name == b.name && a.namespace_name == b.namespace_name &&
         SameContainers(a.init_containers, b.init_containers) &&
         SameContainers(a.containers, b.containers);
}

void CheckPod(const Pod& pod, const kdm::fakes::PodIdentity& id) {
  FUZZ_CHECK(!pod.uid.empty(), "a pod without uid");
  FUZZ_CHECK(!pod.name.empty() && pod.name.size() <= 253, "bad pod name " << pod.name);
  FUZZ_CHECK(!pod.namespace_name.empty() && pod.namespace_name.size() <= 63,
             "bad namespace " << pod.namespace_name);
  FUZZ_CHECK(id.name == pod.name && id.namespace_name == pod.namespace_name,
             "identity " << id.namespace_name << "/" << id.name << " for pod " << pod.namespace_name
                         << "/" << pod.name);
  FUZZ_CHECK(!pod.containers.empty(), "a pod without app containers");
  std::set<std::string> names;
  auto check = [&](const Container& c) {
    FUZZ_CHECK(!c.name.empty() && names.insert(c.name).second,
               "empty or duplicate container name " << c.name);
    for (const auto& [name, limit] : c.limits) {
      if (!kdm::k8s::IsExtendedResourceName(name)) continue;
      kdm::StatusOr<int64_t> count = limit.DeviceCount();
      FUZZ_CHECK(count.ok(), "device limit " << name << "=" << limit.ToString()
                                             << " is not a count: " << count.status());
      auto request = c.requests.find(name);
      FUZZ_CHECK(request != c.requests.end() && request->second == limit,
                 "device request != limit for " << name);
    }
    for (const auto& [name, request] : c.requests) {
      FUZZ_CHECK(!request.IsNegative(), "negative request " << name);
      if (kdm::k8s::IsExtendedResourceName(name)) {
        FUZZ_CHECK(c.limits.count(name), "device request without limit " << name);
      }
    }
  };
  for (const Container& c : pod.init_containers) check(c);
  for (const Container& c : pod.containers) check(c);
}

void CheckOne(std::string_view text, std::string_view file) {
  kdm::fakes::PodIdentity id;
  kdm::StatusOr<Pod> pod = kdm::fakes::ParsePodManifest(text, file, &id);
  if (!pod.ok()) {
    FUZZ_CHECK(pod.status().message().starts_with(std::string(file) + ": "),
               "the error does not name the file: " << pod.status());
    return;
  }
  CheckPod(*pod, id);
  FUZZ_CHECK(text.find('\0') == std::string_view::npos, "accepted a manifest with a NUL byte");
  std::string json = ManifestJson(*pod);
  if (json.empty()) return;
  for (std::string_view again_file : {"again.json", "again.yaml"}) {
    kdm::StatusOr<Pod> again = kdm::fakes::ParsePodManifest(json, again_file);
    FUZZ_CHECK(again.ok(), again_file << ": the pod written back does not parse: " << again.status()
                                      << "\n"
                                      << json);
    FUZZ_CHECK(SamePod(*pod, *again), again_file << ": the pod written back changed:\n" << json);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  CheckOne(text, "pod.yaml");
  CheckOne(text, "pod.json");
  // YAML is not quite a superset of JSON (a key and its ':' must share a
  // line: `{"a"\r: 1}` is JSON only), so only agreement is checked.
  kdm::StatusOr<Pod> as_json = kdm::fakes::ParsePodManifest(text, "pod.json");
  kdm::StatusOr<Pod> as_yaml = kdm::fakes::ParsePodManifest(text, "pod.yaml");
  if (as_json.ok() && as_yaml.ok()) {
    FUZZ_CHECK(SamePod(*as_json, *as_yaml), "JSON and YAML readers disagree");
  }
  return 0;
}
