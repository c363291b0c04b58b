#include "kdm/fakes/status_file.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "kdm/base/env.h"
#include "kdm/base/log_value.h"

namespace kdm::fakes {
namespace {

using nlohmann::ordered_json;

Status Errno(int err, const std::string& what, const std::string& path) {
  return UnavailableError(what + " " + path + ": " + std::strerror(err));
}

}  // namespace

std::string AdmissionFailureMessage(std::string_view error) {
  return "Allocate failed due to " + std::string(error) + ", which is unexpected";
}

// ---------------------------------------------------------------- parsing

namespace {

// Where a value sits in a status file, for error messages:
// `"containers"[0]["devices"]["nvidia.com/gpu"][1]`.
std::string Quoted(std::string_view key) { return ordered_json(std::string(key)).dump(); }
std::string KeyPath(const std::string& parent, std::string_view key) {
  return parent.empty() ? Quoted(key) : parent + "[" + Quoted(key) + "]";
}
std::string IndexPath(const std::string& parent, size_t i) {
  return parent + "[" + std::to_string(i) + "]";
}

Status Problem(const std::string& where, std::string_view what) {
  return InvalidArgumentError(where + " " + std::string(what));
}

// The member `key` of `object` (an object), or an error naming it.
StatusOr<const ordered_json*> Member(const ordered_json& object, const std::string& parent,
                                     std::string_view key) {
  auto it = object.find(std::string(key));
  if (it == object.end()) return Problem(KeyPath(parent, key), "is missing");
  return &*it;
}

StatusOr<const ordered_json*> Typed(const ordered_json& object, const std::string& parent,
                                    std::string_view key, ordered_json::value_t type) {
  KDM_ASSIGN_OR_RETURN(const ordered_json* v, Member(object, parent, key));
  const std::string where = KeyPath(parent, key);
  switch (type) {
    case ordered_json::value_t::object:
      if (!v->is_object()) return Problem(where, "is not an object");
      break;
    case ordered_json::value_t::array:
      if (!v->is_array()) return Problem(where, "is not an array");
      break;
    case ordered_json::value_t::string:
      if (!v->is_string()) return Problem(where, "is not a string");
      break;
    case ordered_json::value_t::boolean:
      if (!v->is_boolean()) return Problem(where, "is not a boolean");
      break;
    default:
      break;
  }
  return v;
}

StatusOr<std::string> StringAt(const ordered_json& object, const std::string& parent,
                               std::string_view key) {
  KDM_ASSIGN_OR_RETURN(const ordered_json* v,
                       Typed(object, parent, key, ordered_json::value_t::string));
  return v->get<std::string>();
}

StatusOr<int64_t> CountOf(const ordered_json& v, const std::string& where) {
  if (!v.is_number_integer()) return Problem(where, "is not a whole number");
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) return Problem(where, "is too large");
    return static_cast<int64_t>(v.get<uint64_t>());
  }
  if (v.get<int64_t>() < 0) return Problem(where, "is negative");
  return v.get<int64_t>();
}

StatusOr<std::vector<std::string>> Strings(const ordered_json& array, const std::string& where) {
  if (!array.is_array()) return Problem(where, "is not an array");
  std::vector<std::string> out;
  for (size_t i = 0; i < array.size(); ++i) {
    if (!array[i].is_string()) return Problem(IndexPath(where, i), "is not a string");
    out.push_back(array[i].get<std::string>());
  }
  return out;
}

StatusOr<std::map<std::string, std::string>> StringMap(const ordered_json& object,
                                                       const std::string& where) {
  if (!object.is_object()) return Problem(where, "is not an object");
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : object.items()) {
    if (!v.is_string()) return Problem(KeyPath(where, k), "is not a string");
    out[k] = v.get<std::string>();
  }
  return out;
}

StatusOr<ordered_json> ParseObject(std::string_view text) {
  ordered_json root;
  try {
    root = ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(std::string("not valid JSON: ") + e.what());
  }
  if (!root.is_object()) return InvalidArgumentError("not a JSON object");
  return root;
}

