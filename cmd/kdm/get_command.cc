// `kdm get pods|devices|capacity --root DIR [-o table|wide|json] [-w]` and
// `kdm get pod NAME`: what a running `kdm kubelet --root DIR` holds, read
// through its pod-resources socket (DIR/pod-resources/kubelet.sock: List,
// GetAllocatableResources) and its status files (DIR/status/: each pod's
// admission result, node.json). Flag parsing, merging and printing only.
// `pod` and `device` are accepted wherever `pods` and `devices` are.
//
// Exit codes: 0 ok (and after SIGINT/SIGTERM ends a watch), 1 runtime error
// (message on stderr naming the path), 2 usage (also an unknown resource
// kind, pod or device).
#include <signal.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/log_value.h"
#include "kdm/base/status.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/fakes/status_file.h"

namespace kdm::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

// How often `-w` reads the agent again.
constexpr auto kWatchPollInterval = std::chrono::milliseconds(500);

struct GetFlags {
  std::string root;
  std::string output = "table";
  std::string timeout = "5s";                   // --timeout, a duration
  std::chrono::milliseconds rpc_timeout{5000};  // --timeout, parsed
  int verbosity = 0;
  bool watch = false;
  std::string name;            // `pod NAME` / `device ID` (optional positional)
  std::string namespace_name;  // -n for `pod NAME` (default "default")
  std::string unknown_kind;    // `kdm get nodes`: the positional of `get`
};

std::string SocketPath(const std::string& root) { return root + "/pod-resources/kubelet.sock"; }
std::string StatusDir(const std::string& root) { return root + "/status"; }
std::string NodeStatusPath(const std::string& root) { return root + "/status/node.json"; }

// Devices of one resource in one container (the API's per-device, per-NUMA
// entries merged).
struct ResourceDevices {
  std::vector<std::string> ids;  // sorted, unique
  std::set<int64_t> numa_nodes;
};
using ContainerDevices = std::map<std::string, ResourceDevices>;  // by resource

ContainerDevices Merge(const std::vector<devicemanager::ContainerDevices>& in) {
  ContainerDevices out;
  for (const auto& d : in) {
    ResourceDevices& r = out[d.resource_name];
    r.ids.insert(r.ids.end(), d.device_ids.begin(), d.device_ids.end());
    if (d.numa_node) r.numa_nodes.insert(*d.numa_node);
  }
  for (auto& [_, r] : out) {
    std::sort(r.ids.begin(), r.ids.end());
    r.ids.erase(std::unique(r.ids.begin(), r.ids.end()), r.ids.end());
  }
  return out;
}

std::string Join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}
template <typename Numbers>
std::string JoinNuma(const Numbers& nodes) {
  if (nodes.empty()) return "-";
  std::string out;
  for (int64_t n : nodes) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}
// A table cell or describe value from outside text: control bytes become
// spaces, so a message cannot break the table's lines; "" becomes `dash`.
std::string Cell(const std::string& text, const char* dash = "-") {
  if (text.empty()) return dash;
  std::string out = text;
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  return out;
}

using Rows = std::vector<std::vector<std::string>>;

std::vector<std::size_t> Widths(const Rows& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  return width;
}
std::string FormatRow(const std::vector<std::string>& row, const std::vector<std::size_t>& width) {
  std::string line;
  for (std::size_t i = 0; i < row.size(); ++i) {
    line += row[i];
    if (i + 1 < row.size()) {
      std::size_t w = i < width.size() ? width[i] : row[i].size();
      line += std::string(std::max(w, row[i].size()) - row[i].size() + 2, ' ');
    }
  }
  return line;
}

// What one read of the agent shows: a table (rows, the header first) with
// lines after it, or a text (JSON, a describe view).
struct View {
  bool is_table = false;
  Rows rows;
  // Rows are told apart (for -w) by their first key_columns cells; a row
  // that went away is printed again with "Deleted" in status_column unless
  // a row of its group (the first group_columns cells: one pod, one
  // device) is still there.
  std::size_t key_columns = 1;
  std::size_t group_columns = 1;
  std::size_t status_column = 0;
  std::string empty_text;            // printed instead of a header-only table
  std::vector<std::string> trailer;  // lines after the table
  std::string text;
};

// One failure: the exit code and the message after "kdm get <what>: ".
struct GetFailure {
  int code = kRuntimeError;
  std::string message;
};
using Builder = std::function<std::optional<GetFailure>(const GetFlags&, bool first, View*)>;

