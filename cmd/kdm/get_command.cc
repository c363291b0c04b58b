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
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "commands.h"
#include "kdm/base/status.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::cli {
namespace {

using ordered_json = nlohmann::ordered_json;

constexpr int kOk = 0;
constexpr int kRuntimeError = 1;
constexpr int kUsageError = 2;

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
  std::vector<std::string> ids;   // sorted, unique
  std::set<int64_t> numa_nodes;
};
using ContainerDevices = std::map<std::string, ResourceDevices>;  // by resource

ContainerDevices Merge(const google::protobuf::RepeatedPtrField<v1::ContainerDevices>& in) {
  ContainerDevices out;
  for (const auto& d : in) {
    ResourceDevices& r = out[d.resource_name()];
    r.ids.insert(r.ids.end(), d.device_ids().begin(), d.device_ids().end());
    for (const auto& n : d.topology().nodes()) r.numa_nodes.insert(n.id());
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
class PodResourcesClient {
 public:
  static StatusOr<PodResourcesClient> Connect(const GetFlags& flags) {
    KDM_RETURN_IF_ERROR(CheckRoot(flags.root));
    const std::string socket = SocketPath(flags.root);
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(socket);
    if (!target.ok()) return target.status().WithPrefix("--root");
    struct stat st;
    if (::stat(socket.c_str(), &st) != 0) {
      return NotFoundError("pod-resources socket " + socket +
                           " does not exist (is `kdm kubelet --root " + flags.root +
                           "` running?)");
    }
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError("pod-resources socket " + socket + " is not a socket");
    }
    return PodResourcesClient(socket, *target, flags.timeout_seconds);
  }

  StatusOr<v1::ListPodResourcesResponse> List() {
    v1::ListPodResourcesResponse response;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    KDM_RETURN_IF_ERROR(Check(stub_->List(&ctx, v1::ListPodResourcesRequest(), &response), "List"));
    return response;
  }

  StatusOr<v1::AllocatableResourcesResponse> Allocatable() {
    v1::AllocatableResourcesResponse response;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    KDM_RETURN_IF_ERROR(Check(
        stub_->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &response),
        "GetAllocatableResources"));
    return response;
  }

 private:
  PodResourcesClient(std::string socket, const std::string& target, int timeout_seconds)
      : socket_(std::move(socket)),
        timeout_seconds_(timeout_seconds),
        stub_(v1::PodResourcesLister::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}

  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(timeout_seconds_));
  }

  Status Check(const grpc::Status& s, const char* method) const {
    return pluginapi::FromGrpcStatus(s, std::string(method) + " on " + socket_ + " failed");
  }

  std::string socket_;
  int timeout_seconds_;
  std::shared_ptr<v1::PodResourcesLister::Stub> stub_;
};

StatusOr<ordered_json> ReadNodeStatus(const std::string& root) {
  KDM_RETURN_IF_ERROR(CheckRoot(root));
  const std::string path = NodeStatusPath(root);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return NotFoundError("node status " + path + " does not exist (it is written by `kdm kubelet --root " +
                         root + "`)");
  }
  std::stringstream text;
  text << in.rdbuf();
  ordered_json j;
  try {
    j = ordered_json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgumentError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) return InvalidArgumentError(path + ": not a JSON object");
  for (const char* key : {"capacity", "allocatable"}) {
    if (j.contains(key) && !j[key].is_object()) {
      return InvalidArgumentError(path + ": \"" + key + "\" is not an object");
    }
  }
  if (j.contains("plugins") && !j["plugins"].is_array()) {
    return InvalidArgumentError(path + ": \"plugins\" is not an array");
  }
  return j;
}

int Fail(const std::string& what, const Status& s) {
  std::cerr << "kdm get " << what << ": " << s.message() << "\n";
  return kRuntimeError;
}

int Usage(const std::string& what, const std::string& message) {
  std::cerr << "kdm get " << what << ": " << message << "\n"
            << "Run 'kdm get " << what << " --help' for usage.\n";
  return kUsageError;
}

