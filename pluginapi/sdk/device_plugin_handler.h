// kdm::plugin::DevicePluginHandler: what a device plugin answers, in kdm
// terms. PluginServer (plugin_server.h) serves one handler: it owns the
// sockets, registration, kubelet restarts and the device set; the handler
// owns the answers of the five RPCs of the v1beta1 DevicePlugin service.
//
//   GetDevicePluginOptions   the options, also sent in RegisterRequest
//   ListAndWatch             given a ListAndWatchStream: the server's device
//                            set, its snapshot versions, and the stream's
//                            Write. The default sends every new snapshot
//                            (StreamSnapshots), coalescing: a slow reader only
//                            ever gets the newest one.
//   Allocate                 one AllocateRequest (every container of it)
//   GetPreferredAllocation   one PreferredAllocationRequest; default
//                            UNIMPLEMENTED
//   PreStartContainer        the device ids of one container; default OK
//
// An error Status reaches the kubelet as the RPC's status (same code and
// message). Each call gets a CallContext: whether the client has gone, and a
// bounded wait that ends when it goes or the server stops, for handlers that
// hold a call on purpose (the fake faulty plugins do).
//
// A handler can wrap another (a decorator): forward what it does not change,
// change the answers it does. A ListAndWatch decorator may hand the inner
// handler a ListAndWatchStream of its own that forwards to the real one
// (ForwardingStream), e.g. to rewrite each message before it is written.
//
// Thread-safety: the server calls a handler from gRPC's threads, several
// calls at once; a handler must be thread-safe. A CallContext or stream is
// used by the thread of its call only, and lives as long as the call.
//
// Example:
//   class FpgaHandler final : public kdm::plugin::DevicePluginHandler {
//    public:
//     kdm::StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
//       return v1beta1::DevicePluginOptions();
//     }
//     kdm::StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& req,
//                                                       kdm::plugin::CallContext&) override {
//       return kdm::plugin::AllocateEachContainer(req, [](const auto& c) { return Answer(c); });
//     }
//   };
//   options.handler = std::make_shared<FpgaHandler>();
#ifndef KDM_PLUGINAPI_SDK_DEVICE_PLUGIN_HANDLER_H_
#define KDM_PLUGINAPI_SDK_DEVICE_PLUGIN_HANDLER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "deviceplugin/v1beta1/api.pb.h"
#include "kdm/base/status.h"

namespace kdm::plugin {

// One device as the plugin advertises it.
struct Device {
  std::string id;
  bool healthy = true;
  // NUMA nodes the device is attached to; empty for no topology.
  std::vector<int64_t> numa_nodes;

  friend bool operator==(const Device&, const Device&) = default;
};

// Builds the wire form of `devices` (one ListAndWatchResponse snapshot).
v1beta1::ListAndWatchResponse ToListAndWatchResponse(const std::vector<Device>& devices);
// The same into `response` (empty), e.g. a message on an arena.
void FillListAndWatchResponse(const std::vector<Device>& devices,
                              v1beta1::ListAndWatchResponse* response);

// Why a wait of a call ended.
enum class WaitResult {
  kChanged,   // the device set has a newer snapshot (streams only)
  kDeadline,  // the caller's deadline passed
  kEnded,     // the client went away, or the server is stopping or serving anew
};

// The call a handler answers.
class CallContext {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  virtual ~CallContext() = default;

  // True once the client cancelled the call (or its deadline passed).
  virtual bool ClientGone() const = 0;
  // True once the call must end: ClientGone(), or the server stops or has
  // bound a new socket (a kubelet restart).
  virtual bool Ended() const = 0;
  // Waits until the call has Ended() (kEnded) or `deadline` (kDeadline).
  // gRPC's synchronous API has no callback for a client that gives up, so
  // ClientGone() is looked at on a bounded interval
  // (PluginServer::Options::cancel_check_interval); Stop and a new serving
  // generation wake the wait at once.
  virtual WaitResult WaitUntilEnded(TimePoint deadline) = 0;
};

// One ListAndWatch stream, handed to DevicePluginHandler::ListAndWatch.
class ListAndWatchStream : public CallContext {
 public:
  // The server's newest device set and its version (versions only grow; a
  // new one for every SetDevices and every SetHealth that changed a device).
  virtual std::shared_ptr<const std::vector<Device>> Devices(uint64_t* version) const = 0;
  // Waits until the version differs from `seen` (kChanged), the stream has
  // Ended() (kEnded) or `deadline` passed (kDeadline; nullopt: no deadline).
  // Nothing else wakes it: no change, no wake-up (but see WaitUntilEnded on
  // how a client that gave up is noticed).
  virtual WaitResult WaitForChange(uint64_t seen, std::optional<TimePoint> deadline) = 0;
  // Writes one message, never under the server's lock. False when the
  // client has gone; the stream should then return.
  virtual bool Write(const v1beta1::ListAndWatchResponse& message) = 0;
};

// A stream that forwards every call to `inner` (which must outlive it): the
// base of a decorator that changes one part, e.g. Write.
class ForwardingStream : public ListAndWatchStream {
 public:
  explicit ForwardingStream(ListAndWatchStream& inner) : inner_(inner) {}