std::optional<GetFailure> FailWith(const Status& s) {
  return GetFailure{kRuntimeError, s.message()};
}

Status CheckRoot(const std::string& root) {
  struct stat st;
  if (::stat(root.c_str(), &st) != 0) {
    return NotFoundError("root directory " + root + " does not exist");
  }
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError("root " + root + " is not a directory");
  return OkStatus();
}

// A client of DIR/pod-resources/kubelet.sock.
StatusOr<std::unique_ptr<devicemanager::PodResourcesClient>> Connect(const GetFlags& flags) {
  KDM_RETURN_IF_ERROR(CheckRoot(flags.root));
  auto client = devicemanager::PodResourcesClient::Connect(
      {.socket_path = SocketPath(flags.root), .timeout = flags.rpc_timeout});
  if (client.ok()) return client;
  const Status& s = client.status();
  if (s.code() == StatusCode::kInvalidArgument) return s.WithPrefix("--root");
  if (s.code() == StatusCode::kNotFound) {
    return NotFoundError(s.message() + " (is `kdm kubelet --root " + flags.root + "` running?)");
  }
  return s;
}

StatusOr<fakes::NodeStatus> ReadNodeStatus(const std::string& root) {
  KDM_RETURN_IF_ERROR(CheckRoot(root));
  const std::string path = NodeStatusPath(root);
  StatusOr<fakes::NodeStatus> node = fakes::ReadNodeStatusFile(path);
  if (!node.ok() && node.status().code() == StatusCode::kNotFound) {
    return NotFoundError("node status " + path +
                         " does not exist (it is written by `kdm kubelet --root " + root + "`)");
  }
  return node;
}

// node.json where it helps but is not needed: nullopt when missing; a
// broken one is a warning (on the first read of a watch only).
std::optional<fakes::NodeStatus> OptionalNodeStatus(const std::string& what, const GetFlags& flags,
                                                    bool warn) {
  StatusOr<fakes::NodeStatus> node = fakes::ReadNodeStatusFile(NodeStatusPath(flags.root));
  if (node.ok()) return std::move(*node);
  if (warn && node.status().code() != StatusCode::kNotFound) {
    std::cerr << "kdm get " << what << ": warning: " << node.status().message() << "\n";
  }
  return std::nullopt;
}

// Every pod status file in DIR/status: (namespace, name) -> status, with
// the file's path and modification time. A manifest whose pod name could
// not be read (manifest_<file>.json) is namespace "-", name <file>.
struct KnownPod {
  std::string status;   // Admitted, Rejected or Pending
  std::string reason;   // "" when none
  std::string message;  // "" when none
  std::string status_file;
  std::optional<std::filesystem::file_time_type> written;
  std::optional<fakes::PodStatus> file;  // the status file, when read
};
using PodKey = std::pair<std::string, std::string>;

std::optional<PodKey> PodKeyOfStatusFile(const std::string& file_name) {
  if (!file_name.ends_with(".json") || file_name.front() == '.' || file_name == "node.json") {
    return std::nullopt;
  }
  const std::string stem = file_name.substr(0, file_name.size() - 5);
  if (stem.starts_with("manifest_")) return PodKey{"-", stem.substr(9)};
  // A namespace is a DNS label and a name a DNS subdomain: neither holds '_'.
  const std::size_t cut = stem.find('_');
  if (cut == std::string::npos || cut == 0 || cut + 1 == stem.size()) return std::nullopt;
  return PodKey{stem.substr(0, cut), stem.substr(cut + 1)};
}