bool CheckFlags(const std::string& what, const GetFlags& flags, int* exit_code) {
  if (flags.root.empty()) {
    *exit_code = Usage(what, "--root is required");
    return false;
  }
  if (flags.output != "table" && flags.output != "json") {
    *exit_code = Usage(what, "-o must be table or json, not \"" + flags.output + "\"");
    return false;
  }
  if (flags.timeout_seconds <= 0) {
    *exit_code = Usage(what, "--timeout must be positive");
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
  auto client = PodResourcesClient::Connect(flags);
  if (!client.ok()) return Fail("pods", client.status());
  auto list = client->List();
  if (!list.ok()) return Fail("pods", list.status());

  if (flags.output == "json") {
    ordered_json pods = ordered_json::array();
    for (const auto& pod : list->pod_resources()) {
      ordered_json containers = ordered_json::array();
      for (const auto& c : pod.containers()) {
        containers.push_back({{"name", c.name()}, {"devices", DevicesJson(Merge(c.devices()))}});
      }
      pods.push_back(
          {{"namespace", pod.namespace_()}, {"name", pod.name()}, {"containers", containers}});
    }
    std::cout << ordered_json{{"pods", pods}}.dump(2) << "\n";
    return kOk;
  }
  if (list->pod_resources_size() == 0) {
    std::cout << "No active pods.\n";
    return kOk;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAMESPACE", "NAME", "CONTAINER", "RESOURCE", "DEVICES", "NUMA"}};
  for (const auto& pod : list->pod_resources()) {
    if (pod.containers_size() == 0) rows.push_back({pod.namespace_(), pod.name(), "-", "-", "-", "-"});
    for (const auto& c : pod.containers()) {
      ContainerDevices devices = Merge(c.devices());
      if (devices.empty()) rows.push_back({pod.namespace_(), pod.name(), c.name(), "-", "-", "-"});
      for (const auto& [resource, r] : devices) {
        rows.push_back({pod.namespace_(), pod.name(), c.name(), resource, Join(r.ids),
                        JoinNuma(r.numa_nodes)});
      }
    }
  }
  PrintTable(rows);
  return kOk;
}

int GetDevices(const GetFlags& flags) {
  int code = kOk;
  if (!CheckFlags("devices", flags, &code)) return code;
  auto client = PodResourcesClient::Connect(flags);
  if (!client.ok()) return Fail("devices", client.status());
  auto allocatable = client->Allocatable();
  if (!allocatable.ok()) return Fail("devices", allocatable.status());
  auto list = client->List();
  if (!list.ok()) return Fail("devices", list.status());

  struct DeviceRow {
    std::set<int64_t> numa;
    bool healthy = false;
    std::string owner;  // "namespace/name/container"
  };
  std::map<std::pair<std::string, std::string>, DeviceRow> devices;  // (resource, id)
  for (const auto& d : allocatable->devices()) {
    for (const auto& id : d.device_ids()) {
      DeviceRow& row = devices[{d.resource_name(), id}];
      row.healthy = true;
      for (const auto& n : d.topology().nodes()) row.numa.insert(n.id());
    }
  }
  for (const auto& pod : list->pod_resources()) {
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        for (const auto& id : d.device_ids()) {
          DeviceRow& row = devices[{d.resource_name(), id}];
          for (const auto& n : d.topology().nodes()) row.numa.insert(n.id());
          std::string owner = pod.namespace_() + "/" + pod.name() + "/" + c.name();
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
  std::vector<std::vector<std::string>> rows = {{"RESOURCE", "DEVICE", "NUMA", "STATE", "POD/CONTAINER"}};
  for (const auto& [key, r] : devices) {
    rows.push_back({key.first, key.second, JoinNuma(r.numa), state(r), r.owner.empty() ? "-" : r.owner});
  }
  PrintTable(rows);
  std::cout << "(unhealthy devices that no container holds are not listed; see `kdm get capacity`)\n";
  return kOk;
}

std::string Number(const ordered_json& j) {
  if (j.is_number_integer()) return std::to_string(j.get<int64_t>());
  if (j.is_null()) return "-";
  return j.dump();
}

int GetCapacity(const GetFlags& flags) {
  int code = kOk;
  if (!CheckFlags("capacity", flags, &code)) return code;
  auto node = ReadNodeStatus(flags.root);
  if (!node.ok()) return Fail("capacity", node.status());
  if (flags.output == "json") {
    std::cout << node->dump(2) << "\n";
    return kOk;
  }
  const ordered_json empty = ordered_json::object();
  const ordered_json& capacity = node->contains("capacity") ? (*node)["capacity"] : empty;
  const ordered_json& allocatable = node->contains("allocatable") ? (*node)["allocatable"] : empty;
  std::map<std::string, std::string> plugin_state;
  if (node->contains("plugins")) {
    for (const auto& p : (*node)["plugins"]) {
      if (p.is_object() && p.contains("resource") && p["resource"].is_string()) {
        plugin_state[p["resource"].get<std::string>()] =
            p.contains("state") && p["state"].is_string() ? p["state"].get<std::string>() : "-";
      }
    }
  }
  std::set<std::string> resources;
  for (const auto& [r, _] : capacity.items()) resources.insert(r);
  for (const auto& [r, _] : allocatable.items()) resources.insert(r);
  for (const auto& [r, _] : plugin_state) resources.insert(r);
  std::vector<std::vector<std::string>> rows = {{"RESOURCE", "CAPACITY", "ALLOCATABLE", "PLUGIN"}};
  for (const std::string& r : resources) {
    rows.push_back({r, capacity.contains(r) ? Number(capacity[r]) : "-",
                    allocatable.contains(r) ? Number(allocatable[r]) : "-",
                    plugin_state.count(r) ? plugin_state[r] : "-"});
  }
  if (resources.empty()) {
    std::cout << "No device resources.\n";
  } else {
    PrintTable(rows);
  }
  if (node->contains("deleted_resources") && (*node)["deleted_resources"].is_array() &&
      !(*node)["deleted_resources"].empty()) {
    std::vector<std::string> deleted;
    for (const auto& d : (*node)["deleted_resources"]) deleted.push_back(d.is_string() ? d.get<std::string>() : d.dump());
    std::cout << "Removed (grace period expired): " << Join(deleted, ", ") << "\n";
  }
  if (node->contains("registrations")) {
    std::cout << "Registrations accepted: " << Number((*node)["registrations"]) << "\n";
  }
  return kOk;
}

}  // namespace

void AddGetCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<GetFlags>();
  auto* cmd = app.add_subcommand(
      "get", "Show what a running `kdm kubelet` holds: pods, devices, capacity");
  cmd->require_subcommand(1);
  auto add_common = [flags](CLI::App* sub) {
    sub->add_option("--root", flags->root, "The kubelet's root directory (as `kdm kubelet --root`)")
        ->type_name("DIR");
    sub->add_option("-o,--output", flags->output, "table (default) or json")->type_name("FORMAT");
  };
  auto* pods = cmd->add_subcommand(
      "pods", "Active pods, their containers and devices (pod-resources List)");
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
