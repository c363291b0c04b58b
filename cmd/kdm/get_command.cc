// `kdm get pods|devices|capacity --root DIR [-o json]`: what a running
// `kdm kubelet --root DIR` holds, read through its pod-resources socket
// (DIR/pod-resources/kubelet.sock: List, GetAllocatableResources) and its
// node status file (DIR/status/node.json). Flag parsing and printing only.
//
// Exit codes: 0 ok, 1 runtime error (message on stderr naming the path),
// 2 usage.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "cli_common.h"
#include "commands.h"
#include "kdm/base/status.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/fakes/status_file.h"

namespace kdm::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

struct GetFlags {
  std::string root;
  std::string output = "table";
  int timeout_seconds = 5;
};

std::string SocketPath(const std::string& root) { return root + "/pod-resources/kubelet.sock"; }
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
std::string JoinNuma(const std::set<int64_t>& nodes) {
  if (nodes.empty()) return "-";
  std::string out;
  for (int64_t n : nodes) out += (out.empty() ? "" : ",") + std::to_string(n);
  return out;
}

// Prints rows as columns separated by two spaces; the first row is the header.
void PrintTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (std::size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
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
      {.socket_path = SocketPath(flags.root),
       .timeout = std::chrono::seconds(flags.timeout_seconds)});
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

int GetFail(const std::string& what, const Status& s) {
  std::cerr << "kdm get " << what << ": " << s.message() << "\n";
  return kRuntimeError;
}

int GetUsage(const std::string& what, const std::string& message) {
  std::cerr << "kdm get " << what << ": " << message << "\n"
            << "Run 'kdm get " << what << " --help' for usage.\n";
  return kUsageError;
}

