#include "kdm/fakes/gpu_plugin.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <set>
#include <utility>

#include "kdm/base/log_value.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

namespace kdm::fakes {
namespace {

constexpr const char* kNvidiaControlNodes[] = {"/dev/nvidiactl", "/dev/nvidia-uvm",
                                               "/dev/nvidia-uvm-tools"};

std::string Join(const std::vector<std::string>& items, const char* sep = ",") {
  std::string out;
  for (const auto& s : items) {
    if (!out.empty()) out += sep;
    out += s;
  }
  return out;
}

template <typename Repeated>
std::vector<std::string> ToVector(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

// "example.com/fpga" -> "FPGA_VISIBLE_DEVICES"; "x.io/my-nic" -> "MY_NIC_…".
std::string EnvNameFor(const std::string& short_name) {
  std::string out;
  for (char c : short_name) {
    unsigned char u = static_cast<unsigned char>(c);
    out += std::isalnum(u) ? static_cast<char>(std::toupper(u)) : '_';
  }
  if (!out.empty() && std::isdigit(static_cast<unsigned char>(out[0]))) out = "_" + out;
  return out + "_VISIBLE_DEVICES";
}

// Topology of `n` generic devices with no links and no NUMA node.
StatusOr<topology::Topology> GenericTopology(const std::string& short_name, int n) {
  std::vector<topology::DeviceInfo> devices;
  devices.reserve(n);
  for (int i = 0; i < n; ++i) devices.push_back({short_name + "-" + std::to_string(i), i, {}});
  std::vector<std::vector<topology::Link>> links(n, std::vector<topology::Link>(n));
  return topology::Topology::Create(std::move(devices), std::move(links));
}

void AddSpec(v1beta1::ContainerAllocateResponse& r, const std::string& path) {
  v1beta1::DeviceSpec* spec = r.add_devices();
  spec->set_container_path(path);
  spec->set_host_path(path);
  spec->set_permissions("rw");
}

// The fake plugin's answers as the SDK serves them.
class FakeHandler final : public plugin::PluginPerContainerHandler<FakeDevicePlugin> {
 public:
  using PluginPerContainerHandler::PluginPerContainerHandler;

  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    v1beta1::DevicePluginOptions o;
    o.set_pre_start_required(plugin().config().pre_start);
    o.set_get_preferred_allocation_available(plugin().config().policy.has_value());
    return o;
  }

  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, plugin::CallContext& call) override {
    if (!plugin().config().policy) {
      return UnimplementedError("GetPreferredAllocation is not offered by " +
                                plugin().config().resource_name);
    }
    return PluginPerContainerHandler::GetPreferredAllocation(request, call);
  }

  Status PreStartContainer(const std::vector<std::string>& ids, plugin::CallContext&) override {
    if (plugin().config().pre_start) {
      spdlog::info("event=pre_start_container resource={} devices={}",
                   plugin().config().resource_name, Join(ids));
    }
    return OkStatus();
  }
};

}  // namespace

StatusOr<PreferredPolicy> ParsePreferredPolicy(std::string_view name) {
  if (name == "none") return PreferredPolicy(std::nullopt);
  StatusOr<topology::Policy> p = topology::ParsePolicy(name);
  if (!p.ok()) {
    return InvalidArgumentError("unknown policy \"" + std::string(name) +
                                "\" (choose packed, best-set, first-fit or none)");
  }
  return PreferredPolicy(*p);
}

StatusOr<std::unique_ptr<FakeDevicePlugin>> FakeDevicePlugin::Create(PluginConfig config) {
  const std::string& resource = config.resource_name;
  KDM_RETURN_IF_ERROR(pluginapi::ValidateResourceName(resource));
  const size_t slash = resource.find('/');
  int sources = !config.preset.empty() + !config.topology_file.empty() + config.count.has_value();
  if (sources != 1) {
    return InvalidArgumentError(
        std::string(sources == 0 ? "no device source" : "more than one device source") +
        ": give exactly one of --preset NAME, --topology FILE or --count N");
  }

  std::unique_ptr<FakeDevicePlugin> p(new FakeDevicePlugin());
  p->short_name_ = resource.substr(slash + 1);
  p->cdi_kind_ = resource;
  if (config.count) {
    int n = *config.count;
    if (n < 1 || n > kMaxCountDevices) {
      return InvalidArgumentError("--count " + std::to_string(n) + " is outside [1, " +
                                  std::to_string(kMaxCountDevices) + "]");
    }
    KDM_ASSIGN_OR_RETURN(topology::Topology t, GenericTopology(p->short_name_, n));
    p->topology_ = std::make_shared<const topology::Topology>(std::move(t));
    p->gpu_ = false;
    p->source_ = "count " + std::to_string(n);
    p->env_name_ = EnvNameFor(p->short_name_);
  } else if (!config.preset.empty()) {
    StatusOr<topology::Topology> t = topology::Preset(config.preset);
    if (!t.ok()) return t.status();
    p->topology_ = std::make_shared<const topology::Topology>(std::move(*t));
    p->gpu_ = true;
    p->source_ = "preset " + config.preset;
    p->env_name_ = "NVIDIA_VISIBLE_DEVICES";
  } else {
    StatusOr<topology::Topology> t = topology::LoadTopologyFile(config.topology_file);
    if (!t.ok()) return t.status();
    p->topology_ = std::make_shared<const topology::Topology>(std::move(*t));
    p->gpu_ = true;
    p->source_ = "topology " + config.topology_file;
    p->env_name_ = "NVIDIA_VISIBLE_DEVICES";
  }

  plugin::PluginServer::Options o;
  o.resource_name = resource;
  o.plugin_dir = config.plugin_dir;
  o.socket_name = config.socket_name;
  for (const topology::DeviceInfo& d : p->topology_->devices()) {
    plugin::Device dev{d.id, true, {}};
    if (d.numa) dev.numa_nodes.push_back(*d.numa);
    o.devices.push_back(std::move(dev));
  }
  // The handler reads config_, which is set below, before anything serves.
  p->handler_ = std::make_shared<FakeHandler>(p.get());
  o.handler = p->handler_;
  o.register_with_kubelet = config.register_with_kubelet;
  o.register_backoff_initial = config.register_backoff_initial;
  o.register_backoff_max = config.register_backoff_max;
  o.watch_interval = config.watch_interval;
  o.after_bind_for_test = config.after_bind_for_test;
  StatusOr<std::unique_ptr<plugin::PluginServer>> server =
      plugin::PluginServer::Create(std::move(o));
  if (!server.ok()) return server.status();
  p->server_ = std::move(*server);
  p->config_ = std::move(config);
  return p;
}

