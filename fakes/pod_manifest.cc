#include "kdm/fakes/pod_manifest.h"

#include <fcntl.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "kdm/base/env.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"

namespace kdm::fakes {
namespace {

using devicemanager::Container;
using devicemanager::Pod;
using devicemanager::Quantity;
using nlohmann::json;
// Kubernetes' naming rules: the wire layer's, so that a pod can ask for
// every resource a plugin can register, and for nothing else.
using k8s::IsDns1123Label;
using k8s::IsDns1123Subdomain;
using k8s::IsExtendedResourceName;
using k8s::IsQualifiedNamePart;

std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

std::string BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  return std::string(slash == std::string_view::npos ? path : path.substr(slash + 1));
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// What is left of the expansion bounds while one YAML document is converted
// (see kMaxManifestNodes): an alias is expanded every time it is used, so a
// few hundred bytes can stand for billions of nodes.
struct ExpansionBudget {
  size_t nodes = 0;
  size_t bytes = 0;

  // Counts one node holding `scalar_bytes` bytes of text; an error naming the
  // limit once a bound is passed.
  Status Take(size_t scalar_bytes) {
    if (++nodes > kMaxManifestNodes) {
      return InvalidArgumentError("more than " + std::to_string(kMaxManifestNodes) +
                                  " YAML nodes once aliases are expanded (the limit is " +
                                  std::to_string(kMaxManifestNodes) + " nodes)");
    }
    bytes += scalar_bytes;
    if (bytes > kMaxManifestExpandedBytes) {
      return InvalidArgumentError("more than " + std::to_string(kMaxManifestExpandedBytes) +
                                  " bytes of YAML keys and values once aliases are expanded "
                                  "(the limit is " +
                                  std::to_string(kMaxManifestExpandedBytes) + " bytes)");
    }
    return OkStatus();
  }
};

// YAML -> JSON tree. Scalars become strings (YAML gives no reliable type),
// so the walker below accepts a quantity or a name as a string either way.
// Every node (map keys included) is charged to `budget` before it is built.
StatusOr<json> YamlToJson(const YAML::Node& node, int depth, ExpansionBudget& budget) {
  if (depth > 64) return InvalidArgumentError("nested more than 64 levels deep");
  switch (node.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      KDM_RETURN_IF_ERROR(budget.Take(0));
      return json(nullptr);
    case YAML::NodeType::Scalar:
      KDM_RETURN_IF_ERROR(budget.Take(node.Scalar().size()));
      return json(node.Scalar());
    case YAML::NodeType::Sequence: {
      KDM_RETURN_IF_ERROR(budget.Take(0));
      json out = json::array();
      for (const auto& item : node) {
        KDM_ASSIGN_OR_RETURN(json value, YamlToJson(item, depth + 1, budget));
        out.push_back(std::move(value));
      }
      return out;
    }
    case YAML::NodeType::Map: {
      KDM_RETURN_IF_ERROR(budget.Take(0));
      json out = json::object();
      for (const auto& kv : node) {
        if (!kv.first.IsScalar()) {
          return InvalidArgumentError("line " + std::to_string(kv.first.Mark().line + 1) +
                                      ": a mapping key must be a plain value");
        }
        KDM_RETURN_IF_ERROR(budget.Take(kv.first.Scalar().size()));
        KDM_ASSIGN_OR_RETURN(json value, YamlToJson(kv.second, depth + 1, budget));
        out[kv.first.Scalar()] = std::move(value);
      }
      return out;
    }
  }
  return json(nullptr);
}

StatusOr<json> ParseDocument(std::string_view text, bool as_json) {
  // nlohmann's parser takes a NUL byte for the end of the input, so without
  // this check anything after one would be silently ignored.
  if (size_t nul = text.find('\0'); nul != std::string_view::npos) {
    return InvalidArgumentError("a NUL byte at offset " + std::to_string(nul) +
                                ": a manifest is text");
  }
  if (as_json) {
    try {
      return json::parse(text.begin(), text.end());
    } catch (const json::exception& e) {
      // Not only parse_error: a number too large for a double (1e400) is an
      // out_of_range thrown by the parser itself.
      return InvalidArgumentError(std::string("invalid JSON: ") + e.what());
    }
  }
  try {
    YAML::Node root = YAML::Load(std::string(text));
    ExpansionBudget budget;
    return YamlToJson(root, 0, budget);
  } catch (const YAML::Exception& e) {
    std::string where;
    if (!e.mark.is_null()) {
      where = " at line " + std::to_string(e.mark.line + 1) + ", column " +
              std::to_string(e.mark.column + 1);
    }
    return InvalidArgumentError("invalid YAML" + where + ": " + e.msg);
  }
}

bool IsNativeResourceName(std::string_view name) {
  static const std::set<std::string_view> kNative = {"cpu", "memory", "ephemeral-storage",
                                                     "storage", "pods"};
  if (kNative.count(name)) return true;
  if (name.starts_with("hugepages-") && name.size() > 10) return true;
  size_t slash = name.find('/');
  return slash != std::string_view::npos && name.substr(0, slash).ends_with("kubernetes.io") &&
         IsQualifiedNamePart(name.substr(slash + 1));
}

// Walks the JSON tree, building field paths for messages.
class Walker {
 public:
  Walker(std::string file, PodIdentity* identity) : file_(std::move(file)), identity_(identity) {}

