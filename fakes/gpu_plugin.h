// kdm::fakes::FakeDevicePlugin: the fake GPU (or generic) device plugin behind
// `kdm plugin`. It builds a kdm::plugin::PluginServer from a config:
//
//  - devices from exactly one source: a topology preset (`dgx1-v100`, ...), a
//    topology file (nvidia-smi `topo -m` text or kdm's JSON), or a count of
//    generic devices "<short>-0" ... "<short>-(N-1)" with no links, where
//    <short> is the resource name's part after '/' ("fpga" for
//    example.com/fpga);
//  - GPU devices (preset or file) keep the topology's ids and NUMA nodes;
//    Allocate answers the device nodes /dev/nvidia<index> plus /dev/nvidiactl,
//    /dev/nvidia-uvm and /dev/nvidia-uvm-tools (permissions "rw") and
//    NVIDIA_VISIBLE_DEVICES=<ids, comma-separated>;
//  - generic devices answer /dev/<short><index> and
//    <SHORT>_VISIBLE_DEVICES=<ids> (<SHORT> upper-cased, characters outside
//    [A-Z0-9_] turned into '_');
//  - with `cdi`, every answer also names one CDI device per id:
//    "<vendor>/<class>=<id>" from the resource name "<vendor>/<class>";
//  - GetPreferredAllocation is offered unless the policy is kNone and answers
//    exactly topology::AllocateIds(topology, available, must_include, size,
//    policy);
//  - PreStartContainer is offered with `pre_start` and logs each call;
//  - an id Allocate does not know is NOT_FOUND naming the id.
// Every event is one spdlog line with key=value fields.
//
// Thread-safety: every method may be called from any thread; the handlers
// the server runs are thread-safe (they read only immutable state).
//
// Example:
//   kdm::fakes::PluginConfig c;
//   c.resource_name = "nvidia.com/gpu";
//   c.plugin_dir = "/var/lib/kubelet/device-plugins";
//   c.preset = "dgx1-v100";
//   auto p = kdm::fakes::FakeDevicePlugin::Create(std::move(c));
//   if (!p.ok()) return Fail(p.status());
//   if (auto s = (*p)->Start(); !s.ok()) return Fail(s);
//   (*p)->ApplyHealth({{"GPU3", false}});
//   ...
//   (*p)->Stop();
#ifndef KDM_FAKES_GPU_PLUGIN_H_
#define KDM_FAKES_GPU_PLUGIN_H_

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/status.h"
#include "kdm/pluginapi/sdk/device_plugin_handler.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::fakes {

// How GetPreferredAllocation is answered; nullopt (policy "none"): not
// offered.
using PreferredPolicy = std::optional<topology::Policy>;

// "packed", "best-set", "first-fit" or "none"; INVALID_ARGUMENT naming the
// word and the choices otherwise.
StatusOr<PreferredPolicy> ParsePreferredPolicy(std::string_view name);

// The most generic devices --count may ask for (a topology's limit).
inline constexpr int kMaxCountDevices = topology::kMaxDevices;

struct PluginConfig {
  // Extended resource name "<vendor>/<name>", e.g. "nvidia.com/gpu". Required.
  std::string resource_name;
  // Directory of kubelet.sock and the plugin's socket.
  std::string plugin_dir;
  // Socket file name inside plugin_dir; empty: the SDK's default.
  std::string socket_name;

  // Device source: exactly one of these three.
  std::string preset;
  std::string topology_file;
  std::optional<int> count;

  PreferredPolicy policy = topology::Policy::kPacked;
  bool pre_start = false;
  bool cdi = false;

  // Passed to the SDK (tests shorten them).
  bool register_with_kubelet = true;
  std::chrono::milliseconds register_backoff_initial{100};
  std::chrono::milliseconds register_backoff_max{5'000};
  std::chrono::milliseconds watch_interval{200};
  // Test hook: runs each time the plugin has bound its socket, before it
  // records the socket's identity (the window a kubelet cleaning the
  // directory at start can hit). Empty in production.
  std::function<void()> after_bind_for_test;
};

// The result of applying a health map.
struct HealthUpdate {
  int healthy = 0;
  int unhealthy = 0;
  // Ids in the map that are not devices of the plugin (ignored), sorted.
  std::vector<std::string> unknown_ids;
};

// Sets the health of the devices `server` serves from `health` (devices it
// does not name are healthy), logging each change as `resource`'s, and
// pushes one snapshot when anything changed: FakeDevicePlugin::ApplyHealth,
// and FaultyPlugin's, for the server it runs.
HealthUpdate ApplyHealthTo(plugin::PluginServer& server, const std::string& resource,
                           const std::map<std::string, bool>& health);

class FakeDevicePlugin {
 public:
  // Validates the config and loads the devices; touches nothing but the
  // topology file. Errors, each naming what was wrong: INVALID_ARGUMENT for a
  // resource name that is empty or not "<vendor>/<name>", no device source or
  // more than one, a count outside [1, kMaxCountDevices], an unparsable
  // topology file, a socket path too long for a unix socket; NOT_FOUND for an
  // unknown preset (listing the known ones) or a missing topology file.
  static StatusOr<std::unique_ptr<FakeDevicePlugin>> Create(PluginConfig config);

  ~FakeDevicePlugin();

  // Serves and starts registering (see PluginServer::Start).
  Status Start();
  // Stops the server: streams finished, socket removed. Idempotent.
  void Stop();

  // Sets every device's health from `health` (devices it does not name are
  // healthy) and pushes one ListAndWatch snapshot when anything changed.
  HealthUpdate ApplyHealth(const std::map<std::string, bool>& health);

  // What the server answers (the RPCs below, GetDevicePluginOptions from the
  // config); a decorator can wrap it (FaultyPlugin does). Lives as long as
  // this plugin; its calls read only immutable state.
  std::shared_ptr<plugin::DevicePluginHandler> handler() const { return handler_; }

  // The answers the handler gives per container, callable directly.
  StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const v1beta1::ContainerAllocateRequest& request) const;
  // FAILED_PRECONDITION when the policy is none.
  StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferredAllocation(
      const v1beta1::ContainerPreferredAllocationRequest& request) const;

  const PluginConfig& config() const { return config_; }
  const topology::Topology& topology() const { return *topology_; }
  // True for preset and topology-file devices (nvidia device nodes and env).
  bool gpu() const { return gpu_; }
  // What the devices came from, e.g. "preset dgx1-v100", "count 4".
  const std::string& source() const { return source_; }
  // The env variable Allocate sets, e.g. "NVIDIA_VISIBLE_DEVICES".
  const std::string& visible_devices_env() const { return env_name_; }
  plugin::PluginServer& server() { return *server_; }
  const plugin::PluginServer& server() const { return *server_; }

 private:
  FakeDevicePlugin() = default;

  PluginConfig config_;
  std::shared_ptr<const topology::Topology> topology_;
  bool gpu_ = false;
  std::string source_;
  std::string short_name_;
  std::string env_name_;
  std::string cdi_kind_;
  std::shared_ptr<plugin::DevicePluginHandler> handler_;
  std::unique_ptr<plugin::PluginServer> server_;
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_GPU_PLUGIN_H_