StatusOr<ContainerStatus> ParseContainer(const ordered_json& j, const std::string& where) {
  if (!j.is_object()) return Problem(where, "is not an object");
  ContainerStatus c;
  KDM_ASSIGN_OR_RETURN(c.name, StringAt(j, where, "name"));
  KDM_ASSIGN_OR_RETURN(const ordered_json* devices,
                       Typed(j, where, "devices", ordered_json::value_t::object));
  for (const auto& [resource, ids] : devices->items()) {
    KDM_ASSIGN_OR_RETURN(c.devices[resource],
                         Strings(ids, KeyPath(KeyPath(where, "devices"), resource)));
  }
  KDM_ASSIGN_OR_RETURN(const ordered_json* envs, Member(j, where, "envs"));
  KDM_ASSIGN_OR_RETURN(c.run.envs, StringMap(*envs, KeyPath(where, "envs")));
  KDM_ASSIGN_OR_RETURN(const ordered_json* mounts,
                       Typed(j, where, "mounts", ordered_json::value_t::array));
  for (size_t i = 0; i < mounts->size(); ++i) {
    const std::string at = IndexPath(KeyPath(where, "mounts"), i);
    const ordered_json& m = (*mounts)[i];
    if (!m.is_object()) return Problem(at, "is not an object");
    devicemanager::Mount mount;
    KDM_ASSIGN_OR_RETURN(mount.container_path, StringAt(m, at, "container_path"));
    KDM_ASSIGN_OR_RETURN(mount.host_path, StringAt(m, at, "host_path"));
    KDM_ASSIGN_OR_RETURN(const ordered_json* read_only,
                         Typed(m, at, "read_only", ordered_json::value_t::boolean));
    mount.read_only = read_only->get<bool>();
    c.run.mounts.push_back(std::move(mount));
  }
  KDM_ASSIGN_OR_RETURN(const ordered_json* specs,
                       Typed(j, where, "device_specs", ordered_json::value_t::array));
  for (size_t i = 0; i < specs->size(); ++i) {
    const std::string at = IndexPath(KeyPath(where, "device_specs"), i);
    const ordered_json& d = (*specs)[i];
    if (!d.is_object()) return Problem(at, "is not an object");
    devicemanager::DeviceSpec spec;
    KDM_ASSIGN_OR_RETURN(spec.container_path, StringAt(d, at, "container_path"));
    KDM_ASSIGN_OR_RETURN(spec.host_path, StringAt(d, at, "host_path"));
    KDM_ASSIGN_OR_RETURN(spec.permissions, StringAt(d, at, "permissions"));
    c.run.devices.push_back(std::move(spec));
  }
  KDM_ASSIGN_OR_RETURN(const ordered_json* annotations, Member(j, where, "annotations"));
  KDM_ASSIGN_OR_RETURN(c.run.annotations, StringMap(*annotations, KeyPath(where, "annotations")));
  KDM_ASSIGN_OR_RETURN(const ordered_json* cdi, Member(j, where, "cdi_devices"));
  KDM_ASSIGN_OR_RETURN(c.run.cdi_devices, Strings(*cdi, KeyPath(where, "cdi_devices")));
  return c;
}

// Reads at most kMaxStatusFileBytes of a regular file.
StatusOr<std::string> ReadStatusFile(const std::string& path) {
  // O_NONBLOCK: a FIFO in the file's place must not hang the reader.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return NotFoundError(path + " does not exist");
    return Errno(errno, "cannot open", path);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(path + ": not a regular file");
  }
  auto too_large = [&] {
    return InvalidArgumentError(path + ": larger than " + std::to_string(kMaxStatusFileBytes) +
                                " bytes, the most a status file may hold");
  };
  if (static_cast<uintmax_t>(st.st_size) > kMaxStatusFileBytes) {
    ::close(fd);
    return too_large();
  }
  std::string text;
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      return Errno(err, "cannot read", path);
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > kMaxStatusFileBytes) {
      ::close(fd);
      return too_large();  // it grew while being read
    }
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return text;
}

}  // namespace

