#include "kdm/scheduler/extender_json.h"

#include <simdjson.h>

#include <utility>

#include "kdm/k8s/devices_annotation.h"
#include "kdm/k8s/names.h"
#include "kdm/k8s/pod.h"
#include "kdm/k8s/requirements.h"

namespace kdm::scheduler {
namespace {

namespace od = simdjson::ondemand;

Status BadRequest(const std::string& where, const std::string& what) {
  return InvalidArgumentError(where + ": " + what);
}

// The longest pod-refused message and container name a filter reason
// repeats per node (a reason must not grow with the request's text).
constexpr size_t kMaxRefusedMessageBytes = 512;
constexpr size_t kMaxShownContainerNameBytes = 63;  // a DNS label's limit

// `text` cut to `max` bytes at a UTF-8 character's start, ending in "...".
std::string CutText(std::string text, size_t max) {
  if (text.size() <= max) return text;
  size_t keep = max > 3 ? max - 3 : 0;
  while (keep > 0 && (static_cast<unsigned char>(text[keep]) & 0xC0) == 0x80) --keep;
  text.resize(keep);
  return text + "...";
}

// A quantity as Kubernetes writes it (a string; a bare JSON number is read
// as its text), with the full grammar (k8s::Quantity): "2", "2k", "1e3".
StatusOr<k8s::Quantity> ReadQuantity(od::value v, const std::string& where) {
  od::json_type type;
  if (v.type().get(type)) return BadRequest(where, "not JSON");
  std::string_view s;
  if (type == od::json_type::number) {
    s = v.raw_json_token();
    while (!s.empty() &&
           (s.back() == ' ' || s.back() == '\n' || s.back() == '\t' || s.back() == '\r')) {
      s.remove_suffix(1);
    }
  } else if (type != od::json_type::string || v.get_string().get(s)) {
    return BadRequest(where, "must be a quantity string such as \"2\"");
  }
  StatusOr<k8s::Quantity> q = k8s::Quantity::Parse(s);
  if (!q.ok()) return BadRequest(where, std::string(q.status().message()));
  return q;
}

// The extended resources (k8s::IsExtendedResourceName) of a limits or
// requests map; cpu, memory, hugepages-* and the like are not read.
Status ReadAmounts(od::value v, const std::string& where,
                   std::map<std::string, k8s::Quantity>* out) {
  od::object o;
  if (v.get_object().get(o)) return BadRequest(where, "must be an object");
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return BadRequest(where, "bad key");
    std::string name(key);
    if (!k8s::IsExtendedResourceName(name)) continue;
    KDM_ASSIGN_OR_RETURN(k8s::Quantity q, ReadQuantity(f.value(), where + "['" + name + "']"));
    (*out)[name] = std::move(q);
  }
  return OkStatus();
}

Status ReadContainer(od::value v, const std::string& where, k8s::Container* c) {
  od::object o;
  if (v.get_object().get(o)) return BadRequest(where, "must be an object");
  for (auto f : o) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return BadRequest(where, "bad key");
    if (key == "name") {
      std::string_view s;
      if (f.value().get_string().get(s)) return BadRequest(where + ".name", "must be a string");
      c->name = std::string(s);
    } else if (key == "restartPolicy") {
      std::string_view s;
      if (f.value().get_string().get(s))
        return BadRequest(where + ".restartPolicy", "must be a string");
      c->restartable = s == "Always";
    } else if (key == "env") {
      od::array env;
      if (f.value().get_array().get(env)) return BadRequest(where + ".env", "must be an array");
      size_t i = 0;
      for (auto item : env) {
        const std::string at = where + ".env[" + std::to_string(i++) + "]";
        od::object e;
        if (item.get_object().get(e)) return BadRequest(at, "must be an object");
        std::string name, value;
        for (auto ef : e) {
          std::string_view k, s;
          if (ef.unescaped_key().get(k)) return BadRequest(at, "bad key");
          if (k != "name" && k != "value") continue;
          if (ef.value().get_string().get(s))
            return BadRequest(at + "." + std::string(k), "must be a string");
          (k == "name" ? name : value) = std::string(s);
        }
        c->env.emplace_back(std::move(name), std::move(value));
      }
    } else if (key == "resources") {
      od::object r;
      if (f.value().get_object().get(r))
        return BadRequest(where + ".resources", "must be an object");
      for (auto rf : r) {
        std::string_view k;
        if (rf.unescaped_key().get(k)) return BadRequest(where + ".resources", "bad key");
        if (k == "limits") {
          KDM_RETURN_IF_ERROR(ReadAmounts(rf.value(), where + ".resources.limits", &c->limits));
        } else if (k == "requests") {
          KDM_RETURN_IF_ERROR(ReadAmounts(rf.value(), where + ".resources.requests", &c->requests));
        }
      }
    }
  }
  return OkStatus();
}

