// kdm::devicemanager::Endpoint: the device manager's client of one plugin
// socket (one registration of one resource). Private header (not installed).
//
// Connect() reads the plugin's options (GetDevicePluginOptions, ignoring what
// the RegisterRequest claimed), opens the ListAndWatch stream on a reader
// thread owned by the Endpoint, and waits, bounded, for the first device
// list. Every later ListAndWatch message is a full snapshot; the Endpoint
// keeps only the newest one (Latest()) and tells its owner through
// on_update. When the stream ends for any reason the Endpoint is stopped:
// on_stream_end runs once, and every RPC then fails with
// "endpoint <r> has been stopped". Every RPC has a deadline, and
// CancelCalls() ends the ones in flight at once (a shutdown does not wait
// for a hung plugin's deadline).
//
// Thread-safety: every method may be called from any thread. The callbacks
// run on the reader thread, without any Endpoint lock held. Stop() (and the
// destructor) joins the reader thread, so it must not be called while holding
// a lock that a callback takes, nor from inside a callback.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto stub, DialPlugin(path, std::chrono::seconds(10)));
//   KDM_ASSIGN_OR_RETURN(auto ep, Endpoint::Connect("vendor.com/gpu", path, stub,
//                                                   Endpoint::Deadlines{}, callbacks));
//   auto response = ep->Allocate({"gpu0"});
//   ep->Stop();
#ifndef KDM_DEVICEMANAGER_ENDPOINT_H_
#define KDM_DEVICEMANAGER_ENDPOINT_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/status.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::devicemanager {

// The default largest message accepted from a plugin (4 MiB, gRPC's own
// default, made explicit): Manager::Options::max_plugin_message_bytes.
inline constexpr int kDefaultMaxPluginMessageBytes = 4 << 20;

// Opens a channel to the unix socket `socket_path` (a private connection, not
// shared with other channels) that accepts messages of at most
// `max_receive_bytes` (a bigger one fails its RPC or ends its stream with
// RESOURCE_EXHAUSTED), and waits up to `timeout` for it to connect.
// UNAVAILABLE naming the path when it does not.
StatusOr<std::shared_ptr<v1beta1::DevicePlugin::StubInterface>> DialPlugin(
    const std::string& socket_path, std::chrono::milliseconds timeout,
    int max_receive_bytes = kDefaultMaxPluginMessageBytes);

// Bounds on one ListAndWatch snapshot. The kubelet enforces no bound on
// device ids (docs/wire-contract.md#field-rules); kdm takes a
// DNS-subdomain-like 253 bytes, and 100,000 devices per resource.
struct SnapshotLimits {
  std::size_t max_devices = 100'000;

  // Not the API's documented 63 (pluginapi::kMaxDeviceIdLength, which `kdm
  // conform` checks): the kubelet enforces no bound, and a plugin it accepts
  // must work here; this bound only keeps a snapshot's memory in check.
  std::size_t max_id_bytes = 253;
};

// OK when `snapshot` has at most limits.max_devices devices and no id longer
// than limits.max_id_bytes; else INVALID_ARGUMENT naming the resource and
// the count, or the first offending id (truncated to 64 bytes) and its size.
Status ValidateSnapshot(const std::string& resource, const v1beta1::ListAndWatchResponse& snapshot,
                        const SnapshotLimits& limits);

class Endpoint {
 public:
  // Names of the plugin RPCs, as used in counters and logs.
  static constexpr const char* kGetDevicePluginOptions = "GetDevicePluginOptions";
  static constexpr const char* kListAndWatch = "ListAndWatch";
  static constexpr const char* kGetPreferredAllocation = "GetPreferredAllocation";
  static constexpr const char* kAllocate = "Allocate";
  static constexpr const char* kPreStartContainer = "PreStartContainer";

  struct Deadlines {
    std::chrono::milliseconds options{pluginapi::kDialTimeout};
    // How long Connect waits for the first ListAndWatch message.
    std::chrono::milliseconds first_snapshot{pluginapi::kDialTimeout};
    std::chrono::milliseconds rpc{10'000};  // GetPreferredAllocation, Allocate
    std::chrono::milliseconds pre_start{pluginapi::kPreStartContainerTimeout};
  };

  struct Callbacks {
    // A newer snapshot is available through Latest().
    std::function<void(Endpoint*)> on_update;
    // The stream ended by itself (not after Stop()). Runs at most once.
    std::function<void(Endpoint*)> on_stream_end;
    // An RPC failed (method is one of the k… names above).
    std::function<void(const char* method)> on_rpc_error;
    // A ListAndWatch message broke the SnapshotLimits and was dropped (the
    // previous snapshot stays the latest).
    std::function<void(Endpoint*, const Status& why)> on_snapshot_refused;
  };