StatusOr<PodStatus> ParsePodStatus(std::string_view text) {
  KDM_ASSIGN_OR_RETURN(ordered_json root, ParseObject(text));
  PodStatus status;
  KDM_ASSIGN_OR_RETURN(status.phase, StringAt(root, "", "phase"));
  if (status.phase != kPhaseAdmitted && status.phase != kPhaseRejected) {
    return Problem(KeyPath("", "phase"), "is " + Quoted(status.phase) + ", not " +
                                             Quoted(kPhaseAdmitted) + " or " +
                                             Quoted(kPhaseRejected));
  }
  KDM_ASSIGN_OR_RETURN(status.reason, StringAt(root, "", "reason"));
  KDM_ASSIGN_OR_RETURN(status.message, StringAt(root, "", "message"));
  KDM_ASSIGN_OR_RETURN(const ordered_json* containers,
                       Typed(root, "", "containers", ordered_json::value_t::array));
  for (size_t i = 0; i < containers->size(); ++i) {
    KDM_ASSIGN_OR_RETURN(ContainerStatus c,
                         ParseContainer((*containers)[i], IndexPath(KeyPath("", "containers"), i)));
    status.containers.push_back(std::move(c));
  }
  return status;
}

StatusOr<NodeStatus> ParseNodeStatus(std::string_view text) {
  KDM_ASSIGN_OR_RETURN(ordered_json root, ParseObject(text));
  NodeStatus node;
  KDM_ASSIGN_OR_RETURN(const ordered_json* capacity,
                       Typed(root, "", "capacity", ordered_json::value_t::object));
  KDM_ASSIGN_OR_RETURN(const ordered_json* allocatable,
                       Typed(root, "", "allocatable", ordered_json::value_t::object));
  for (const auto& [resource, n] : capacity->items()) {
    KDM_ASSIGN_OR_RETURN(node.capacity.resources[resource].capacity,
                         CountOf(n, KeyPath(KeyPath("", "capacity"), resource)));
  }
  for (const auto& [resource, n] : allocatable->items()) {
    const std::string where = KeyPath(KeyPath("", "allocatable"), resource);
    auto it = node.capacity.resources.find(resource);
    if (it == node.capacity.resources.end()) {
      return Problem(where, "names a resource that \"capacity\" does not");
    }
    KDM_ASSIGN_OR_RETURN(it->second.allocatable, CountOf(n, where));
    if (it->second.allocatable > it->second.capacity) {
      return Problem(where, "is larger than the resource's capacity");
    }
  }
  if (allocatable->size() != capacity->size()) {
    for (const auto& [resource, n] : capacity->items()) {
      if (!allocatable->contains(resource)) {
        return Problem(KeyPath(KeyPath("", "capacity"), resource),
                       "names a resource that \"allocatable\" does not");
      }
    }
  }
  KDM_ASSIGN_OR_RETURN(const ordered_json* plugins,
                       Typed(root, "", "plugins", ordered_json::value_t::array));
  for (size_t i = 0; i < plugins->size(); ++i) {
    const std::string at = IndexPath(KeyPath("", "plugins"), i);
    const ordered_json& p = (*plugins)[i];
    if (!p.is_object()) return Problem(at, "is not an object");
    KDM_ASSIGN_OR_RETURN(std::string resource, StringAt(p, at, "resource"));
    KDM_ASSIGN_OR_RETURN(std::string state, StringAt(p, at, "state"));
    KDM_ASSIGN_OR_RETURN(const ordered_json* devices, Member(p, at, "devices"));
    KDM_ASSIGN_OR_RETURN(int64_t device_count, CountOf(*devices, KeyPath(at, "devices")));
    KDM_ASSIGN_OR_RETURN(const ordered_json* healthy, Member(p, at, "healthy"));
    KDM_ASSIGN_OR_RETURN(int64_t healthy_count, CountOf(*healthy, KeyPath(at, "healthy")));
    auto it = node.capacity.resources.find(resource);
    if (it == node.capacity.resources.end() || it->second.capacity != device_count ||
        it->second.allocatable != healthy_count || PluginState(it->second) != state) {
      return Problem(at,
                     "(" + Quoted(resource) + ") disagrees with \"capacity\" and \"allocatable\"");
    }
  }
  KDM_ASSIGN_OR_RETURN(const ordered_json* deleted, Member(root, "", "deleted_resources"));
  KDM_ASSIGN_OR_RETURN(node.capacity.deleted, Strings(*deleted, KeyPath("", "deleted_resources")));
  KDM_ASSIGN_OR_RETURN(const ordered_json* registrations, Member(root, "", "registrations"));
  KDM_ASSIGN_OR_RETURN(node.registrations, CountOf(*registrations, KeyPath("", "registrations")));
  if (root.contains("devices")) {
    KDM_ASSIGN_OR_RETURN(const ordered_json* devices,
                         Typed(root, "", "devices", ordered_json::value_t::array));
    node.devices.emplace();
    for (size_t i = 0; i < devices->size(); ++i) {
      const std::string at = IndexPath(KeyPath("", "devices"), i);
      const ordered_json& d = (*devices)[i];
      if (!d.is_object()) return Problem(at, "is not an object");
      NodeDevice device;
      KDM_ASSIGN_OR_RETURN(device.resource, StringAt(d, at, "resource"));
      KDM_ASSIGN_OR_RETURN(device.id, StringAt(d, at, "id"));
      KDM_ASSIGN_OR_RETURN(const ordered_json* healthy,
                           Typed(d, at, "healthy", ordered_json::value_t::boolean));
      device.healthy = healthy->get<bool>();
      KDM_ASSIGN_OR_RETURN(const ordered_json* numa,
                           Typed(d, at, "numa_nodes", ordered_json::value_t::array));
      for (size_t k = 0; k < numa->size(); ++k) {
        KDM_ASSIGN_OR_RETURN(int64_t n,
                             CountOf((*numa)[k], IndexPath(KeyPath(at, "numa_nodes"), k)));
        device.numa_nodes.push_back(n);
      }
      KDM_ASSIGN_OR_RETURN(device.model, StringAt(d, at, "model"));
      if (d.contains("index")) {
        KDM_ASSIGN_OR_RETURN(int64_t index, CountOf(d["index"], KeyPath(at, "index")));
        if (index > 1'000'000) return Problem(KeyPath(at, "index"), "is past 1000000");
        device.index = static_cast<int>(index);
      }
      node.devices->push_back(std::move(device));
    }
  }
  if (root.contains("pending_pods")) {
    KDM_ASSIGN_OR_RETURN(const ordered_json* pending,
                         Typed(root, "", "pending_pods", ordered_json::value_t::array));
    node.pending_pods.emplace();
    for (size_t i = 0; i < pending->size(); ++i) {
      const std::string at = IndexPath(KeyPath("", "pending_pods"), i);
      const ordered_json& p = (*pending)[i];
      if (!p.is_object()) return Problem(at, "is not an object");
      PendingPod pod;
      KDM_ASSIGN_OR_RETURN(pod.namespace_name, StringAt(p, at, "namespace"));
      KDM_ASSIGN_OR_RETURN(pod.name, StringAt(p, at, "name"));
      KDM_ASSIGN_OR_RETURN(pod.reason, StringAt(p, at, "reason"));
      node.pending_pods->push_back(std::move(pod));
    }
  }
  return node;
}

