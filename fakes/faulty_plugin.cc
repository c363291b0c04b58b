#include "kdm/fakes/faulty_plugin.h"

#include <utility>

#include "kdm/fakes/fault_handlers.h"
#include "kdm/pluginapi/sdk/plugin_server.h"

namespace kdm::fakes {
namespace {

// How often a faulty plugin's held calls and idle streams look at their
// client: its faults are about what happens when a client gives up, and
// `kdm conform` cancels a stream and opens the next within milliseconds
// (lw-drop-breaks must have noticed by then).
constexpr std::chrono::milliseconds kCancelCheckInterval{10};

}  // namespace

Status CheckFaultName(std::string_view name) {
  for (const std::string& known : FaultNames()) {
    if (name == known) return OkStatus();
  }
  std::string known;
  for (const std::string& n : FaultNames()) known += (known.empty() ? "" : ", ") + n;
  // A huge name is cut, so that the message stays one readable line.
  constexpr size_t kShown = 64;
  std::string shown(name.substr(0, kShown));
  if (name.size() > kShown) shown += "...";
  return InvalidArgumentError("unknown fault \"" + shown + "\" (known: " + known + ")");
}

// The healthy plugin, its handler wrapped by the fault, served by the SDK.
class FaultyPlugin::Impl {
 public:
  Impl(std::string fault, std::string resource, std::unique_ptr<FakeDevicePlugin> healthy)
      : fault_(std::move(fault)), resource_(std::move(resource)), healthy_(std::move(healthy)) {}

  // Stops the server before the handler's parts (healthy_, held_) go.
  ~Impl() {
    if (server_) server_->Stop();
  }

  std::string fault_;
  std::string resource_;
  std::unique_ptr<FakeDevicePlugin> healthy_;
  HeldCallCounter held_;
  std::unique_ptr<plugin::PluginServer> server_;
};

StatusOr<std::unique_ptr<FaultyPlugin>> FaultyPlugin::Create(PluginConfig config,
                                                             std::string fault) {
  KDM_RETURN_IF_ERROR(CheckFaultName(fault));
  PluginConfig healthy_config = config;
  healthy_config.register_with_kubelet = false;
  // The pref-* faults need GetPreferredAllocation whatever --policy says.
  if (fault.rfind("pref-", 0) == 0 && !healthy_config.policy) {
    healthy_config.policy = topology::Policy::kPacked;
  }
  KDM_ASSIGN_OR_RETURN(std::unique_ptr<FakeDevicePlugin> healthy,
                       FakeDevicePlugin::Create(std::move(healthy_config)));
  auto impl = std::make_unique<Impl>(fault, config.resource_name, std::move(healthy));
  KDM_ASSIGN_OR_RETURN(FaultSetup setup, MakeFaultSetup(fault, *impl->healthy_, impl->held_));

  plugin::PluginServer::Options o;
  o.resource_name = config.resource_name;
  o.plugin_dir = config.plugin_dir;
  o.socket_name = config.socket_name;
  o.devices = impl->healthy_->server().Devices();
  o.handler = std::move(setup.handler);
  o.rewrite_register_request = std::move(setup.rewrite_register_request);
  o.register_with_kubelet = config.register_with_kubelet;
  o.register_backoff_initial = config.register_backoff_initial;
  o.register_backoff_max = config.register_backoff_max;
  o.watch_interval = config.watch_interval;
  o.cancel_check_interval = kCancelCheckInterval;
  o.after_bind_for_test = config.after_bind_for_test;
  // The SDK refuses ids it does not list before any handler; this fault is
  // the plugin that does not.
  o.refuse_unlisted_ids = fault != "alloc-accept-unknown";
  KDM_ASSIGN_OR_RETURN(impl->server_, plugin::PluginServer::Create(std::move(o)));
  return std::unique_ptr<FaultyPlugin>(new FaultyPlugin(std::move(impl)));
}

FaultyPlugin::FaultyPlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FaultyPlugin::~FaultyPlugin() { Stop(); }
Status FaultyPlugin::Start() { return impl_->server_->Start(); }
void FaultyPlugin::Stop() { impl_->server_->Stop(); }
std::string FaultyPlugin::SocketPath() const { return impl_->server_->SocketPath(); }
int FaultyPlugin::RegistrationCount() const { return impl_->server_->RegistrationCount(); }
bool FaultyPlugin::WaitForRegistrationCount(int count, std::chrono::milliseconds timeout) const {
  return impl_->server_->WaitForRegistrationCount(count, timeout);
}
Status FaultyPlugin::LastRegistrationError() const {
  return impl_->server_->LastRegistrationError();
}
HealthUpdate FaultyPlugin::ApplyHealth(const std::map<std::string, bool>& health) {
  return ApplyHealthTo(*impl_->server_, impl_->resource_, health);
}
int FaultyPlugin::HeldCalls() const { return impl_->held_.count(); }
const std::string& FaultyPlugin::fault() const { return impl_->fault_; }
const FakeDevicePlugin& FaultyPlugin::healthy() const { return *impl_->healthy_; }

}  // namespace kdm::fakes