bool CheckFlags(const std::string& what, const GetFlags& flags, int* exit_code) {
  if (flags.root.empty()) {
    *exit_code = GetUsage(what, "--root is required");
    return false;
  }
  if (flags.output != "table" && flags.output != "json") {
    *exit_code = GetUsage(what, "-o must be table or json, not \"" + flags.output + "\"");
    return false;
  }
  if (flags.timeout_seconds <= 0) {
    *exit_code = GetUsage(what, "--timeout must be positive");
    return false;
  }
  return true;
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

int GetPods(const GetFlags& flags) {
  int code = kOk;
  if (!CheckFlags("pods", flags, &code)) return code;
  auto client = Connect(flags);
  if (!client.ok()) return GetFail("pods", client.status());
  auto list = (*client)->List();
  if (!list.ok()) return GetFail("pods", list.status());

  if (flags.output == "json") {
    ordered_json pods = ordered_json::array();
    for (const auto& pod : *list) {
      ordered_json containers = ordered_json::array();
      for (const auto& c : pod.containers) {
        containers.push_back({{"name", c.name}, {"devices", DevicesJson(Merge(c.devices))}});
      }
      pods.push_back(
          {{"namespace", pod.namespace_name}, {"name", pod.name}, {"containers", containers}});
    }
    std::cout << ordered_json{{"pods", pods}}.dump(2) << "\n";
    return kOk;
  }
  if (list->empty()) {
    std::cout << "No active pods.\n";
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAMESPACE", "NAME", "CONTAINER", "RESOURCE", "DEVICES", "NUMA"}};
  for (const auto& pod : *list) {
    if (pod.containers.empty()) rows.push_back({pod.namespace_name, pod.name, "-", "-", "-", "-"});
    for (const auto& c : pod.containers) {
      ContainerDevices devices = Merge(c.devices);
      if (devices.empty()) rows.push_back({pod.namespace_name, pod.name, c.name, "-", "-", "-"});
      for (const auto& [resource, r] : devices) {
        rows.push_back(
            {pod.namespace_name, pod.name, c.name, resource, Join(r.ids), JoinNuma(r.numa_nodes)});
      }
    }
  }
  PrintTable(rows);
  return kOk;
}

int GetDevices(const GetFlags& flags) {
  int code = kOk;
  if (!CheckFlags("devices", flags, &code)) return code;
  auto client = Connect(flags);
  if (!client.ok()) return GetFail("devices", client.status());
  auto allocatable = (*client)->GetAllocatableResources();
  if (!allocatable.ok()) return GetFail("devices", allocatable.status());
  auto list = (*client)->List();
  if (!list.ok()) return GetFail("devices", list.status());

  struct DeviceRow {
    std::set<int64_t> numa;
    bool healthy = false;
    std::string owner;  // "namespace/name/container"
  };
  std::map<std::pair<std::string, std::string>, DeviceRow> devices;  // (resource, id)
  for (const auto& d : *allocatable) {
    for (const auto& id : d.device_ids) {
      DeviceRow& row = devices[{d.resource_name, id}];
      row.healthy = true;
      if (d.numa_node) row.numa.insert(*d.numa_node);
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
  auto state = [](const DeviceRow& r) {
    if (!r.healthy) return std::string("allocated-unhealthy");
    return std::string(r.owner.empty() ? "free" : "allocated");
  };
  if (flags.output == "json") {
    ordered_json out = ordered_json::array();
    for (const auto& [key, r] : devices) {
      out.push_back({{"resource", key.first},
                     {"id", key.second},
                     {"numa_nodes", std::vector<int64_t>(r.numa.begin(), r.numa.end())},
                     {"state", state(r)},
                     {"allocated_to", r.owner}});
    }
    std::cout << ordered_json{{"devices", out}}.dump(2) << "\n";
    return kOk;
  }
  if (devices.empty()) {
    std::cout << "No devices.\n";
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"RESOURCE", "DEVICE", "NUMA", "STATE", "POD/CONTAINER"}};
  for (const auto& [key, r] : devices) {
    rows.push_back(
        {key.first, key.second, JoinNuma(r.numa), state(r), r.owner.empty() ? "-" : r.owner});
  }
  PrintTable(rows);
  std::cout
      << "(unhealthy devices that no container holds are not listed; see `kdm get capacity`)\n";
  return kOk;
}

int GetCapacity(const GetFlags& flags) {
  int code = kOk;
  if (!CheckFlags("capacity", flags, &code)) return code;
  auto node = ReadNodeStatus(flags.root);
  if (!node.ok()) return GetFail("capacity", node.status());
  if (flags.output == "json") {
    std::cout << fakes::RenderNodeStatus(*node);
    return kOk;
  }
  const auto& resources = node->capacity.resources;
  std::vector<std::vector<std::string>> rows = {{"RESOURCE", "CAPACITY", "ALLOCATABLE", "PLUGIN"}};
  for (const auto& [r, amounts] : resources) {
    rows.push_back({r, std::to_string(amounts.capacity), std::to_string(amounts.allocatable),
                    std::string(fakes::PluginState(amounts))});
  }
  if (resources.empty()) {
    std::cout << "No device resources.\n";
  } else {
    PrintTable(rows);
  }
  if (!node->capacity.deleted.empty()) {
    std::cout << "Removed (grace period expired): " << Join(node->capacity.deleted, ", ") << "\n";
  }
  std::cout << "Registrations accepted: " << node->registrations << "\n";
  return kOk;
}

}  // namespace

void AddGetCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GetFlags>();
  auto* cmd =
      app.add_subcommand("get", "Show what a running `kdm kubelet` holds: pods, devices, capacity");
  cmd->require_subcommand(1);
  auto add_common = [flags](CLI::App* sub) {
    sub->add_option("--root", flags->root, "The kubelet's root directory (as `kdm kubelet --root`)")
        ->type_name("DIR");
    sub->add_option("-o,--output", flags->output, "table (default) or json")->type_name("FORMAT");
  };
  auto* pods =
      cmd->add_subcommand("pods", "Active pods, their containers and devices (pod-resources List)");
  add_common(pods);
  pods->add_option("--timeout", flags->timeout_seconds, "RPC deadline in seconds (default 5)");
  pods->callback([flags, &exit_code] { exit_code = GetPods(*flags); });

  auto* devices = cmd->add_subcommand(
      "devices", "Every healthy device, free or allocated, and every allocated device");
  add_common(devices);
  devices->add_option("--timeout", flags->timeout_seconds, "RPC deadline in seconds (default 5)");
  devices->callback([flags, &exit_code] { exit_code = GetDevices(*flags); });

  auto* capacity = cmd->add_subcommand(
      "capacity", "Capacity and allocatable per resource, plugin states (status/node.json)");
  add_common(capacity);
  capacity->callback([flags, &exit_code] { exit_code = GetCapacity(*flags); });
}

}  // namespace kdm::cli
