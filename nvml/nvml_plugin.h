// kdm::nvml::NvmlPlugin: the NVIDIA GPU device plugin behind
// `kdm plugin --nvml`, served by the SDK's PluginServer.
//
//  - Create() loads NVML (library.h), discovers the GPUs (discovery.h) and
//    their topology from NVML's link answers; the device ids are the GPU
//    UUIDs, each with its NUMA node from sysfs;
//  - Start() starts the HealthMonitor (health_monitor.h: NVIDIA's rules,
//    DP_DISABLE_HEALTHCHECKS as given in the config, the optional recovery
//    window), then the server. Each health change replaces the server's
//    device set at once, so every ListAndWatch stream sends it at once;
//  - Allocate answers in NVIDIA's shapes (allocate_answer.h): by the device
//    list strategies NVIDIA_VISIBLE_DEVICES, volume mounts, a CDI annotation
//    and CDI names, with UUIDs or indices, and the device nodes; an unknown
//    id is NOT_FOUND naming it;
//  - GetPreferredAllocation answers topology::AllocateIds on the NVML
//    topology with the configured policy, honouring must-include and
//    available exactly as the fake GPU plugin does (the same call).
//
// Thread-safety: every method may be called from any thread; the handler's
// calls read immutable state (the health lives in the server's device set).
//
// Example:
//   NvmlPluginConfig c;
//   c.plugin_dir = "/var/lib/kubelet/device-plugins";
//   auto p = NvmlPlugin::Create(std::move(c));
//   if (!p.ok()) return Fail(p.status());   // "NVML not found: ..." and more
//   if (auto s = (*p)->Start(); !s.ok()) return Fail(s);
//   ...
//   (*p)->Stop();
#ifndef KDM_NVML_NVML_PLUGIN_H_
#define KDM_NVML_NVML_PLUGIN_H_

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/status.h"
#include "kdm/nvml/allocate_answer.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/health_monitor.h"
#include "kdm/nvml/health_rules.h"
#include "kdm/nvml/library.h"
#include "kdm/pluginapi/sdk/device_plugin_handler.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/topology.h"

namespace kdm::nvml {

inline constexpr char kNvidiaGpuResource[] = "nvidia.com/gpu";

struct NvmlPluginConfig {
  std::string resource_name = kNvidiaGpuResource;
  // Directory of kubelet.sock and the plugin's socket.
  std::string plugin_dir;
  // Socket file name in plugin_dir; empty: the SDK's default.
  std::string socket_name;

  // The NVML library: empty for libnvidia-ml.so.1 through the loader's path.
  std::string library_path;
  std::string sysfs_root = "/sys";
  // Where the host's /dev is seen (allocate_answer.h).
  std::string dev_root = "/";
  // Where the device nodes are on the host (NVIDIA_DEV_ROOT; allocate_answer.h).
  std::string host_dev_root = "/";
  // What names a GPU toward the runtime and how the names reach it
  // (DEVICE_ID_STRATEGY, DEVICE_LIST_STRATEGY; allocate_answer.h).
  DeviceIdStrategy device_id_strategy = DeviceIdStrategy::kUuid;
  DeviceListStrategies device_list;
  // Device nodes in the Allocate answer (PASS_DEVICE_SPECS).
  bool pass_device_specs = true;
  std::string cdi_annotation_prefix = kDefaultCdiAnnotationPrefix;
  // `--cdi`: also answer CDI names in the CDI devices field (the same as
  // cdi-cri in device_list).
  bool cdi = false;
  topology::Policy policy = topology::Policy::kPacked;

  // Health: what DP_DISABLE_HEALTHCHECKS turned off, the recovery window
  // (nullopt: none, as NVIDIA's plugin) and the event wait's timeout.
  HealthChecks health_checks;
  std::optional<std::chrono::milliseconds> health_recovery;
  std::chrono::milliseconds health_wait_timeout{100};

  // Passed to the SDK (tests shorten them).
  bool register_with_kubelet = true;
  std::chrono::milliseconds register_backoff_initial{100};
  std::chrono::milliseconds register_backoff_max{5'000};
  std::chrono::milliseconds watch_interval{200};
};

class NvmlPlugin {
 public:
  // Loads NVML, discovers the GPUs and their topology, builds the server.
  // Errors: Library::Load's (NOT_FOUND "NVML not found: ...; is the NVIDIA
  // driver installed?" when the library is missing), discovery's (the NVML
  // call and GPU named), FAILED_PRECONDITION when NVML reports no GPU, and
  // the server's (a socket path too long).
  static StatusOr<std::unique_ptr<NvmlPlugin>> Create(NvmlPluginConfig config);
  // The same with a library already loaded (config.library_path is then only
  // for the log): a caller that must tell "no NVML" apart loads it itself.
  // REQUIRES: `library` is not null.
  static StatusOr<std::unique_ptr<NvmlPlugin>> Create(NvmlPluginConfig config,
                                                      std::unique_ptr<Library> library);

  // Stop().
  ~NvmlPlugin();

  // Starts the health monitor, then serves and registers. Errors: the
  // monitor's (the event set cannot be created) or the server's.
  Status Start();
  // Stops the monitor and the server. Idempotent.
  void Stop();

  std::shared_ptr<plugin::DevicePluginHandler> handler() const { return handler_; }
  StatusOr<v1beta1::ContainerAllocateResponse> Allocate(
      const v1beta1::ContainerAllocateRequest& request) const;
  StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferredAllocation(
      const v1beta1::ContainerPreferredAllocationRequest& request) const;

  const NvmlPluginConfig& config() const { return config_; }
  const NodeInfo& node() const { return node_; }
  const topology::Topology& topology() const { return *topology_; }
  plugin::PluginServer& server() { return *server_; }
  // Null before Start().
  const HealthMonitor* health_monitor() const { return monitor_.get(); }

 private:
  NvmlPlugin() = default;
  void OnHealthChange(const std::map<std::string, bool>& health);

  NvmlPluginConfig config_;
  std::unique_ptr<Library> library_;
  NodeInfo node_;
  std::shared_ptr<const topology::Topology> topology_;
  std::unique_ptr<AllocateAnswerBuilder> answers_;
  std::shared_ptr<plugin::DevicePluginHandler> handler_;
  std::unique_ptr<plugin::PluginServer> server_;
  std::unique_ptr<HealthMonitor> monitor_;
};

}  // namespace kdm::nvml

#endif  // KDM_NVML_NVML_PLUGIN_H_