  StatusOr<Pod> Run(const json& root) {
    if (!root.is_object()) {
      return Error("", "not a Pod: the document is " + Describe(root) + ", not a mapping");
    }
    KDM_ASSIGN_OR_RETURN(std::string kind, RequiredString(root, "kind", "kind"));
    if (kind != "Pod") return Error("kind", "not a Pod: kind is " + Quote(kind));
    KDM_ASSIGN_OR_RETURN(std::string api, RequiredString(root, "apiVersion", "apiVersion"));
    if (api != "v1") return Error("apiVersion", "must be \"v1\" for a Pod, got " + Quote(api));

    Pod pod;
    auto meta = root.find("metadata");
    if (meta == root.end() || meta->is_null()) return Error("metadata", "missing");
    if (!meta->is_object()) return Error("metadata", "must be a mapping");
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> ns,
                         OptionalString(*meta, "namespace", "metadata.namespace"));
    pod.namespace_name = ns.value_or("default");
    if (!IsDns1123Label(pod.namespace_name)) {
      return Error("metadata.namespace", Quote(pod.namespace_name) +
                                             " is not a DNS-1123 label (lowercase letters, "
                                             "digits and '-', at most 63 characters)");
    }
    if (identity_) identity_->namespace_name = pod.namespace_name;
    auto name_it = meta->find("name");
    if (name_it == meta->end() || name_it->is_null()) return Error("metadata.name", "missing");
    KDM_ASSIGN_OR_RETURN(pod.name, RequiredString(*meta, "name", "metadata.name"));
    if (!IsDns1123Subdomain(pod.name)) {
      return Error("metadata.name", Quote(pod.name) +
                                        " is not a DNS-1123 subdomain (lowercase letters, digits, "
                                        "'-' and '.', at most 253 characters)");
    }
    if (identity_) identity_->name = pod.name;
    KDM_ASSIGN_OR_RETURN(std::optional<std::string> uid,
                         OptionalString(*meta, "uid", "metadata.uid"));
    if (uid && uid->empty()) return Error("metadata.uid", "must not be empty when set");
    pod.uid = uid ? *uid : DerivePodUid(pod.namespace_name, pod.name);

    auto spec = root.find("spec");
    if (spec == root.end() || spec->is_null()) return Error("spec", "missing");
    if (!spec->is_object()) return Error("spec", "must be a mapping");
    std::set<std::string> names;
    KDM_ASSIGN_OR_RETURN(pod.init_containers,
                         Containers(*spec, "initContainers", /*init=*/true, names));
    KDM_ASSIGN_OR_RETURN(pod.containers, Containers(*spec, "containers", /*init=*/false, names));
    if (pod.containers.empty()) {
      return Error("spec.containers", "a Pod needs at least one container");
    }
    return pod;
  }

 private:
  Status Error(const std::string& field, const std::string& what) const {
    return InvalidArgumentError(file_ + ": " + (field.empty() ? "" : field + ": ") + what);
  }

  static std::string Describe(const json& v) {
    switch (v.type()) {
      case json::value_t::null:
        return "empty";
      case json::value_t::object:
        return "a mapping";
      case json::value_t::array:
        return "a list";
      case json::value_t::string:
        return "a string";
      case json::value_t::boolean:
        return "a boolean";
      default:
        return "a number";
    }
  }

  StatusOr<std::string> RequiredString(const json& obj, const char* key,
                                       const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return Error(field, "missing");
    if (!it->is_string()) return Error(field, "must be a string, got " + Describe(*it));
    return it->get<std::string>();
  }

  StatusOr<std::optional<std::string>> OptionalString(const json& obj, const char* key,
                                                      const std::string& field) const {
    auto it = obj.find(key);
    if (it == obj.end() || it->is_null()) return std::optional<std::string>();
    if (!it->is_string()) return Error(field, "must be a string, got " + Describe(*it));
    return std::optional<std::string>(it->get<std::string>());
  }