  // The newest ListAndWatch message and its sequence number (1 for the first).
  // The message is shared, never copied: a 10,000-device copy under the
  // endpoint's lock cost as much as the Ledger's whole update.
  struct Snapshot {
    std::uint64_t seq = 0;
    // Null before the first message (seq 0).
    std::shared_ptr<const v1beta1::ListAndWatchResponse> devices;
  };

  // See the file comment. A ListAndWatch message that breaks `limits` is
  // dropped (logged, on_snapshot_refused). Errors: GetDevicePluginOptions
  // failed or timed out; the stream ended before its first message; the
  // first message broke `limits` (that message's error); no message within
  // deadlines.first_snapshot; CancelCalls() (CANCELLED). On error nothing is
  // left running. `on_created`, when set, is given the Endpoint before its
  // first RPC, so that its owner can CancelCalls() a Connect in flight.
  static StatusOr<std::shared_ptr<Endpoint>> Connect(
      std::string resource, std::string socket_path,
      std::shared_ptr<v1beta1::DevicePlugin::StubInterface> stub, Deadlines deadlines,
      Callbacks callbacks, SnapshotLimits limits = {},
      const std::function<void(const std::shared_ptr<Endpoint>&)>& on_created = nullptr);

  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Cancels the stream and joins the reader thread; RPCs fail from now on.
  // Idempotent. REQUIRES: see the file comment.
  void Stop();

  // Cancels every GetPreferredAllocation, Allocate and PreStartContainer in
  // flight, and Connect's GetDevicePluginOptions
  // (grpc::ClientContext::TryCancel; each fails with CANCELLED), ends
  // Connect's wait for the first device list, and fails every later call at
  // once with CANCELLED. The stream is left alone (Stop() ends it). Returns
  // how many calls were in flight. Idempotent.
  int CancelCalls() ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& resource() const { return resource_; }
  const std::string& socket_path() const { return socket_path_; }
  const v1beta1::DevicePluginOptions& options() const { return options_; }

  Snapshot Latest() const ABSL_LOCKS_EXCLUDED(mu_);
  // True once the stream has ended or Stop() was called.
  bool stopped() const ABSL_LOCKS_EXCLUDED(mu_);

  // The device ids the plugin prefers (container_responses[0]), unvalidated.
  StatusOr<std::vector<std::string>> GetPreferredAllocation(
      const std::vector<std::string>& available, const std::vector<std::string>& must_include,
      int size) ABSL_LOCKS_EXCLUDED(mu_);
  // container_responses[0] of an Allocate with one container request.
  StatusOr<v1beta1::ContainerAllocateResponse> Allocate(const std::vector<std::string>& ids)
      ABSL_LOCKS_EXCLUDED(mu_);
  Status PreStartContainer(const std::vector<std::string>& ids) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  Endpoint(std::string resource, std::string socket_path,
           std::shared_ptr<v1beta1::DevicePlugin::StubInterface> stub, Deadlines deadlines,
           Callbacks callbacks, SnapshotLimits limits);

  // Registers a unary call's context for CancelCalls() while it lives.
  class InFlightCall {
   public:
    InFlightCall(Endpoint* ep, grpc::ClientContext* ctx);
    ~InFlightCall();
    InFlightCall(const InFlightCall&) = delete;
    InFlightCall& operator=(const InFlightCall&) = delete;
    // False when CancelCalls() came first: the call must not be made.
    bool admitted() const { return admitted_; }

   private:
    Endpoint* const ep_;
    grpc::ClientContext* const ctx_;
    bool admitted_ = false;
  };
  // CANCELLED "<method> of <resource> cancelled: shutting down".
  Status CancelledCallError(const char* method) const;

  void ReadLoop();
  // Waits (deadlines_.first_snapshot) for the first ListAndWatch message.
  Status WaitForFirstSnapshot() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasFirstSnapshotOrEnded() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Status StoppedError() const;
  void CountError(const char* method) const;

  const std::string resource_;
  const std::string socket_path_;
  const std::shared_ptr<v1beta1::DevicePlugin::StubInterface> stub_;
  const Deadlines deadlines_;
  const Callbacks callbacks_;
  const SnapshotLimits limits_;
  v1beta1::DevicePluginOptions options_;  // set once by Connect

  mutable kdm::Mutex mu_;
  Snapshot latest_ ABSL_GUARDED_BY(mu_);
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status stream_status_ ABSL_GUARDED_BY(mu_);
  // Contexts of the unary calls in flight, and whether CancelCalls() ran.
  std::set<grpc::ClientContext*> calls_ ABSL_GUARDED_BY(mu_);
  bool calls_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Why the first message was refused (Connect fails with it).
  Status first_refusal_ ABSL_GUARDED_BY(mu_);

  // The stream's context: cancelled by Stop(), read by the reader thread.
  grpc::ClientContext stream_context_;
  // Owned by the Endpoint and joined by Stop(); only Stop() touches it.
  std::thread reader_;
  // Serialises Stop() callers (held while joining; taken before mu_).
  kdm::Mutex stop_mu_;
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_ENDPOINT_H_