Status ReadContainers(od::value v, const std::string& where, std::vector<k8s::Container>* out) {
  od::json_type type;
  if (v.type().get(type)) return BadRequest(where, "not JSON");
  if (type == od::json_type::null) return OkStatus();
  od::array a;
  if (v.get_array().get(a)) return BadRequest(where, "must be an array");
  for (auto item : a) {
    out->emplace_back();
    od::value cv;
    if (item.get(cv)) return BadRequest(where, "not JSON");
    KDM_RETURN_IF_ERROR(
        ReadContainer(cv, where + "[" + std::to_string(out->size() - 1) + "]", &out->back()));
  }
  return OkStatus();
}

StatusOr<PodRequest> ReadPod(od::value v) {
  od::object pod;
  if (v.get_object().get(pod)) return BadRequest("Pod", "must be an object (a v1.Pod)");
  std::string name = "?", ns = "default", uid;
  k8s::Pod model;
  std::vector<k8s::Container>& init = model.init_containers;
  std::vector<k8s::Container>& app = model.containers;
  for (auto f : pod) {
    std::string_view key;
    if (f.unescaped_key().get(key)) return BadRequest("Pod", "bad key");
    if (key == "metadata") {
      od::object m;
      if (f.value().get_object().get(m)) return BadRequest("Pod.metadata", "must be an object");
      for (auto mf : m) {
        std::string_view k, s;
        if (mf.unescaped_key().get(k)) return BadRequest("Pod.metadata", "bad key");
        if (k != "name" && k != "namespace" && k != "uid") continue;
        if (mf.value().get_string().get(s)) {
          return BadRequest("Pod.metadata." + std::string(k), "must be a string");
        }
        (k == "name" ? name : k == "uid" ? uid : ns) = std::string(s);
      }
    } else if (key == "spec") {
      od::object spec;
      if (f.value().get_object().get(spec)) return BadRequest("Pod.spec", "must be an object");
      for (auto sf : spec) {
        std::string_view k;
        if (sf.unescaped_key().get(k)) return BadRequest("Pod.spec", "bad key");
        if (k == "containers") {
          KDM_RETURN_IF_ERROR(ReadContainers(sf.value(), "Pod.spec.containers", &app));
        } else if (k == "initContainers") {
          KDM_RETURN_IF_ERROR(ReadContainers(sf.value(), "Pod.spec.initContainers", &init));
        }
      }
    }
  }
  PodRequest out;
  out.name = ns + "/" + name;
  out.uid = std::move(uid);
  out.namespace_name = ns;
  out.pod_name = name;
  // The kubelet's rule, the one the device manager's Ledger applies: a pod
  // it would refuse is refused on every node that has the resource.
  StatusOr<std::map<std::string, int64_t>> effective = k8s::EffectiveDeviceRequests(
      model, [](const std::string& r) { return k8s::IsExtendedResourceName(r); });
  if (effective.ok()) {
    out.resources.insert(effective->begin(), effective->end());
  } else {
    out.refused = CutText(std::string(effective.status().message()), kMaxRefusedMessageBytes);
    for (const auto* list : {&init, &app}) {
      for (const k8s::Container& c : *list) {
        for (const auto* amounts : {&c.limits, &c.requests}) {
          for (const auto& [r, q] : *amounts) out.refused_resources.insert(r);
        }
      }
    }
  }
  for (const auto* list : {&init, &app}) {
    const char* field = list == &init ? "Pod.spec.initContainers" : "Pod.spec.containers";
    for (size_t i = 0; i < list->size(); ++i) {
      const k8s::Container& c = (*list)[i];
      ContainerRequirements cr;
      for (const auto& [r, q] : c.limits) {
        if (!q.IsZero() && !q.IsNegative()) cr.resources.push_back(r);
      }
      if (cr.resources.empty()) continue;
      StatusOr<k8s::RequirementSet> set = k8s::ParseRequirementEnv(c.env);
      if (!set.ok()) {
        return BadRequest(std::string(field) + "[" + std::to_string(i) + "].env",
                          std::string(set.status().message()));
      }
      if (set->empty()) continue;
      cr.container = CutText(c.name, kMaxShownContainerNameBytes);
      cr.requirements = std::move(*set);
      out.requirements.push_back(std::move(cr));
    }
  }
  return out;
}