  StatusOr<std::vector<Container>> Containers(const json& spec, const char* key, bool init,
                                              std::set<std::string>& names) const {
    std::vector<Container> out;
    const std::string list = std::string("spec.") + key;
    auto it = spec.find(key);
    if (it == spec.end() || it->is_null()) return out;
    if (!it->is_array()) return Error(list, "must be a list, got " + Describe(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& c = (*it)[i];
      const std::string field = list + "[" + std::to_string(i) + "]";
      if (!c.is_object()) return Error(field, "must be a mapping, got " + Describe(c));
      Container container;
      auto name_it = c.find("name");
      if (name_it == c.end() || name_it->is_null()) return Error(field + ".name", "missing");
      KDM_ASSIGN_OR_RETURN(container.name, RequiredString(c, "name", field + ".name"));
      if (!IsDns1123Label(container.name)) {
        return Error(field + ".name", Quote(container.name) + " is not a DNS-1123 label");
      }
      if (!names.insert(container.name).second) {
        return Error(field + ".name", "duplicate container name " + Quote(container.name));
      }
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> restart,
                           OptionalString(c, "restartPolicy", field + ".restartPolicy"));
      if (restart) {
        if (!init) {
          return Error(field + ".restartPolicy",
                       "may only be set on init containers (got " + Quote(*restart) + ")");
        }
        if (*restart != "Always") {
          return Error(field + ".restartPolicy",
                       "must be \"Always\" when set, got " + Quote(*restart));
        }
        container.restartable = true;
      }
      KDM_RETURN_IF_ERROR(Resources(c, field, container));
      KDM_RETURN_IF_ERROR(Env(c, field, container));
      out.push_back(std::move(container));
    }
    return out;
  }

  // Reads one resources.<which> map into `out`.
  Status ResourceMap(const json& resources, const char* which, const std::string& field,
                     std::map<std::string, Quantity>& out) const {
    auto it = resources.find(which);
    if (it == resources.end() || it->is_null()) return OkStatus();
    const std::string map_field = field + ".resources." + which;
    if (!it->is_object()) return Error(map_field, "must be a mapping, got " + Describe(*it));
    for (const auto& [name, value] : it->items()) {
      const std::string entry = map_field + "[" + name + "]";
      if (!IsNativeResourceName(name) && !IsExtendedResourceName(name)) {
        return Error(entry, "unknown resource " + Quote(name) +
                                " (not a standard resource and not an extended resource "
                                "name of the form domain/name)");
      }
      std::string text;
      if (value.is_string()) {
        text = value.get<std::string>();
      } else if (value.is_number()) {
        text = value.dump();
      } else {
        return Error(entry, "must be a quantity, got " + Describe(value));
      }
      auto q = Quantity::Parse(text);
      if (!q.ok()) return Error(entry, q.status().message());
      if (q->IsNegative()) {
        return Error(entry, "must be greater than or equal to 0, got " + Quote(text));
      }
      if (IsExtendedResourceName(name) && q->FractionNanos() != 0) {
        return Error(entry, "must be a whole number of devices, got " + Quote(text));
      }
      if (IsExtendedResourceName(name)) {
        auto count = q->DeviceCount();
        if (!count.ok()) return Error(entry, count.status().message());
      }
      out.emplace(name, *q);
    }
    return OkStatus();
  }

  Status Resources(const json& c, const std::string& field, Container& container) const {
    auto it = c.find("resources");
    if (it == c.end() || it->is_null()) return OkStatus();
    if (!it->is_object()) {
      return Error(field + ".resources", "must be a mapping, got " + Describe(*it));
    }
    KDM_RETURN_IF_ERROR(ResourceMap(*it, "limits", field, container.limits));
    KDM_RETURN_IF_ERROR(ResourceMap(*it, "requests", field, container.requests));
    for (const auto& [name, request] : container.requests) {
      if (!IsExtendedResourceName(name)) continue;
      auto limit = container.limits.find(name);
      const std::string entry = field + ".resources.requests[" + name + "]";
      if (limit == container.limits.end()) {
        return Error(entry, "device resource " + Quote(name) +
                                " is requested without a limit; set resources.limits[" + name +
                                "] (devices need request == limit)");
      }
      if (!(limit->second == request)) {
        return Error(entry, "must be equal to the limit " + Quote(limit->second.ToString()) +
                                " for device resource " + Quote(name) + ", got " +
                                Quote(request.ToString()));
      }
    }
    // The API server defaults a missing request to the limit.
    for (const auto& [name, limit] : container.limits) container.requests.emplace(name, limit);
    return OkStatus();
  }