FakeDevicePlugin::~FakeDevicePlugin() { Stop(); }

Status FakeDevicePlugin::Start() {
  KDM_RETURN_IF_ERROR(server_->Start());
  spdlog::info(
      "event=serving resource={} socket={} devices={} source={} policy={} "
      "pre_start={} cdi={}",
      config_.resource_name, server_->SocketPath(), topology_->size(), QuoteLogValue(source_),
      config_.policy ? topology::PolicyName(*config_.policy) : "none", config_.pre_start,
      config_.cdi);
  return OkStatus();
}

void FakeDevicePlugin::Stop() {
  if (server_) server_->Stop();
}

HealthUpdate ApplyHealthTo(plugin::PluginServer& server, const std::string& resource,
                           const std::map<std::string, bool>& health) {
  HealthUpdate update;
  std::vector<plugin::Device> devices = server.Devices();
  std::set<std::string> known;
  bool changed = false;
  for (plugin::Device& d : devices) {
    known.insert(d.id);
    auto it = health.find(d.id);
    bool healthy = it == health.end() || it->second;
    if (d.healthy != healthy) {
      changed = true;
      spdlog::info("event=health_changed resource={} device={} health={}", resource, d.id,
                   healthy ? "Healthy" : "Unhealthy");
    }
    d.healthy = healthy;
    ++(healthy ? update.healthy : update.unhealthy);
  }
  for (const auto& [id, healthy] : health) {
    if (!known.count(id)) update.unknown_ids.push_back(id);
  }
  if (!update.unknown_ids.empty()) {
    spdlog::warn("event=health_unknown_devices resource={} ids={} known={}", resource,
                 Join(update.unknown_ids),
                 Join(std::vector<std::string>(known.begin(), known.end())));
  }
  if (changed) server.SetDevices(std::move(devices));
  return update;
}

HealthUpdate FakeDevicePlugin::ApplyHealth(const std::map<std::string, bool>& health) {
  return ApplyHealthTo(*server_, config_.resource_name, health);
}

StatusOr<v1beta1::ContainerAllocateResponse> FakeDevicePlugin::Allocate(
    const v1beta1::ContainerAllocateRequest& request) const {
  std::vector<std::string> ids = ToVector(request.devices_ids());
  if (ids.empty()) {
    return InvalidArgumentError("allocate request for " + config_.resource_name +
                                " names no device");
  }
  std::vector<int> indices;
  std::set<std::string> seen;
  for (const std::string& id : ids) {
    std::optional<int> index = topology_->IndexOf(id);
    if (!index) {
      spdlog::warn("event=allocate_refused resource={} reason=unknown_device device={}",
                   config_.resource_name, id);
      return NotFoundError("device \"" + id + "\" is not a device of " + config_.resource_name);
    }
    if (!seen.insert(id).second) {
      return InvalidArgumentError("device \"" + id + "\" is listed twice");
    }
    indices.push_back(*index);
  }
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_envs())[env_name_] = Join(ids);
  for (int i : indices) {
    AddSpec(r, (gpu_ ? "/dev/nvidia" : "/dev/" + short_name_) + std::to_string(i));
  }
  if (gpu_) {
    for (const char* node : kNvidiaControlNodes) AddSpec(r, node);
  }
  if (config_.cdi) {
    for (const std::string& id : ids) r.add_cdi_devices()->set_name(cdi_kind_ + "=" + id);
  }
  spdlog::info("event=allocate resource={} devices={}", config_.resource_name, Join(ids));
  return r;
}

StatusOr<v1beta1::ContainerPreferredAllocationResponse> FakeDevicePlugin::PreferredAllocation(
    const v1beta1::ContainerPreferredAllocationRequest& request) const {
  if (!config_.policy) {
    return FailedPreconditionError("GetPreferredAllocation is not offered (policy none)");
  }
  std::vector<std::string> available = ToVector(request.available_deviceids());
  std::vector<std::string> must = ToVector(request.must_include_deviceids());
  StatusOr<std::vector<std::string>> chosen = topology::AllocateIds(
      *topology_, available, must, request.allocation_size(), *config_.policy);
  if (!chosen.ok()) {
    spdlog::warn(
        "event=preferred_allocation_refused resource={} available={} must_include={} "
        "size={} error={}",
        config_.resource_name, Join(available), Join(must), request.allocation_size(),
        QuoteLogValue(chosen.status().message()));
    return chosen.status();
  }
  v1beta1::ContainerPreferredAllocationResponse r;
  for (const std::string& id : *chosen) r.add_deviceids(id);
  spdlog::info(
      "event=preferred_allocation resource={} policy={} available={} must_include={} "
      "size={} chosen={}",
      config_.resource_name, topology::PolicyName(*config_.policy), Join(available), Join(must),
      request.allocation_size(), Join(*chosen));
  return r;
}

}  // namespace kdm::fakes