std::map<PodKey, KnownPod> KnownPods(const std::string& what, const GetFlags& flags,
                                     const std::optional<fakes::NodeStatus>& node, bool warn) {
  std::map<PodKey, KnownPod> out;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(StatusDir(flags.root), ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    const std::string file_name = it->path().filename().string();
    std::optional<PodKey> key = PodKeyOfStatusFile(file_name);
    if (!key) continue;
    StatusOr<fakes::PodStatus> status = fakes::ReadPodStatusFile(it->path().string());
    if (!status.ok()) {
      if (warn && status.status().code() != StatusCode::kNotFound) {
        std::cerr << "kdm get " << what << ": warning: " << status.status().message() << "\n";
      }
      continue;
    }
    KnownPod& pod = out[*key];
    pod.status = status->phase;
    pod.reason = status->reason;
    pod.message = status->message;
    pod.status_file = it->path().string();
    std::error_code time_ec;
    auto written = std::filesystem::last_write_time(it->path(), time_ec);
    if (!time_ec) pod.written = written;
    pod.file = std::move(*status);
  }
  // A pod the agent has not judged yet (or judges again) is Pending, whatever
  // its old status file says. node.json is a snapshot rewritten every 250 ms,
  // a status file is written at the decision: a status file newer than the
  // snapshot is that decision, and the snapshot's pending entry is stale.
  std::error_code node_ec;
  const auto node_written = std::filesystem::last_write_time(NodeStatusPath(flags.root), node_ec);
  if (node && node->pending_pods) {
    for (const fakes::PendingPod& p : *node->pending_pods) {
      auto decided = out.find({p.namespace_name, p.name});
      if (decided != out.end() && decided->second.written && !node_ec &&
          *decided->second.written > node_written) {
        continue;
      }
      KnownPod& pod = out[{p.namespace_name, p.name}];
      pod.status = "Pending";
      pod.reason = p.reason;
      pod.message.clear();
    }
  }
  return out;
}