  // Reads env: a list of {name, value}. An entry with valueFrom (a value
  // known only to the API server) and no value is kept out: it cannot be
  // read here.
  Status Env(const json& c, const std::string& field, Container& container) const {
    auto it = c.find("env");
    if (it == c.end() || it->is_null()) return OkStatus();
    if (!it->is_array()) return Error(field + ".env", "must be a list, got " + Describe(*it));
    for (size_t i = 0; i < it->size(); ++i) {
      const json& e = (*it)[i];
      const std::string entry = field + ".env[" + std::to_string(i) + "]";
      if (!e.is_object()) return Error(entry, "must be a mapping, got " + Describe(e));
      auto name_it = e.find("name");
      if (name_it == e.end() || name_it->is_null()) return Error(entry + ".name", "missing");
      KDM_ASSIGN_OR_RETURN(std::string name, RequiredString(e, "name", entry + ".name"));
      if (name.empty() || name.find('=') != std::string::npos ||
          !std::all_of(name.begin(), name.end(), [](char ch) {
            auto u = static_cast<unsigned char>(ch);
            return u > 0x20 && u < 0x7f;
          })) {
        return Error(entry + ".name", Quote(name) +
                                          " is not an environment variable name (printable "
                                          "ASCII without '=' or blanks)");
      }
      KDM_ASSIGN_OR_RETURN(std::optional<std::string> value,
                           OptionalString(e, "value", entry + ".value"));
      if (!value && e.contains("valueFrom")) continue;
      auto same = std::find_if(container.env.begin(), container.env.end(),
                               [&](const auto& kv) { return kv.first == name; });
      if (same != container.env.end()) {
        same->second = value.value_or("");
      } else {
        container.env.emplace_back(std::move(name), value.value_or(""));
      }
    }
    return OkStatus();
  }

  const std::string file_;
  PodIdentity* const identity_;
};

uint64_t Fnv1a64(std::string_view data, uint64_t seed) {
  uint64_t h = seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

}  // namespace

StatusOr<Pod> ParsePodManifest(std::string_view text, std::string_view file_name,
                               PodIdentity* identity) {
  const std::string file = BaseName(file_name);
  if (text.size() > kMaxManifestBytes) {
    return InvalidArgumentError(file + ": file is larger than the " +
                                std::to_string(kMaxManifestBytes) +
                                "-byte manifest limit; not read");
  }
  auto doc = ParseDocument(text, EndsWith(file, ".json"));
  if (!doc.ok()) return InvalidArgumentError(file + ": " + doc.status().message());
  return Walker(file, identity).Run(*doc);
}

StatusOr<std::string> ReadManifestBytes(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) {
    return ErrnoToStatus(errno, "cannot open " + path);
  }
  std::string out;
  char buf[65536];
  while (out.size() <= kMaxManifestBytes) {
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoToStatus(err, "cannot read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (out.size() > kMaxManifestBytes + 1) out.resize(kMaxManifestBytes + 1);
  return out;
}

StatusOr<Pod> LoadPodManifest(const std::string& path, PodIdentity* identity) {
  auto bytes = ReadManifestBytes(path);
  if (!bytes.ok()) return Status(bytes.status().code(), bytes.status().message());
  return ParsePodManifest(*bytes, path, identity);
}

std::string DerivePodUid(std::string_view namespace_name, std::string_view name) {
  std::string key = std::string(namespace_name) + "/" + std::string(name);
  uint64_t a = Fnv1a64(key, 0xcbf29ce484222325ULL);
  uint64_t b = Fnv1a64(key, 0x84222325cbf29ce4ULL ^ a);
  char out[40];
  std::snprintf(out, sizeof out, "%08x-%04x-%04x-%04x-%012llx", static_cast<uint32_t>(a >> 32),
                static_cast<uint32_t>((a >> 16) & 0xffff),
                static_cast<uint32_t>(0x5000 | (a & 0x0fff)),  // version-5 shape
                static_cast<uint32_t>(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffULL));
  return out;
}

bool IsManifestFileName(std::string_view file_name) {
  if (file_name.empty() || file_name.front() == '.') return false;
  if (file_name.find('/') != std::string_view::npos) return false;
  return EndsWith(file_name, ".yaml") || EndsWith(file_name, ".yml") ||
         EndsWith(file_name, ".json");
}

}  // namespace kdm::fakes
