// kdm::plugin::PluginServer: the C++ device plugin SDK.
//
// A plugin author supplies a resource name, the devices and a
// DevicePluginHandler (device_plugin_handler.h: the answers of the five RPCs),
// or, for the simple case, just an Allocate function (and, optionally,
// GetPreferredAllocation and PreStartContainer functions), which the server
// wraps in a handler of its own. The server then:
//   - serves the v1beta1 DevicePlugin service on <dir>/<socket_name> (a stale
//     socket there is removed first; the socket is made mode 0600);
//   - registers with <dir>/kubelet.sock, retrying with back-off until it is
//     registered or stopped; a refusal's text is kept (LastRegistrationError);
//   - refuses an Allocate, GetPreferredAllocation or PreStartContainer
//     naming an id it does not list (NOT_FOUND; INVALID_ARGUMENT for
//     GetPreferredAllocation), before the handler runs;
//   - sends a full ListAndWatch snapshot to every open stream whenever the
//     devices or their health change (SetDevices, SetHealth); a slow stream
//     only ever gets the newest snapshot (coalescing, no queue);
//   - notices a kubelet restart (its own socket deleted, or kubelet.sock
//     removed and created again), then serves and registers again;
//   - stops cleanly: streams finished, socket removed, threads joined.
//
// Thread-safety: every method may be called from any thread. The handler runs
// on gRPC threads, possibly concurrently; it must be thread-safe.
//
// Example:
//   kdm::plugin::PluginServer::Options o;
//   o.resource_name = "example.com/fpga";
//   o.devices = {{"fpga0", true, {0}}, {"fpga1", true, {1}}};
//   o.allocate = [](const v1beta1::ContainerAllocateRequest& req)
//       -> kdm::StatusOr<v1beta1::ContainerAllocateResponse> {
//     v1beta1::ContainerAllocateResponse r;
//     (*r.mutable_envs())["FPGAS"] = Join(req.devices_ids());
//     return r;
//   };
//   auto server = kdm::plugin::PluginServer::Create(std::move(o));
//   if (!server.ok()) return Fail(server.status());
//   if (auto s = (*server)->Start(); !s.ok()) return Fail(s);
//   ...
//   (*server)->Stop();
#ifndef KDM_PLUGINAPI_SDK_PLUGIN_SERVER_H_
#define KDM_PLUGINAPI_SDK_PLUGIN_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/clock.h"
#include "kdm/base/env.h"
#include "kdm/base/status.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/sdk/device_plugin_handler.h"

namespace kdm::plugin {

class PluginServer {
 public:
  // Answers one ContainerAllocateRequest. An error is returned to the kubelet
  // as the RPC's status (its code and message).
  using AllocateHandler = std::function<StatusOr<v1beta1::ContainerAllocateResponse>(
      const v1beta1::ContainerAllocateRequest&)>;
  // Answers one ContainerPreferredAllocationRequest.
  using PreferredAllocationHandler =
      std::function<StatusOr<v1beta1::ContainerPreferredAllocationResponse>(
          const v1beta1::ContainerPreferredAllocationRequest&)>;
  // Called with the device ids of a container before it starts.
  using PreStartHandler = std::function<Status(const std::vector<std::string>& device_ids)>;