std::string Iso8601(std::filesystem::file_time_type t) {
  const auto system = std::chrono::file_clock::to_sys(t);
  const std::time_t seconds = std::chrono::system_clock::to_time_t(
      std::chrono::time_point_cast<std::chrono::system_clock::duration>(system));
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

ordered_json DevicesJson(const ContainerDevices& devices) {
  ordered_json out = ordered_json::array();
  for (const auto& [resource, r] : devices) {
    out.push_back({{"resource", resource},
                   {"device_ids", r.ids},
                   {"numa_nodes", std::vector<int64_t>(r.numa_nodes.begin(), r.numa_nodes.end())}});
  }
  return out;
}

// ------------------------------------------------------------------ pods

std::optional<GetFailure> BuildPods(const GetFlags& flags, bool first, View* view) {
  auto client = Connect(flags);
  if (!client.ok()) return FailWith(client.status());
  auto list = (*client)->List();
  if (!list.ok()) return FailWith(list.status());
  const std::optional<fakes::NodeStatus> node = OptionalNodeStatus("pods", flags, first);
  std::map<PodKey, KnownPod> known = KnownPods("pods", flags, node, first);

  // Pods in List hold (or may hold) devices: admitted unless a status file
  // or the agent's pending list says otherwise.
  KnownPod admitted;
  admitted.status = fakes::kPhaseAdmitted;
  auto status_of = [&](const PodKey& key) -> const KnownPod& {
    auto it = known.find(key);
    return it == known.end() || it->second.status.empty() ? admitted : it->second;
  };
  std::set<PodKey> listed;
  for (const auto& pod : *list) listed.insert({pod.namespace_name, pod.name});
  std::vector<PodKey> others;  // sorted, as `known` is
  for (const auto& [key, pod] : known) {
    if (!listed.count(key)) others.push_back(key);
  }
  const bool wide = flags.output == "wide";

  if (flags.output == "json") {
    ordered_json pods = ordered_json::array();
    auto add = [&](const PodKey& key, ordered_json containers) {
      const KnownPod& k = status_of(key);
      pods.push_back({{"namespace", key.first},
                      {"name", key.second},
                      {"containers", std::move(containers)},
                      {"status", k.status},
                      {"reason", k.reason},
                      {"message", k.message}});
    };
    for (const auto& pod : *list) {
      ordered_json containers = ordered_json::array();
      for (const auto& c : pod.containers) {
        containers.push_back({{"name", c.name}, {"devices", DevicesJson(Merge(c.devices))}});
      }
      add({pod.namespace_name, pod.name}, std::move(containers));
    }
    for (const PodKey& key : others) add(key, ordered_json::array());
    view->text = ordered_json{{"pods", pods}}.dump(2) + "\n";
    return std::nullopt;
  }
  view->is_table = true;
  view->empty_text = "No active pods.";
  view->key_columns = 4;
  view->group_columns = 2;
  view->status_column = 6;
  view->rows = {
      {"NAMESPACE", "NAME", "CONTAINER", "RESOURCE", "DEVICES", "NUMA", "STATUS", "REASON"}};
  if (wide) view->rows[0].push_back("MESSAGE");
  auto row = [&](const PodKey& key, std::vector<std::string> cells) {
    const KnownPod& k = status_of(key);
    cells.push_back(k.status);
    cells.push_back(Cell(k.reason));
    if (wide) cells.push_back(Cell(k.message));
    view->rows.push_back(std::move(cells));
  };
  for (const auto& pod : *list) {
    const PodKey key{pod.namespace_name, pod.name};
    if (pod.containers.empty()) row(key, {pod.namespace_name, pod.name, "-", "-", "-", "-"});
    for (const auto& c : pod.containers) {
      ContainerDevices devices = Merge(c.devices);
      if (devices.empty()) row(key, {pod.namespace_name, pod.name, c.name, "-", "-", "-"});
      for (const auto& [resource, r] : devices) {
        row(key,
            {pod.namespace_name, pod.name, c.name, resource, Join(r.ids), JoinNuma(r.numa_nodes)});
      }
    }
  }
  for (const PodKey& key : others) row(key, {key.first, key.second, "-", "-", "-", "-"});
  return std::nullopt;
}

// `kdm get pod NAME`: one pod, from its status file (and the agent's
// pending list), with the NUMA nodes of its devices from node.json.
std::optional<GetFailure> BuildPod(const GetFlags& flags, bool first, View* view) {
  if (Status s = CheckRoot(flags.root); !s.ok()) return FailWith(s);
  PodKey key{flags.namespace_name.empty() ? "default" : flags.namespace_name, flags.name};
  if (const std::size_t slash = flags.name.find('/'); slash != std::string::npos) {
    if (!flags.namespace_name.empty()) {
      return GetFailure{kUsageError, "give the namespace once: -n " +
                                         QuoteLogValue(flags.namespace_name, kMaxLogValueBytes) +
                                         " or NAMESPACE/NAME, not both"};
    }
    key = {flags.name.substr(0, slash), flags.name.substr(slash + 1)};
  }
  const std::optional<fakes::NodeStatus> node = OptionalNodeStatus("pod", flags, first);
  std::map<PodKey, KnownPod> known = KnownPods("pod", flags, node, first);
  auto it = known.find(key);
  if (it == known.end()) {
    return GetFailure{kUsageError,
                      "pod " + QuoteLogValue(key.first + "/" + key.second, kMaxLogValueBytes) +
                          " not found: `kdm kubelet --root " + flags.root +
                          "` knows no such pod (see `kdm get pods --root " + flags.root + "`)"};
  }
  const KnownPod& pod = it->second;
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> numa;
  if (node && node->devices) {
    for (const auto& d : *node->devices) numa[{d.resource, d.id}] = d.numa_nodes;
  }
  auto device_numa = [&](const std::string& resource, const std::string& id) {
    auto n = numa.find({resource, id});
    return n == numa.end() ? std::vector<int64_t>{} : n->second;
  };
  const std::string written = pod.written ? Iso8601(*pod.written) : "";

  if (flags.output == "json") {
    ordered_json containers = ordered_json::array();
    if (pod.file) {
      containers = ordered_json::parse(fakes::RenderPodStatus(*pod.file))["containers"];
      for (auto& c : containers) {
        ordered_json numa_of = ordered_json::object();
        for (const auto& [resource, ids] : c["devices"].items()) {
          numa_of[resource] = ordered_json::object();
          for (const auto& id : ids) {
            numa_of[resource][id.get<std::string>()] = device_numa(resource, id.get<std::string>());
          }
        }
        c["numa_nodes"] = std::move(numa_of);
      }
    }
    ordered_json out = {{"namespace", key.first}, {"name", key.second},
                        {"status", pod.status},   {"reason", pod.reason},
                        {"message", pod.message}, {"status_file", pod.status_file},
                        {"written", written},     {"containers", std::move(containers)}};
    view->text = out.dump(2) + "\n";
    return std::nullopt;
  }
  std::string& t = view->text;
  auto line = [&t](const std::string& label, const std::string& value, int indent = 0) {
    std::string head = std::string(indent, ' ') + label + ":";
    t += head + std::string(head.size() < 16 ? 16 - head.size() : 1, ' ') + value + "\n";
  };
  line("Name", key.second);
  line("Namespace", key.first);
  line("Status", pod.status);
  line("Reason", Cell(pod.reason));
  line("Message", Cell(pod.message));
  line("Status file", pod.status_file.empty() ? "-" : pod.status_file);
  line("Written", written.empty() ? "-" : written);
  if (!pod.file || pod.file->containers.empty()) {
    t += "Containers:     <none>\n";
    return std::nullopt;
  }
  t += "Containers:\n";
  auto list = [&](const std::string& label, const std::vector<std::string>& values) {
    if (values.empty()) return line(label, "<none>", 4);
    line(label, values[0], 4);
    for (std::size_t i = 1; i < values.size(); ++i) t += std::string(16, ' ') + values[i] + "\n";
  };
  for (const fakes::ContainerStatus& c : pod.file->containers) {
    t += "  " + c.name + ":\n";
    std::vector<std::string> devices, envs, mounts, specs, annotations;
    for (const auto& [resource, ids] : c.devices) {
      for (const auto& id : ids) {
        devices.push_back(resource + " " + Cell(id) + " (NUMA " +
                          JoinNuma(device_numa(resource, id)) + ")");
      }
    }
    for (const auto& [k, v] : c.run.envs) envs.push_back(Cell(k) + "=" + Cell(v, ""));
    for (const auto& m : c.run.mounts) {
      mounts.push_back(Cell(m.container_path) + " from " + Cell(m.host_path) +
                       (m.read_only ? " (ro)" : " (rw)"));
    }
    for (const auto& d : c.run.devices) {
      specs.push_back(Cell(d.container_path) + " from " + Cell(d.host_path) + " (" +
                      Cell(d.permissions) + ")");
    }
    for (const auto& [k, v] : c.run.annotations) annotations.push_back(Cell(k) + "=" + Cell(v, ""));
    std::vector<std::string> cdi;
    for (const auto& d : c.run.cdi_devices) cdi.push_back(Cell(d));
    list("Devices", devices);
    list("Envs", envs);
    list("Mounts", mounts);
    list("Device specs", specs);
    list("Annotations", annotations);
    list("CDI devices", cdi);
  }
  return std::nullopt;
}

// --------------------------------------------------------------- devices

std::optional<GetFailure> BuildDevices(const GetFlags& flags, bool first, View* view) {
  auto client = Connect(flags);
  if (!client.ok()) return FailWith(client.status());
  auto allocatable = (*client)->GetAllocatableResources();
  if (!allocatable.ok()) return FailWith(allocatable.status());
  auto list = (*client)->List();
  if (!list.ok()) return FailWith(list.status());
  const std::optional<fakes::NodeStatus> node = OptionalNodeStatus("devices", flags, first);
  const bool every_device = node && node->devices;

  struct DeviceRow {
    std::set<int64_t> numa;
    bool healthy = false;  // pod-resources lists it as allocatable
    std::string owner;     // "namespace/name/container"
    std::string model;
    std::optional<int> index;  // NVML's GPU index, where the agent knows it
  };
  std::map<std::pair<std::string, std::string>, DeviceRow> devices;  // (resource, id)
  for (const auto& d : *allocatable) {
    for (const auto& id : d.device_ids) {
      DeviceRow& row = devices[{d.resource_name, id}];
      row.healthy = true;
      if (d.numa_node) row.numa.insert(*d.numa_node);
    }
  }
  // node.json names the unhealthy devices too (and a model where the agent
  // knows it); pod-resources, read just now, has the last word on health.
  if (every_device) {
    for (const fakes::NodeDevice& d : *node->devices) {
      DeviceRow& row = devices[{d.resource, d.id}];
      row.numa.insert(d.numa_nodes.begin(), d.numa_nodes.end());
      row.model = d.model;
      row.index = d.index;
    }
  }
  for (const auto& pod : *list) {
    for (const auto& c : pod.containers) {
      for (const auto& d : c.devices) {
        for (const auto& id : d.device_ids) {
          DeviceRow& row = devices[{d.resource_name, id}];
          if (d.numa_node) row.numa.insert(*d.numa_node);
          std::string owner = pod.namespace_name + "/" + pod.name + "/" + c.name;
          // A device handed from an init container to the next shows its
          // every holder.
          if (row.owner.find(owner) == std::string::npos) {
            row.owner += (row.owner.empty() ? "" : ",") + owner;
          }
        }
      }
    }
  }
  if (!flags.name.empty()) {
    std::erase_if(devices, [&](const auto& d) { return d.first.second != flags.name; });
    if (devices.empty()) {
      return GetFailure{kUsageError, "device " + QuoteLogValue(flags.name, kMaxLogValueBytes) +
                                         " not found: no resource of `kdm kubelet --root " +
                                         flags.root + "` lists it (see `kdm get devices --root " +
                                         flags.root + "`)"};
    }
  }
  auto state = [](const DeviceRow& r) {
    if (!r.healthy) return std::string(r.owner.empty() ? "unhealthy" : "allocated-unhealthy");
    return std::string(r.owner.empty() ? "free" : "allocated");
  };
  if (flags.output == "json") {
    ordered_json out = ordered_json::array();
    for (const auto& [key, r] : devices) {
      out.push_back({{"resource", key.first},
                     {"id", key.second},
                     {"numa_nodes", std::vector<int64_t>(r.numa.begin(), r.numa.end())},
                     {"state", state(r)},
                     {"allocated_to", r.owner},
                     {"healthy", r.healthy},
                     {"model", r.model}});
      if (r.index) out.back()["index"] = *r.index;
    }
    view->text = ordered_json{{"devices", out}}.dump(2) + "\n";
    return std::nullopt;
  }
  const bool wide = flags.output == "wide";
  view->is_table = true;
  view->empty_text = "No devices.";
  view->key_columns = 2;
  view->group_columns = 2;
  view->status_column = 3;
  view->rows = {{"RESOURCE", "DEVICE", "NUMA", "STATE", "POD/CONTAINER"}};
  if (wide) {
    view->rows[0].push_back("HEALTH");
    view->rows[0].push_back("GPU");
    view->rows[0].push_back("MODEL");
  }
  for (const auto& [key, r] : devices) {
    view->rows.push_back(
        {key.first, key.second, JoinNuma(r.numa), state(r), r.owner.empty() ? "-" : r.owner});
    if (wide) {
      view->rows.back().push_back(r.healthy ? "Healthy" : "Unhealthy");
      view->rows.back().push_back(r.index ? std::to_string(*r.index) : "-");
      view->rows.back().push_back(Cell(r.model));
    }
  }
  if (!every_device && view->rows.size() > 1) {
    view->trailer.push_back(
        "(unhealthy devices that no container holds are not listed; see `kdm get capacity`)");
  }
  return std::nullopt;
}

// -------------------------------------------------------------- capacity

std::optional<GetFailure> BuildCapacity(const GetFlags& flags, bool, View* view) {
  auto node = ReadNodeStatus(flags.root);
  if (!node.ok()) return FailWith(node.status());
  if (flags.output == "json") {
    view->text = fakes::RenderNodeStatus(*node);
    return std::nullopt;
  }
  view->is_table = true;
  view->empty_text = "No device resources.";
  view->key_columns = 1;
  view->status_column = 3;
  view->rows = {{"RESOURCE", "CAPACITY", "ALLOCATABLE", "PLUGIN"}};
  for (const auto& [r, amounts] : node->capacity.resources) {
    view->rows.push_back({r, std::to_string(amounts.capacity), std::to_string(amounts.allocatable),
                          std::string(fakes::PluginState(amounts))});
  }
  if (!node->capacity.deleted.empty()) {
    view->trailer.push_back("Removed (grace period expired): " +
                            Join(node->capacity.deleted, ", "));
  }
  view->trailer.push_back("Registrations accepted: " + std::to_string(node->registrations));
  return std::nullopt;
}

// -------------------------------------------------------------- printing

void PrintView(const View& view) {
  if (!view.is_table) {
    std::cout << view.text;
  } else if (view.rows.size() <= 1) {
    std::cout << view.empty_text << "\n";
  } else {
    const auto width = Widths(view.rows);
    for (const auto& row : view.rows) std::cout << FormatRow(row, width) << "\n";
  }
  for (const auto& line : view.trailer) std::cout << line << "\n";
  std::cout.flush();
}

std::string RowKey(const std::vector<std::string>& row, std::size_t columns) {
  std::string key;
  for (std::size_t i = 0; i < std::min(columns, row.size()); ++i) key += row[i] + '\0';
  return key;
}

// -w after the first view: the rows that are new or changed, and each row
// that went away with "Deleted" as its status, in the widths printed so
// far; a changed text (JSON, describe) again, whole; changed lines after
// the table.
void PrintChanges(const View& before, const View& now, std::vector<std::size_t>* width) {
  if (!now.is_table) {
    if (now.text != before.text) std::cout << now.text;
  } else if (before.rows.size() <= 1 && now.rows.size() > 1) {
    // The first rows after "No active pods.": with their header.
    *width = Widths(now.rows);
    for (const auto& row : now.rows) std::cout << FormatRow(row, *width) << "\n";
  } else {
    std::map<std::string, const std::vector<std::string>*> old_rows, new_rows;
    std::set<std::string> new_groups;
    for (std::size_t i = 1; i < before.rows.size(); ++i) {
      old_rows[RowKey(before.rows[i], before.key_columns)] = &before.rows[i];
    }
    Rows changed;
    for (std::size_t i = 1; i < now.rows.size(); ++i) {
      const std::string key = RowKey(now.rows[i], now.key_columns);
      new_rows[key] = &now.rows[i];
      new_groups.insert(RowKey(now.rows[i], now.group_columns));
      auto it = old_rows.find(key);
      if (it == old_rows.end() || *it->second != now.rows[i]) changed.push_back(now.rows[i]);
    }
    for (std::size_t i = 1; i < before.rows.size(); ++i) {
      if (new_rows.count(RowKey(before.rows[i], before.key_columns))) continue;
      if (new_groups.count(RowKey(before.rows[i], before.group_columns))) continue;
      std::vector<std::string> gone = before.rows[i];
      if (before.status_column < gone.size()) gone[before.status_column] = "Deleted";
      changed.push_back(std::move(gone));
    }
    for (const auto& row : changed) {
      width->resize(std::max(width->size(), row.size()), 0);
      for (std::size_t i = 0; i < row.size(); ++i)
        (*width)[i] = std::max((*width)[i], row[i].size());
      std::cout << FormatRow(row, *width) << "\n";
    }
  }
  if (now.trailer != before.trailer) {
    for (const auto& line : now.trailer) {
      if (std::find(before.trailer.begin(), before.trailer.end(), line) == before.trailer.end()) {
        std::cout << line << "\n";
      }
    }
  }
  std::cout.flush();
}

int GetFail(const std::string& what, const GetFailure& f) {
  std::cerr << "kdm get " << what << ": " << f.message << "\n";
  return f.code;
}

int GetUsage(const std::string& what, const std::string& message) {
  std::cerr << "kdm get " << what << ": " << message << "\n"
            << "Run 'kdm get " << what << " --help' for usage.\n";
  return kUsageError;
}

bool CheckFlags(const std::string& what, GetFlags& flags, int* exit_code) {
  if (flags.root.empty()) {
    *exit_code = GetUsage(what, "--root is required");
    return false;
  }
  if (flags.output != "table" && flags.output != "wide" && flags.output != "json") {
    *exit_code = GetUsage(what, "-o must be table, wide or json, not " +
                                    QuoteLogValue(flags.output, kMaxLogValueBytes));
    return false;
  }
  StatusOr<std::chrono::milliseconds> timeout = ParseDurationFlag(flags.timeout);
  if (!timeout.ok()) {
    *exit_code = GetUsage(what, "--timeout: " + timeout.status().message());
    return false;
  }
  if (timeout->count() <= 0) {
    *exit_code = GetUsage(what, "--timeout must be positive");
    return false;
  }
  flags.rpc_timeout = *timeout;
  return true;
}

// Reads once and prints; with -w, reads again every kWatchPollInterval and
// prints what changed until SIGINT or SIGTERM (exit 0). A read that fails
// ends the watch (exit 1).
int RunGet(const std::string& what, const GetFlags& given, const Builder& build) {
  int code = kOk;
  GetFlags flags = given;
  if (!CheckFlags(what, flags, &code)) return code;
  if (DryRun()) return kOk;
  SetUpStderrLogging("kdm-get", LogLevelFor(flags.verbosity, spdlog::level::warn));
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  // Before any gRPC thread exists, so that only sigtimedwait below takes them.
  if (flags.watch) pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  View view;
  if (auto f = build(flags, true, &view)) return GetFail(what, *f);
  if (flags.watch && !view.is_table && flags.output == "json") {
    // One document per line, so that a reader can take each change as it comes.
    view.text = ordered_json::parse(view.text).dump() + "\n";
  }
  PrintView(view);
  if (!flags.watch) return kOk;
  std::vector<std::size_t> width = view.is_table ? Widths(view.rows) : std::vector<std::size_t>{};
  const auto poll = std::chrono::duration_cast<std::chrono::nanoseconds>(kWatchPollInterval);
  const timespec wait = {.tv_sec = static_cast<time_t>(poll.count() / 1000000000),
                         .tv_nsec = static_cast<long>(poll.count() % 1000000000)};
  while (true) {
    if (sigtimedwait(&stop_signals, nullptr, &wait) > 0) return kOk;
    View next;
    if (auto f = build(flags, false, &next)) return GetFail(what, *f);
    if (!next.is_table && flags.output == "json") {
      next.text = ordered_json::parse(next.text).dump() + "\n";
    }
    PrintChanges(view, next, &width);
    view = std::move(next);
  }
}

}  // namespace

void AddGetCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GetFlags>();
  auto* cmd =
      app.add_subcommand("get", "Show what a running `kdm kubelet` holds: pods, devices, capacity");
  cmd->require_subcommand(0, 1);
  cmd->add_option("kind", flags->unknown_kind, "pods|pod, devices|device or capacity")
      ->type_name("KIND");
  cmd->callback([cmd, flags, &exit_code] {
    if (!cmd->get_subcommands().empty()) return;
    if (flags->unknown_kind.empty()) {
      std::cerr << "kdm get: a resource kind is required: pods, devices or capacity\n";
    } else {
      std::cerr << "kdm get: unknown resource kind "
                << QuoteLogValue(flags->unknown_kind, kMaxLogValueBytes)
                << " (known: pods, pod, devices, device, capacity)\n";
    }
    exit_code = kUsageError;
  });
  auto add_common = [flags](CLI::App* sub) {
    sub->add_option("--root", flags->root, "The kubelet's root directory (as `kdm kubelet --root`)")
        ->type_name("DIR");
    sub->add_option("-o,--output", flags->output, "table (default), wide or json")
        ->type_name("FORMAT");
    sub->add_flag("-w,--watch", flags->watch,
                  "After the first answer, print what changes (read every 500ms) until Ctrl-C");
    AddVerbosityFlag(sub, &flags->verbosity);
  };
  // The same flags on `get` itself, so that `kdm get nodes --root DIR -o
  // json` is refused for its kind, not for its flags.
  add_common(cmd);
  cmd->add_option("--timeout", flags->timeout,
                  "Deadline of each pod-resources call (a duration: 500ms, 5s)")
      ->capture_default_str()
      ->type_name("DURATION");
  auto* pods =
      cmd->add_subcommand("pods",
                          "Every pod the agent knows: devices (pod-resources List), STATUS "
                          "(Admitted/Rejected/Pending) and REASON; `pod NAME` describes one");
  pods->alias("pod");
  add_common(pods);
  pods->add_option("--timeout", flags->timeout,
                   "Deadline of each pod-resources call (a duration: 500ms, 5s)")
      ->capture_default_str()
      ->type_name("DURATION");
  pods->add_option("name", flags->name, "One pod to describe: NAME or NAMESPACE/NAME")
      ->type_name("NAME");
  pods->add_option("-n,--namespace", flags->namespace_name,
                   "The namespace of NAME (default \"default\")");
  pods->callback([flags, &exit_code] {
    if (flags->name.empty()) {
      if (!flags->namespace_name.empty()) {
        exit_code = GetUsage("pods", "-n needs a pod NAME");
        return;
      }
      exit_code = RunGet("pods", *flags, BuildPods);
    } else {
      if (flags->name.find('/') != std::string::npos && !flags->namespace_name.empty()) {
        exit_code = GetUsage("pod", "give the namespace once: -n " +
                                        QuoteLogValue(flags->namespace_name, kMaxLogValueBytes) +
                                        " or NAMESPACE/NAME, not both");
        return;
      }
      exit_code = RunGet("pod", *flags, BuildPod);
    }
  });

  auto* devices = cmd->add_subcommand(
      "devices", "Every device: health, free or allocated and to which pod/container");
  devices->alias("device");
  add_common(devices);
  devices
      ->add_option("--timeout", flags->timeout,
                   "Deadline of each pod-resources call (a duration: 500ms, 5s)")
      ->capture_default_str()
      ->type_name("DURATION");
  devices->add_option("id", flags->name, "Only this device id")->type_name("ID");
  devices->callback([flags, &exit_code] { exit_code = RunGet("devices", *flags, BuildDevices); });

  auto* capacity = cmd->add_subcommand(
      "capacity", "Capacity and allocatable per resource, plugin states (status/node.json)");
  add_common(capacity);
  capacity->callback(
      [flags, &exit_code] { exit_code = RunGet("capacity", *flags, BuildCapacity); });
}

}  // namespace kdm::cli
