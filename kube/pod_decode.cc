#include "kdm/kube/pod_decode.h"

#include <nlohmann/json.hpp>
#include <utility>

#include "kdm/k8s/quantity.h"
#include "kdm/kube/watch_json.h"

namespace kdm::kube {
namespace {

using nlohmann::json;

// The longest PodObject::error kept: a field's path and a quantity's text
// come from outside and may be megabytes long.
constexpr size_t kMaxPodErrorBytes = 512;

Status BadPodField(const std::string& where, const std::string& what) {
  return InvalidArgumentError(where + ": " + what);
}

// object[key] when present and not null, else nullptr.
const json* PodMemberOrNull(const json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

// object[key] as a string: "" when absent or null, an error when another type.
Status ReadPodString(const json& object, const char* key, const std::string& where,
                     std::string* out) {
  const json* v = PodMemberOrNull(object, key);
  if (v == nullptr) return OkStatus();
  if (!v->is_string()) return BadPodField(where, "must be a string");
  *out = v->get<std::string>();
  return OkStatus();
}

// A limits or requests map: every resource, each a quantity string.
Status ReadResourceAmounts(const json& v, const std::string& where,
                           std::map<std::string, k8s::Quantity>* out) {
  if (!v.is_object()) return BadPodField(where, "must be an object");
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string at = where + "['" + it.key() + "']";
    if (!it->is_string()) return BadPodField(at, "must be a quantity string such as \"2\"");
    StatusOr<k8s::Quantity> q = k8s::Quantity::Parse(it->get_ref<const std::string&>());
    if (!q.ok()) return BadPodField(at, std::string(q.status().message()));
    (*out)[it.key()] = std::move(*q);
  }
  return OkStatus();
}

Status ReadPodContainer(const json& v, const std::string& where, bool init, k8s::Container* c) {
  if (!v.is_object()) return BadPodField(where, "must be an object");
  KDM_RETURN_IF_ERROR(ReadPodString(v, "name", where + ".name", &c->name));
  std::string restart_policy;
  KDM_RETURN_IF_ERROR(ReadPodString(v, "restartPolicy", where + ".restartPolicy", &restart_policy));
  c->restartable = init && restart_policy == "Always";
  const json* resources = PodMemberOrNull(v, "resources");
  if (resources == nullptr) return OkStatus();
  if (!resources->is_object()) return BadPodField(where + ".resources", "must be an object");
  if (const json* limits = PodMemberOrNull(*resources, "limits")) {
    KDM_RETURN_IF_ERROR(ReadResourceAmounts(*limits, where + ".resources.limits", &c->limits));
  }
  if (const json* requests = PodMemberOrNull(*resources, "requests")) {
    KDM_RETURN_IF_ERROR(
        ReadResourceAmounts(*requests, where + ".resources.requests", &c->requests));
  }
  return OkStatus();
}

Status ReadPodContainers(const json& spec, const char* key, bool init,
                         std::vector<k8s::Container>* out) {
  const std::string where = std::string("spec.") + key;
  const json* list = PodMemberOrNull(spec, key);
  if (list == nullptr) return OkStatus();
  if (!list->is_array()) return BadPodField(where, "must be an array");
  for (size_t i = 0; i < list->size(); ++i) {
    out->emplace_back();
    KDM_RETURN_IF_ERROR(
        ReadPodContainer((*list)[i], where + "[" + std::to_string(i) + "]", init, &out->back()));
  }
  return OkStatus();
}

// What follows a pod's identity: node, phase, containers. An error names the
// first field that was wrong.
Status ReadPodBody(const json& object, PodObject* pod) {
  const json& metadata = object["metadata"];  // there: the identity was read
  pod->deleting = PodMemberOrNull(metadata, "deletionTimestamp") != nullptr;
  if (const json* status = PodMemberOrNull(object, "status")) {
    if (!status->is_object()) return BadPodField("status", "must be an object");
    KDM_RETURN_IF_ERROR(ReadPodString(*status, "phase", "status.phase", &pod->phase));
  }
  const json* spec = PodMemberOrNull(object, "spec");
  if (spec == nullptr) return OkStatus();
  if (!spec->is_object()) return BadPodField("spec", "must be an object");
  KDM_RETURN_IF_ERROR(ReadPodString(*spec, "nodeName", "spec.nodeName", &pod->node_name));
  KDM_RETURN_IF_ERROR(
      ReadPodContainers(*spec, "initContainers", /*init=*/true, &pod->pod.init_containers));
  return ReadPodContainers(*spec, "containers", /*init=*/false, &pod->pod.containers);
}

StatusOr<PodObject> ToPod(const json& object) {
  if (!object.is_object()) return InvalidArgumentError("the object is not a JSON object");
  PodObject pod;
  pod.name = internal::JsonStringAt(object, "metadata", "name");
  if (pod.name.empty()) return InvalidArgumentError("the object has no metadata.name");
  pod.namespace_name = internal::JsonStringAt(object, "metadata", "namespace");
  if (pod.namespace_name.empty()) {
    return InvalidArgumentError("the object has no metadata.namespace");
  }
  pod.uid = internal::JsonStringAt(object, "metadata", "uid");
  if (pod.uid.empty()) return InvalidArgumentError("the object has no metadata.uid");
  pod.resource_version = internal::JsonStringAt(object, "metadata", "resourceVersion");
  pod.pod.uid = pod.uid;
  pod.pod.namespace_name = pod.namespace_name;
  pod.pod.name = pod.name;
  if (Status s = ReadPodBody(object, &pod); !s.ok()) {
    pod.error = std::string(s.message());
    if (pod.error.size() > kMaxPodErrorBytes) {
      size_t keep = kMaxPodErrorBytes - 3;
      // Cut at a UTF-8 character's start.
      while (keep > 0 && (static_cast<unsigned char>(pod.error[keep]) & 0xC0) == 0x80) --keep;
      pod.error.resize(keep);
      pod.error += "...";
    }
    pod.pod.init_containers.clear();
    pod.pod.containers.clear();
  }
  return pod;
}

}  // namespace

StatusOr<PodWatchEvent> DecodePodWatchLine(std::string_view line) {
  KDM_ASSIGN_OR_RETURN(internal::RawWatchLine raw, internal::ReadWatchLine(line, kMaxPodJsonDepth));
  PodWatchEvent out;
  switch (raw.kind) {
    case internal::RawWatchLine::Kind::kRefused:
      out.kind = PodWatchEvent::Kind::kRefused;
      out.refusal = std::move(raw.refusal);
      return out;
    case internal::RawWatchLine::Kind::kGone:
      out.kind = PodWatchEvent::Kind::kGone;
      return out;
    case internal::RawWatchLine::Kind::kBookmark:
      out.kind = PodWatchEvent::Kind::kBookmark;
      out.resource_version = std::move(raw.resource_version);
      return out;
    case internal::RawWatchLine::Kind::kObject:
      break;
  }
  out.type = internal::EventTypeOf<PodEventType>(raw.type);
  StatusOr<PodObject> pod = ToPod(raw.object());
  if (!pod.ok()) return internal::BadWatchLine(line, std::string(pod.status().message()));
  out.pod = std::move(*pod);
  out.resource_version = out.pod.resource_version;
  return out;
}

StatusOr<PodList> DecodePodList(std::string_view body) {
  KDM_ASSIGN_OR_RETURN(internal::RawList raw, internal::ReadList(body, kMaxPodJsonDepth));
  PodList out;
  out.resource_version = std::move(raw.resource_version);
  out.refused = std::move(raw.refused);
  out.pods.reserve(raw.items.size());
  for (size_t i = 0; i < raw.items.size(); ++i) {
    StatusOr<PodObject> pod = ToPod(*raw.items[i]);
    if (!pod.ok()) {
      return DataLossError("items[" + std::to_string(raw.item_index[i]) +
                           "]: " + pod.status().message());
    }
    out.pods.push_back(std::move(*pod));
  }
  return out;
}

}  // namespace kdm::kube
