// The faults of kdm::fakes::FaultyPlugin as decorators: each fault wraps the
// healthy FakeDevicePlugin's handler (gpu_plugin.h) and changes only the
// RPCs its check is about, and the registration faults rewrite the
// RegisterRequest through the SDK's hook (PluginServer::Options::
// rewrite_register_request). FaultyPlugin serves the result with the SDK's
// PluginServer, so serving, registration, back-off and kubelet restarts are
// the SDK's, and a faulty plugin differs from the healthy one in its fault
// only. faulty_plugin.h lists what each fault does.
//
// Private header (not installed): FaultyPlugin and its tests use it.
//
// Thread-safety: a FaultSetup's handler is thread-safe like any handler;
// HeldCallCounter may be read from any thread.
#ifndef KDM_FAKES_FAULT_HANDLERS_H_
#define KDM_FAKES_FAULT_HANDLERS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/fakes/gpu_plugin.h"
#include "kdm/pluginapi/sdk/device_plugin_handler.h"

namespace kdm::fakes {

// Counts the calls a fault holds on purpose (lw-no-snapshot streams,
// pref-slow calls): FaultyPlugin::HeldCalls.
class HeldCallCounter {
 public:
  int count() const {
    kdm::MutexLock lock(&mu_);
    return held_;
  }

  // Counts one held call for as long as it lives.
  class Hold {
   public:
    explicit Hold(HeldCallCounter& counter) : counter_(counter) { counter_.Add(1); }
    ~Hold() { counter_.Add(-1); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    HeldCallCounter& counter_;
  };

 private:
  void Add(int d) {
    kdm::MutexLock lock(&mu_);
    held_ += d;
  }

  mutable kdm::Mutex mu_;
  int held_ ABSL_GUARDED_BY(mu_) = 0;
};

// What a fault changes: the handler to serve and, for the registration
// faults, the RegisterRequest hook (empty when registration is healthy).
struct FaultSetup {
  std::shared_ptr<plugin::DevicePluginHandler> handler;
  std::function<bool(v1beta1::RegisterRequest&, int registrations)> rewrite_register_request;
};

// The setup of fault `name` (one of FaultNames(); INVALID_ARGUMENT
// otherwise) around `healthy`'s handler. `healthy` and `held` must outlive
// the handler.
StatusOr<FaultSetup> MakeFaultSetup(const std::string& name, const FakeDevicePlugin& healthy,
                                    HeldCallCounter& held);

}  // namespace kdm::fakes

#endif  // KDM_FAKES_FAULT_HANDLERS_H_
