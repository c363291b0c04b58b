// kdm::fakes::FaultyPlugin: a device plugin that breaks the device plugin
// contract in exactly one deliberate way (a "fault"), so that `kdm conform`
// and its tests can show that each conformance check catches what it claims.
// docs/conformance.md has the catalogue: one fault per check, named after it.
//
// In everything its fault does not touch, a FaultyPlugin behaves like the
// healthy FakeDevicePlugin with the same PluginConfig (same device ids, NUMA
// nodes, Allocate and GetPreferredAllocation answers, registration with
// back-off, re-registration after kubelet.sock is created again, re-serving
// after its own socket is deleted), because it is that plugin: the healthy
// plugin's DevicePluginHandler wrapped by one decorator per fault
// (fault_handlers.h), served by the SDK's PluginServer; the registration
// faults rewrite the RegisterRequest through the SDK's hook. Its streams and
// held calls look at their client every 10 ms (the SDK's default is 1 s):
// its faults are about clients that give up. The pref-* faults offer
// GetPreferredAllocation even when config.policy is "none" (answering with
// the packed policy); prestart-unimplemented always says pre_start_required.
//
// The faults (FaultNames(), in the catalogue's order):
//   reg-bad-version         registers with version "v1beta2"
//   reg-bad-resource-name   registers "<vendor>/Bad Name!"
//   reg-endpoint-path       registers endpoint "../<socket name>"
//   reg-options-mismatch    RegisterRequest's pre_start_required is the
//                           opposite of GetDevicePluginOptions' answer
//   lw-no-snapshot          ListAndWatch sends nothing until the client
//                           cancels (or Stop)
//   lw-duplicate-ids        the snapshot lists the first device twice
//   lw-bad-health           the first device's health is "healthy"
//   lw-negative-numa        the first device's NUMA node is -1
//   health-not-sent         after the first snapshot, no message: a health
//                           change (--health-file) never reaches a stream
//   lw-delta-updates        after the first full snapshot, every 200 ms a
//                           message holding one device, its health toggled
//   alloc-two-responses     Allocate answers one container response too many
//   alloc-accept-unknown    Allocate answers OK for ids it never listed
//   alloc-relative-path     the first device spec's host_path is relative
//   alloc-bad-permissions   the first device spec's permissions are "rwx"
//   alloc-bad-env           an env named "1 BAD=NAME"
//   alloc-bad-cdi           a CDI device named with the bare first id
//   alloc-not-concurrent    while another Allocate is in flight: UNAVAILABLE
//                           "busy" (each call is held ~20 ms)
//   pref-wrong-size         one id fewer than allocation_size
//   pref-not-subset         the last answered id is "no-such-device"
//   pref-drop-must-include  must-include ids left out (filled from the rest)
//   pref-duplicates         the first id again in place of the last
//   pref-random             must-include ids plus a random pick of the rest,
//                           never the same set twice in a row when another
//                           set is possible
//   pref-slow               requests with allocation_size >= max(1, n - 1),
//                           n the devices offered (at most the plugin's),
//                           are answered only after the client gives up
//                           (CANCELLED; at most 60 s, or Stop)
//   prestart-unimplemented  pre_start_required, PreStartContainer answers
//                           UNIMPLEMENTED
//   lw-drop-breaks          after the first stream the client cancels, every
//                           later ListAndWatch fails at once with UNAVAILABLE
//   health-stale-streams    as NVIDIA's v0.13: a stream the client
//                           cancelled lingers, and each health change goes
//                           to ONE stream, the longest waiting; one taken
//                           by a cancelled stream is lost
//   no-reregister           registers once, never again after a kubelet
//                           restart
//
// Thread-safety: every method may be called from any thread. The RPC
// handlers run on gRPC's threads, concurrently.
//
// Example:
//   kdm::fakes::PluginConfig c;
//   c.resource_name = "example.com/gpu";
//   c.plugin_dir = "/tmp/kdm-x/device-plugins";
//   c.count = 8;
//   auto p = kdm::fakes::FaultyPlugin::Create(std::move(c), "pref-wrong-size");
//   if (!p.ok()) return Fail(p.status());
//   if (auto s = (*p)->Start(); !s.ok()) return Fail(s);
//   ...
//   (*p)->Stop();
#ifndef KDM_FAKES_FAULTY_PLUGIN_H_
#define KDM_FAKES_FAULTY_PLUGIN_H_

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/fakes/gpu_plugin.h"

namespace kdm::fakes {

// Every fault's CLI name, in the catalogue's order.
const std::vector<std::string>& FaultNames();

// OK when `name` is one of FaultNames(); INVALID_ARGUMENT naming `name` and
// listing the known faults otherwise.
Status CheckFaultName(std::string_view name);

class FaultyPlugin {
 public:
  // Validates the fault name (CheckFaultName) and the config (as
  // FakeDevicePlugin::Create does, with the same errors). Touches nothing but
  // a topology file.
  static StatusOr<std::unique_ptr<FaultyPlugin>> Create(PluginConfig config, std::string fault);

  // Stop()s.
  ~FaultyPlugin();

  FaultyPlugin(const FaultyPlugin&) = delete;
  FaultyPlugin& operator=(const FaultyPlugin&) = delete;

  // Serves on SocketPath() (a stale socket there is removed; the socket is
  // made mode 0600) and, when config.register_with_kubelet, registers with
  // <plugin_dir>/kubelet.sock in the background, retrying with back-off, and
  // registers again after kubelet.sock is created again (unless the fault is
  // no-reregister). Errors: the directory is missing, not a directory or not
  // writable (FAILED_PRECONDITION / PERMISSION_DENIED), the socket cannot be
  // bound (UNAVAILABLE), Start or Stop was already called
  // (FAILED_PRECONDITION).
  Status Start();

  // Ends every ListAndWatch stream and every held call (lw-no-snapshot,
  // pref-slow, alloc-not-concurrent) at once, cancels a Register in flight,
  // stops serving, removes the socket and joins every thread (PluginServer::
  // Stop). Idempotent; fine without Start.
  void Stop();

  // Absolute path of the plugin's socket.
  std::string SocketPath() const;
  // Successful Register calls so far.
  int RegistrationCount() const;
  // Waits until RegistrationCount() >= count or `timeout` passes; returns
  // whether it was reached.
  bool WaitForRegistrationCount(int count, std::chrono::milliseconds timeout) const;
  // The last Register failure (OK if none since the last success).
  Status LastRegistrationError() const;
  // Calls the fault holds now (lw-no-snapshot streams, pref-slow calls); each
  // is released within ~10 ms of its client giving up, and at once on Stop.
  int HeldCalls() const;

  // As FakeDevicePlugin::ApplyHealth, on the devices this plugin serves
  // (what `kdm plugin --fault F --health-file FILE` applies).
  HealthUpdate ApplyHealth(const std::map<std::string, bool>& health);

  // The fault's name, e.g. "pref-wrong-size".
  const std::string& fault() const;
  // The healthy plugin whose answers this one corrupts (never started).
  const FakeDevicePlugin& healthy() const;

 private:
  class Impl;
  explicit FaultyPlugin(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kdm::fakes

#endif  // KDM_FAKES_FAULTY_PLUGIN_H_
