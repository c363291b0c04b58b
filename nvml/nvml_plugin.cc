#include "kdm/nvml/nvml_plugin.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "kdm/base/log_value.h"

namespace kdm::nvml {
namespace {

template <typename Repeated>
std::vector<std::string> ToVector(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::string Quoted(std::string_view text) { return QuoteLogValue(text, kMaxLogValueBytes); }

class NvmlHandler final : public plugin::PluginPerContainerHandler<NvmlPlugin> {
 public:
  using PluginPerContainerHandler::PluginPerContainerHandler;

  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    v1beta1::DevicePluginOptions o;
    o.set_get_preferred_allocation_available(true);
    return o;
  }
};

}  // namespace

StatusOr<std::unique_ptr<NvmlPlugin>> NvmlPlugin::Create(NvmlPluginConfig config) {
  KDM_ASSIGN_OR_RETURN(std::unique_ptr<Library> library, Library::Load(config.library_path));
  return Create(std::move(config), std::move(library));
}

StatusOr<std::unique_ptr<NvmlPlugin>> NvmlPlugin::Create(NvmlPluginConfig config,
                                                         std::unique_ptr<Library> library) {
  std::unique_ptr<NvmlPlugin> p(new NvmlPlugin());
  p->library_ = std::move(library);
  KDM_ASSIGN_OR_RETURN(p->node_, Discover(*p->library_, {.sysfs_root = config.sysfs_root}));
  if (p->node_.gpus.empty()) {
    return FailedPreconditionError("NVML (" + p->library_->path() + ") reports no GPU");
  }
  KDM_ASSIGN_OR_RETURN(NvmlTopology t, DiscoverTopology(*p->library_, p->node_));
  for (const std::string& line : t.ignored) {
    spdlog::warn("event=nvlink_ignored detail={}", Quoted(line));
  }
  p->topology_ = std::make_shared<const topology::Topology>(std::move(t.topology));

  std::vector<GpuNode> nodes;
  for (const GpuInfo& g : p->node_.gpus) nodes.push_back({g.uuid, g.minor, g.index});
  if (config.cdi) config.device_list.cdi_cri = true;
  AllocateAnswerOptions answer_options;
  answer_options.dev_root = config.dev_root;
  answer_options.host_dev_root = config.host_dev_root;
  answer_options.id_strategy = config.device_id_strategy;
  answer_options.list = config.device_list;
  answer_options.pass_device_specs = config.pass_device_specs;
  answer_options.cdi_kind = config.resource_name;
  answer_options.cdi_annotation_prefix = config.cdi_annotation_prefix;
  p->answers_ = std::make_unique<AllocateAnswerBuilder>(std::move(nodes), answer_options);

  plugin::PluginServer::Options o;
  o.resource_name = config.resource_name;
  o.plugin_dir = config.plugin_dir;
  o.socket_name = config.socket_name;
  for (const GpuInfo& g : p->node_.gpus) {
    plugin::Device dev{g.uuid, true, {}};
    if (g.numa) dev.numa_nodes.push_back(*g.numa);
    o.devices.push_back(std::move(dev));
  }
  p->handler_ = std::make_shared<NvmlHandler>(p.get());
  o.handler = p->handler_;
  o.register_with_kubelet = config.register_with_kubelet;
  o.register_backoff_initial = config.register_backoff_initial;
  o.register_backoff_max = config.register_backoff_max;
  o.watch_interval = config.watch_interval;
  KDM_ASSIGN_OR_RETURN(p->server_, plugin::PluginServer::Create(std::move(o)));
  p->config_ = std::move(config);
  return p;
}

NvmlPlugin::~NvmlPlugin() { Stop(); }

Status NvmlPlugin::Start() {
  HealthMonitor::Options h;
  h.checks = config_.health_checks;
  h.recovery = config_.health_recovery;
  h.wait_timeout = config_.health_wait_timeout;
  h.on_change = [this](const std::map<std::string, bool>& health,
                       const std::vector<HealthChange>&) { OnHealthChange(health); };
  std::vector<MonitoredGpu> gpus;
  for (const GpuInfo& g : node_.gpus) gpus.push_back({g.uuid, g.handle});
  KDM_ASSIGN_OR_RETURN(monitor_, HealthMonitor::Start(library_->api(), std::move(gpus), h));
  if (Status s = server_->Start(); !s.ok()) {
    monitor_->Stop();
    return s;
  }
  spdlog::info(
      "event=serving resource={} socket={} devices={} source=nvml library={} driver={} cuda={} "
      "policy={} cdi={} device_id_strategy={} device_list_strategy={} pass_device_specs={} "
      "health_recovery_ms={} health_checks={}",
      config_.resource_name, server_->SocketPath(), node_.gpus.size(), Quoted(library_->path()),
      Quoted(node_.driver_version), Quoted(node_.cuda_driver_version),
      topology::PolicyName(config_.policy), config_.device_list.cdi_cri,
      config_.device_id_strategy == DeviceIdStrategy::kIndex ? "index" : "uuid",
      DeviceListStrategiesName(config_.device_list), config_.pass_device_specs,
      config_.health_recovery ? std::to_string(config_.health_recovery->count()) : "off",
      config_.health_checks.disabled ? "off"
                                     : (config_.health_checks.xids_disabled ? "ecc" : "on"));
  return OkStatus();
}

void NvmlPlugin::Stop() {
  // The monitor first: its callback writes to the server.
  if (monitor_) monitor_->Stop();
  if (server_) server_->Stop();
}

void NvmlPlugin::OnHealthChange(const std::map<std::string, bool>& health) {
  std::vector<plugin::Device> devices = server_->Devices();
  bool changed = false;
  for (plugin::Device& d : devices) {
    auto it = health.find(d.id);
    if (it == health.end() || it->second == d.healthy) continue;
    d.healthy = it->second;
    changed = true;
    spdlog::info("event=health_changed resource={} device={} health={}", config_.resource_name,
                 Quoted(d.id), d.healthy ? "Healthy" : "Unhealthy");
  }
  if (changed) server_->SetDevices(std::move(devices));
}

StatusOr<v1beta1::ContainerAllocateResponse> NvmlPlugin::Allocate(
    const v1beta1::ContainerAllocateRequest& request) const {
  std::vector<std::string> ids = ToVector(request.devices_ids());
  StatusOr<AllocateAnswer> a = answers_->Answer(ids);
  if (!a.ok()) {
    spdlog::warn("event=allocate_refused resource={} devices={} error={}", config_.resource_name,
                 Quoted(Join(ids)), Quoted(a.status().message()));
    return a.status();
  }
  v1beta1::ContainerAllocateResponse r;
  for (const auto& [name, value] : a->envs) (*r.mutable_envs())[name] = value;
  for (const ContainerMount& m : a->mounts) {
    v1beta1::Mount* mount = r.add_mounts();
    mount->set_container_path(m.container_path);
    mount->set_host_path(m.host_path);
  }
  for (const DeviceNode& node : a->device_nodes) {
    v1beta1::DeviceSpec* spec = r.add_devices();
    spec->set_container_path(node.container_path);
    spec->set_host_path(node.host_path);
    spec->set_permissions("rw");
  }
  for (const auto& [key, value] : a->annotations) (*r.mutable_annotations())[key] = value;
  for (const std::string& name : a->cdi_devices) r.add_cdi_devices()->set_name(name);
  spdlog::info("event=allocate resource={} devices={}", config_.resource_name, Quoted(Join(ids)));
  return r;
}

StatusOr<v1beta1::ContainerPreferredAllocationResponse> NvmlPlugin::PreferredAllocation(
    const v1beta1::ContainerPreferredAllocationRequest& request) const {
  std::vector<std::string> available = ToVector(request.available_deviceids());
  std::vector<std::string> must = ToVector(request.must_include_deviceids());
  StatusOr<std::vector<std::string>> chosen =
      topology::AllocateIds(*topology_, available, must, request.allocation_size(), config_.policy);
  if (!chosen.ok()) {
    spdlog::warn(
        "event=preferred_allocation_refused resource={} available={} must_include={} size={} "
        "error={}",
        config_.resource_name, Quoted(Join(available)), Quoted(Join(must)),
        request.allocation_size(), Quoted(chosen.status().message()));
    return chosen.status();
  }
  v1beta1::ContainerPreferredAllocationResponse r;
  for (const std::string& id : *chosen) r.add_deviceids(id);
  spdlog::info(
      "event=preferred_allocation resource={} policy={} available={} must_include={} size={} "
      "chosen={}",
      config_.resource_name, topology::PolicyName(config_.policy), Quoted(Join(available)),
      Quoted(Join(must)), request.allocation_size(), Quoted(Join(*chosen)));
  return r;
}

}  // namespace kdm::nvml