Status ReadNode(od::value v, const std::string& where, NodeItem* node) {
  od::object o;
  if (v.get_object().get(o)) return BadRequest(where, "must be an object (a v1.Node)");
  od::value meta;
  if (auto e = o.find_field_unordered("metadata").get(meta); e) {
    return BadRequest(where + ".metadata", e == simdjson::NO_SUCH_FIELD ? "missing" : "not JSON");
  }
  od::object m;
  if (meta.get_object().get(m)) return BadRequest(where + ".metadata", "must be an object");
  for (auto mf : m) {
    std::string_view k;
    if (mf.unescaped_key().get(k)) return BadRequest(where + ".metadata", "bad key");
    if (k == "name") {
      std::string_view s;
      if (mf.value().get_string().get(s))
        return BadRequest(where + ".metadata.name", "must be a string");
      node->name = std::string(s);
    } else if (k == "annotations") {
      od::value av;
      if (mf.value().get(av)) return BadRequest(where + ".metadata.annotations", "not JSON");
      // is_null() is an error (not false) for a token that starts like null
      // and is not one: taken as a bool, that error would throw.
      bool null = false;
      if (av.is_null().get(null)) {
        return BadRequest(where + ".metadata.annotations", "must be an object");
      }
      if (null) continue;
      od::object a;
      if (av.get_object().get(a))
        return BadRequest(where + ".metadata.annotations", "must be an object");
      for (auto af : a) {
        std::string_view ak;
        if (af.unescaped_key().get(ak))
          return BadRequest(where + ".metadata.annotations", "bad key");
        if (ak != k8s::kDevicesAnnotationKey) continue;
        std::string_view s;
        if (af.value().get_string().get(s)) {
          return BadRequest(where + ".metadata.annotations['kdm.io/devices']", "must be a string");
        }
        // Room for simdjson's padding, so that it is read in place.
        node->annotation.emplace();
        node->annotation->reserve(s.size() + k8s::DecodePadding());
        node->annotation->assign(s);
      }
    }
  }
  if (node->name.empty()) return BadRequest(where + ".metadata.name", "missing");
  if (o.reset().error() || o.raw_json().get(node->raw)) return BadRequest(where, "not JSON");
  return OkStatus();
}

Status ReadNodes(od::value v, std::optional<std::vector<NodeItem>>* out) {
  od::json_type type;
  if (v.type().get(type)) return BadRequest("Nodes", "not JSON");
  if (type == od::json_type::null) return OkStatus();
  od::object list;
  if (v.get_object().get(list)) return BadRequest("Nodes", "must be an object (a v1.NodeList)");
  out->emplace();
  for (auto f : list) {
    std::string_view k;
    if (f.unescaped_key().get(k)) return BadRequest("Nodes", "bad key");
    if (k != "items") continue;
    od::value iv;
    if (f.value().get(iv)) return BadRequest("Nodes.items", "not JSON");
    bool null = false;
    if (iv.is_null().get(null)) return BadRequest("Nodes.items", "must be an array");
    if (null) continue;
    od::array items;
    if (iv.get_array().get(items)) return BadRequest("Nodes.items", "must be an array");
    for (auto item : items) {
      (*out)->emplace_back();
      od::value nv;
      if (item.get(nv)) return BadRequest("Nodes.items", "not JSON");
      KDM_RETURN_IF_ERROR(
          ReadNode(nv, "Nodes.items[" + std::to_string((*out)->size() - 1) + "]", &(*out)->back()));
    }
  }
  return OkStatus();
}