  struct Options {
    // Extended resource name, e.g. "vendor.com/gpu". Required.
    std::string resource_name;
    // Directory holding kubelet.sock and the plugin's own socket. A relative
    // path is made absolute by Create, against the working directory then.
    std::string plugin_dir = std::string(pluginapi::kDevicePluginPath);
    // File name of the plugin's socket inside plugin_dir. Default: the
    // resource name with every character outside [A-Za-z0-9._-] replaced by
    // '_', plus ".sock".
    std::string socket_name;
    // Devices advertised at start.
    std::vector<Device> devices;
    // What the plugin answers. Give either a handler or the functions below
    // (which the server wraps in a handler), not both.
    std::shared_ptr<DevicePluginHandler> handler;
    // Without a handler: required.
    AllocateHandler allocate;
    // Optional: when set, options advertise get_preferred_allocation_available.
    PreferredAllocationHandler get_preferred_allocation;
    // Optional: when set, options advertise pre_start_required.
    PreStartHandler pre_start_container;
    // Optional: called before each Register call with the request the server
    // built (version, endpoint, resource name, the handler's options) and the
    // number of successful registrations so far; it may rewrite the request.
    // Returning false withholds the registration: nothing is sent to this
    // kubelet, and the server registers again only once kubelet.sock is
    // created again or its own socket is served anew. For plugins that break
    // the protocol on purpose (the fake faulty plugins); a real plugin
    // leaves it empty.
    std::function<bool(v1beta1::RegisterRequest& request, int registrations)>
        rewrite_register_request;
    // Refuse a call naming a device id the server does not list (its
    // current devices: `devices`, SetDevices) before the handler or the
    // functions see it: Allocate and PreStartContainer answer NOT_FOUND,
    // GetPreferredAllocation (available and must-include ids)
    // INVALID_ARGUMENT, naming the id
    // (`Allocate: device "x" is not a device of example.com/fpga`). A
    // real plugin leaves it on; only a plugin that breaks the protocol on
    // purpose (the faulty plugin alloc-accept-unknown) or whose handler
    // lists other ids than the server's turns it off.
    bool refuse_unlisted_ids = true;
    // Register with the kubelet after serving (off: serve only, e.g. tests
    // that dial the plugin directly).
    bool register_with_kubelet = true;
    // Deadline of one Register call.
    std::chrono::milliseconds register_timeout{10'000};
    // Back-off between registration attempts: starts at initial, doubles up to max.
    std::chrono::milliseconds register_backoff_initial{100};
    std::chrono::milliseconds register_backoff_max{5'000};
    // How often the socket files are checked for a kubelet restart (a
    // directory event checks them at once).
    std::chrono::milliseconds watch_interval{200};
    // How often a waiting stream (or a call its handler holds) looks whether
    // its client has gone. gRPC's synchronous server has no callback for a
    // cancelled call, so this one check is a bounded poll; everything else a
    // stream waits for (a new snapshot, Stop, a new socket) wakes it at once.
    std::chrono::milliseconds cancel_check_interval{1'000};
    // The supervisor's time: the registration back-off and watch_interval
    // are waits on this clock (each also ends at once on a directory event or
    // Stop), so a FakeClock's Advance() drives them. gRPC deadlines
    // (register_timeout, the shutdown grace) and cancel_check_interval, a
    // liveness poll of gRPC's calls, stay on real time: they bound real I/O.
    // Never null.
    std::shared_ptr<Clock> clock = NewRealClock();
    // Test seam: runs after the socket is bound and before its identity is
    // recorded (a restarting kubelet may delete the socket in that window).
    std::function<void()> after_bind_for_test;
    // The OS seam of the plugin directory's watch (a kubelet restart). Not
    // owned; must outlive the server.
    Env* env = Env::Default();
  };

  // Validates `options` (non-empty resource name, a handler or an allocate
  // function but not both, a socket path that fits a unix socket). Does not
  // touch the filesystem.
  static StatusOr<std::unique_ptr<PluginServer>> Create(Options options);

  virtual ~PluginServer() = default;

  // Serves on the socket and starts registering in the background. Errors:
  // the directory is missing or unwritable, the socket cannot be bound, or
  // Start or Stop was already called.
  virtual Status Start() = 0;

  // Finishes every stream, cancels a Register call in flight, stops serving,
  // removes the socket and joins every thread. Safe to call twice, and
  // without Start.
  virtual void Stop() = 0;

  // Replaces the whole device list and pushes a snapshot to every stream.
  virtual void SetDevices(std::vector<Device> devices) = 0;
  // Sets the health of one device and pushes a snapshot. NOT_FOUND for an
  // unknown id.
  virtual Status SetHealth(const std::string& device_id, bool healthy) = 0;
  virtual std::vector<Device> Devices() const = 0;

  // Absolute path of the plugin's socket.
  virtual std::string SocketPath() const = 0;
  // True once the current serving generation has registered successfully.
  virtual bool Registered() const = 0;
  // Number of successful registrations so far (grows on re-registration).
  virtual int RegistrationCount() const = 0;
  // The last Register failure (OK if none since the last success).
  virtual Status LastRegistrationError() const = 0;
  // Waits until RegistrationCount() >= count or `timeout` passes.
  virtual bool WaitForRegistrationCount(int count, std::chrono::milliseconds timeout) const = 0;
  // Number of ListAndWatch streams open now.
  virtual int OpenStreams() const = 0;
  // How many times the waits of ListAndWatch streams have returned so far
  // (a new snapshot, a deadline, the cancellation check, the end): a test's
  // view that an idle stream does not wake.
  virtual uint64_t StreamWakeupsForTest() const = 0;
};

// Options for the simplest plugin: `devices` of `resource_name` served in
// `plugin_dir`, every container's Allocate answered with an empty
// ContainerAllocateResponse (no environment, mounts or device nodes), e.g. a
// counted resource; the other options keep their defaults.
PluginServer::Options AllocateNothingOptions(std::string resource_name, std::string plugin_dir,
                                             std::vector<Device> devices);

// Socket file name derived from a resource name (see Options::socket_name).
std::string DefaultSocketName(const std::string& resource_name);

}  // namespace kdm::plugin

#endif  // KDM_PLUGINAPI_SDK_PLUGIN_SERVER_H_