  bool ClientGone() const override { return inner_.ClientGone(); }
  bool Ended() const override { return inner_.Ended(); }
  WaitResult WaitUntilEnded(TimePoint deadline) override { return inner_.WaitUntilEnded(deadline); }
  std::shared_ptr<const std::vector<Device>> Devices(uint64_t* version) const override {
    return inner_.Devices(version);
  }
  WaitResult WaitForChange(uint64_t seen, std::optional<TimePoint> deadline) override {
    return inner_.WaitForChange(seen, deadline);
  }
  bool Write(const v1beta1::ListAndWatchResponse& message) override {
    return inner_.Write(message);
  }

 protected:
  ListAndWatchStream& inner() { return inner_; }

 private:
  ListAndWatchStream& inner_;
};

// The SDK's ListAndWatch: writes the device set at once, then again each
// time its version moves, until the stream ends. Only the newest snapshot is
// written (coalescing): while a Write blocks, later versions simply replace
// what will be written next. Returns OK when the stream ended (the client
// went away or the server stops).
Status StreamSnapshots(ListAndWatchStream& stream);

class DevicePluginHandler {
 public:
  virtual ~DevicePluginHandler() = default;

  // The answer to GetDevicePluginOptions, also sent in every RegisterRequest
  // (an error fails that registration attempt).
  virtual StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() = 0;

  // Serves one ListAndWatch stream until it ends; the Status is the
  // stream's final status. Default: StreamSnapshots(stream).
  virtual Status ListAndWatch(ListAndWatchStream& stream);

  // Answers one Allocate call: one container response per container request.
  virtual StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                                       CallContext& call) = 0;

  // Answers one GetPreferredAllocation call. Default: UNIMPLEMENTED (a plugin
  // that offers it says so in its options).
  virtual StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call);

  // Called with the device ids of a container before it starts. Default: OK.
  virtual Status PreStartContainer(const std::vector<std::string>& device_ids, CallContext& call);
};

// A handler that forwards every RPC to `inner`: the base of a decorator that
// overrides only the RPCs it changes.
class ForwardingHandler : public DevicePluginHandler {
 public:
  explicit ForwardingHandler(std::shared_ptr<DevicePluginHandler> inner)
      : inner_(std::move(inner)) {}

  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    return inner_->GetDevicePluginOptions();
  }
  Status ListAndWatch(ListAndWatchStream& stream) override { return inner_->ListAndWatch(stream); }
  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override {
    return inner_->Allocate(request, call);
  }
  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call) override {
    return inner_->GetPreferredAllocation(request, call);
  }
  Status PreStartContainer(const std::vector<std::string>& device_ids, CallContext& call) override {
    return inner_->PreStartContainer(device_ids, call);
  }

 protected:
  DevicePluginHandler& inner() { return *inner_; }

 private:
  const std::shared_ptr<DevicePluginHandler> inner_;
};

// A handler whose Allocate and GetPreferredAllocation answers are per
// container: a plugin derives from it and writes AllocateContainer and
// PreferContainer, which the two RPCs call for each container request in
// order (AllocateEachContainer, PreferEachContainer; the first error is the
// call's). GetDevicePluginOptions is still the plugin's to write; a plugin
// that does not always offer preferred allocations overrides
// GetPreferredAllocation to refuse first and then calls this one.
class PerContainerHandler : public DevicePluginHandler {
 public:
  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override;
  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call) override;

 protected:
  // One container's Allocate answer.
  virtual StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainer(
      const v1beta1::ContainerAllocateRequest& request) = 0;
  // One container's preferred devices.
  virtual StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferContainer(
      const v1beta1::ContainerPreferredAllocationRequest& request) = 0;
};

// A PerContainerHandler whose per-container answers are `Plugin`'s:
// plugin->Allocate(container request) and plugin->PreferredAllocation(container
// request), both const. `plugin` is not owned and must outlive the handler.
template <typename Plugin>
class PluginPerContainerHandler : public PerContainerHandler {
 public:
  explicit PluginPerContainerHandler(const Plugin* plugin) : plugin_(plugin) {}

 protected:
  const Plugin& plugin() const { return *plugin_; }
  StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainer(
      const v1beta1::ContainerAllocateRequest& request) override {
    return plugin_->Allocate(request);
  }
  StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferContainer(
      const v1beta1::ContainerPreferredAllocationRequest& request) override {
    return plugin_->PreferredAllocation(request);
  }

 private:
  const Plugin* const plugin_;
};

// Answers each container request of `request` with `answer`, in order; the
// first error is the call's.
StatusOr<v1beta1::AllocateResponse> AllocateEachContainer(
    const v1beta1::AllocateRequest& request,
    const std::function<StatusOr<v1beta1::ContainerAllocateResponse>(
        const v1beta1::ContainerAllocateRequest&)>& answer);
StatusOr<v1beta1::PreferredAllocationResponse> PreferEachContainer(
    const v1beta1::PreferredAllocationRequest& request,
    const std::function<StatusOr<v1beta1::ContainerPreferredAllocationResponse>(
        const v1beta1::ContainerPreferredAllocationRequest&)>& answer);

}  // namespace kdm::plugin

#endif  // KDM_PLUGINAPI_SDK_DEVICE_PLUGIN_HANDLER_H_