Status ReadNodeNames(od::value v, std::optional<std::vector<std::string>>* out) {
  od::json_type type;
  if (v.type().get(type)) return BadRequest("NodeNames", "not JSON");
  if (type == od::json_type::null) return OkStatus();
  od::array a;
  if (v.get_array().get(a)) return BadRequest("NodeNames", "must be an array of strings");
  out->emplace();
  for (auto item : a) {
    std::string_view s;
    if (item.get_string().get(s)) {
      return BadRequest("NodeNames[" + std::to_string((*out)->size()) + "]", "must be a string");
    }
    (*out)->emplace_back(s);
  }
  return OkStatus();
}

}  // namespace

size_t BodyPadding() { return simdjson::SIMDJSON_PADDING; }

void PadBody(std::string* body) { body->reserve(body->size() + simdjson::SIMDJSON_PADDING); }

StatusOr<ExtenderArgs> DecodeExtenderArgs(const std::string& body) {
  simdjson::padded_string copy;
  simdjson::padded_string_view view;
  if (body.capacity() >= body.size() + simdjson::SIMDJSON_PADDING) {
    view = simdjson::padded_string_view(body.data(), body.size(), body.capacity());
  } else {
    copy = simdjson::padded_string(body);
    view = copy;
  }
  thread_local od::parser parser;
  od::document doc;
  if (auto e = parser.iterate(view).get(doc); e) {
    return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
  }
  od::object root;
  if (auto e = doc.get_object().get(root); e) {
    // An object left open (a deep "[[[[..." included) is not JSON, not
    // another type.
    if (e != simdjson::INCORRECT_TYPE) {
      return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
    }
    return InvalidArgumentError("body must be a JSON object (ExtenderArgs)");
  }
  ExtenderArgs args;
  bool has_pod = false;
  for (auto f : root) {
    std::string_view key;
    if (auto e = f.unescaped_key().get(key); e) {
      return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
    }
    od::value v;
    if (auto e = f.value().get(v); e) {
      return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
    }
    if (key == "Pod") {
      bool null = false;
      if (v.is_null().get(null)) return BadRequest("Pod", "must be an object (a v1.Pod)");
      if (null) continue;
      KDM_ASSIGN_OR_RETURN(args.pod, ReadPod(v));
      has_pod = true;
    } else if (key == "Nodes") {
      KDM_RETURN_IF_ERROR(ReadNodes(v, &args.nodes));
    } else if (key == "NodeNames") {
      KDM_RETURN_IF_ERROR(ReadNodeNames(v, &args.node_names));
    }
  }
  if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS)
    return InvalidArgumentError("body is not JSON: text after the object");
  if (!has_pod) return InvalidArgumentError("Pod: missing");
  if (!args.nodes && !args.node_names) {
    return InvalidArgumentError("neither Nodes nor NodeNames is given");
  }
  return args;
}