StatusOr<PodStatus> ReadPodStatusFile(const std::string& path) {
  KDM_ASSIGN_OR_RETURN(std::string text, ReadStatusFile(path));
  StatusOr<PodStatus> status = ParsePodStatus(text);
  if (!status.ok()) return status.status().WithPrefix(path);
  return status;
}

StatusOr<NodeStatus> ReadNodeStatusFile(const std::string& path) {
  KDM_ASSIGN_OR_RETURN(std::string text, ReadStatusFile(path));
  StatusOr<NodeStatus> status = ParseNodeStatus(text);
  if (!status.ok()) return status.status().WithPrefix(path);
  return status;
}

// ---------------------------------------------------------------- rendering

std::string RenderPodStatus(const PodStatus& status) {
  ordered_json root = ordered_json::object();
  root["phase"] = status.phase;
  root["reason"] = status.reason;
  root["message"] = status.message;
  ordered_json containers = ordered_json::array();
  for (const ContainerStatus& c : status.containers) {
    ordered_json j = ordered_json::object();
    j["name"] = c.name;
    j["devices"] = ordered_json::object();
    for (const auto& [resource, ids] : c.devices) j["devices"][resource] = ids;
    j["envs"] = ordered_json::object();
    for (const auto& [k, v] : c.run.envs) j["envs"][k] = v;
    j["mounts"] = ordered_json::array();
    for (const auto& m : c.run.mounts) {
      j["mounts"].push_back({{"container_path", m.container_path},
                             {"host_path", m.host_path},
                             {"read_only", m.read_only}});
    }
    j["device_specs"] = ordered_json::array();
    for (const auto& d : c.run.devices) {
      j["device_specs"].push_back({{"container_path", d.container_path},
                                   {"host_path", d.host_path},
                                   {"permissions", d.permissions}});
    }
    j["annotations"] = ordered_json::object();
    for (const auto& [k, v] : c.run.annotations) j["annotations"][k] = v;
    j["cdi_devices"] = c.run.cdi_devices;
    containers.push_back(std::move(j));
  }
  root["containers"] = std::move(containers);
  return root.dump(2) + "\n";
}