StatusOr<BindArgs> DecodeBindingArgs(const std::string& body) {
  simdjson::padded_string copy(body);
  thread_local od::parser parser;
  od::document doc;
  if (auto e = parser.iterate(copy).get(doc); e) {
    return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
  }
  od::object root;
  if (auto e = doc.get_object().get(root); e) {
    if (e != simdjson::INCORRECT_TYPE) {
      return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
    }
    return InvalidArgumentError("body must be a JSON object (ExtenderBindingArgs)");
  }
  BindArgs args;
  for (auto f : root) {
    std::string_view key;
    if (auto e = f.unescaped_key().get(key); e) {
      return InvalidArgumentError(std::string("body is not JSON: ") + simdjson::error_message(e));
    }
    std::string* field = key == "PodName"        ? &args.pod_name
                         : key == "PodNamespace" ? &args.pod_namespace
                         : key == "PodUID"       ? &args.pod_uid
                         : key == "Node"         ? &args.node
                                                 : nullptr;
    if (field == nullptr) continue;
    std::string_view v;
    if (f.value().get_string().get(v)) return BadRequest(std::string(key), "must be a string");
    *field = std::string(v);
  }
  if (doc.current_location().error() != simdjson::OUT_OF_BOUNDS)
    return InvalidArgumentError("body is not JSON: text after the object");
  // Names go into an API path: only what the API server accepts.
  if (!k8s::IsDns1123Subdomain(args.pod_name)) {
    return BadRequest("PodName", "must be a DNS-1123 subdomain (a pod name)");
  }
  if (!k8s::IsDns1123Label(args.pod_namespace)) {
    return BadRequest("PodNamespace", "must be a DNS-1123 label (a namespace)");
  }
  if (args.pod_uid.empty() || args.pod_uid.size() > k8s::kMaxNameBytes) {
    return BadRequest("PodUID", "must be 1 to 253 bytes");
  }
  if (!k8s::IsDns1123Subdomain(args.node)) {
    return BadRequest("Node", "must be a DNS-1123 subdomain (a node name)");
  }
  return args;
}

std::string EncodeBindingResult(std::string_view error) {
  std::string out = "{\"Error\":";
  AppendJsonString(error, &out);
  out.push_back('}');
  return out;
}

void AppendJsonString(std::string_view s, std::string* out) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          out->append("\\u00");
          out->push_back(kHex[c >> 4]);
          out->push_back(kHex[c & 15]);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

namespace {

void AppendReasons(const std::map<std::string, std::string>& m, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) out->push_back(',');
    first = false;
    AppendJsonString(k, out);
    out->push_back(':');
    AppendJsonString(v, out);
  }
  out->push_back('}');
}

}  // namespace

std::string EncodeFilterAnswer(const FilterAnswer& answer) {
  std::string out;
  size_t reserve = 256;
  if (answer.nodes) {
    for (std::string_view n : *answer.nodes) reserve += n.size() + 1;
  }
  out.reserve(reserve);
  out.append("{\"Nodes\":");
  if (answer.nodes) {
    out.append("{\"metadata\":{},\"items\":[");
    for (size_t i = 0; i < answer.nodes->size(); ++i) {
      if (i) out.push_back(',');
      out.append((*answer.nodes)[i]);
    }
    out.append("]}");
  } else {
    out.append("null");
  }
  out.append(",\"NodeNames\":");
  if (answer.node_names) {
    out.push_back('[');
    for (size_t i = 0; i < answer.node_names->size(); ++i) {
      if (i) out.push_back(',');
      AppendJsonString((*answer.node_names)[i], &out);
    }
    out.push_back(']');
  } else {
    out.append("null");
  }
  out.append(",\"FailedNodes\":");
  AppendReasons(answer.failed, &out);
  out.append(",\"FailedAndUnresolvableNodes\":");
  AppendReasons(answer.unresolvable, &out);
  out.append(",\"Error\":");
  AppendJsonString(answer.error, &out);
  out.push_back('}');
  return out;
}

std::string EncodePriorityList(const std::vector<std::pair<std::string, int>>& scores) {
  std::string out = "[";
  for (size_t i = 0; i < scores.size(); ++i) {
    if (i) out.push_back(',');
    out.append("{\"Host\":");
    AppendJsonString(scores[i].first, &out);
    out.append(",\"Score\":").append(std::to_string(scores[i].second)).push_back('}');
  }
  out.push_back(']');
  return out;
}

std::string EncodeError(std::string_view message) {
  std::string out = "{\"Error\":";
  AppendJsonString(message, &out);
  out.push_back('}');
  return out;
}

}  // namespace kdm::scheduler