std::string PodStatusFileName(std::string_view namespace_name, std::string_view name) {
  return std::string(namespace_name) + "_" + std::string(name) + ".json";
}

std::string ManifestStatusFileName(std::string_view manifest_file_name) {
  return "manifest_" + std::string(manifest_file_name) + ".json";
}

std::string_view PluginState(const devicemanager::CapacityReport::Amounts& amounts) {
  if (amounts.allocatable > 0) return "Healthy";
  return amounts.capacity > 0 ? "Unhealthy" : "Pending";
}

std::string RenderNodeStatus(const NodeStatus& status) {
  ordered_json root = ordered_json::object();
  root["capacity"] = ordered_json::object();
  root["allocatable"] = ordered_json::object();
  root["plugins"] = ordered_json::array();
  for (const auto& [resource, amounts] : status.capacity.resources) {
    root["capacity"][resource] = amounts.capacity;
    root["allocatable"][resource] = amounts.allocatable;
    root["plugins"].push_back({{"resource", resource},
                               {"state", std::string(PluginState(amounts))},
                               {"devices", amounts.capacity},
                               {"healthy", amounts.allocatable}});
  }
  root["deleted_resources"] = status.capacity.deleted;
  root["registrations"] = status.registrations;
  if (status.devices) {
    root["devices"] = ordered_json::array();
    for (const NodeDevice& d : *status.devices) {
      root["devices"].push_back({{"resource", d.resource},
                                 {"id", d.id},
                                 {"healthy", d.healthy},
                                 {"numa_nodes", d.numa_nodes},
                                 {"model", d.model}});
      if (d.index) root["devices"].back()["index"] = *d.index;
    }
  }
  if (status.pending_pods) {
    root["pending_pods"] = ordered_json::array();
    for (const PendingPod& p : *status.pending_pods) {
      root["pending_pods"].push_back(
          {{"namespace", p.namespace_name}, {"name", p.name}, {"reason", p.reason}});
    }
  }
  return root.dump(2) + "\n";
}

Status WriteFileAtomically(const std::string& path, std::string_view contents, Env* env) {
  // A dot-file temporary, so that a reader globbing "*.json" never sees it.
  return env->WriteFileAtomically(path, contents,
                                  {.mode = 0644, .naming = TempFileNaming::kHiddenRandom});
}

std::vector<std::string> RemoveStaleTempFiles(const std::string& dir, Env* env) {
  StatusOr<std::vector<std::string>> removed =
      env->RemoveStaleTempFiles(dir, TempFileNaming::kHiddenRandom);
  if (!removed.ok()) {
    spdlog::warn("event=stale_temp_files_not_checked dir={} error={}", QuoteLogValue(dir),
                 QuoteLogValue(removed.status().message()));
    return {};
  }
  for (const std::string& path : *removed) {
    spdlog::info("event=stale_temp_file_removed path={}", QuoteLogValue(path));
  }
  return std::move(*removed);
}

std::vector<std::string> AdmittedStatusFilesWithDevices(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<std::string> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name == "node.json" || name.front() == '.' || !name.ends_with(".json")) continue;
    StatusOr<PodStatus> status = ReadPodStatusFile(it->path().string());
    if (!status.ok() || status->phase != kPhaseAdmitted) continue;
    bool holds_devices =
        std::any_of(status->containers.begin(), status->containers.end(), [](const auto& c) {
          return std::any_of(c.devices.begin(), c.devices.end(),
                             [](const auto& ids) { return !ids.second.empty(); });
        });
    if (holds_devices) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace kdm::fakes
