#include "kdm/devicemanager/endpoint.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/resource_quota.h>

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "google/protobuf/arena.h"
#include "kdm/base/log_value.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"
#include "spdlog/spdlog.h"

namespace kdm::devicemanager {

namespace {

std::chrono::system_clock::time_point DeadlineIn(std::chrono::milliseconds d) {
  return std::chrono::system_clock::now() + d;
}

}  // namespace

StatusOr<std::shared_ptr<v1beta1::DevicePlugin::StubInterface>> DialPlugin(
    const std::string& socket_path, std::chrono::milliseconds timeout, int max_receive_bytes) {
  grpc::ChannelArguments args;
  // A private connection per endpoint: closing the endpoint closes it.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Explicit, so that a plugin cannot make the Manager buffer a huge message.
  args.SetMaxReceiveMessageSize(max_receive_bytes);
  // gRPC 1.51 checks that size only once a whole message has arrived; a
  // memory quota per channel bounds what a plugin can make it buffer first.
  grpc::ResourceQuota quota("kdm-plugin-" + socket_path);
  quota.Resize(static_cast<size_t>(max_receive_bytes) * 2 + (1 << 20));
  args.SetResourceQuota(quota);
  StatusOr<std::string> target = pluginapi::UnixSocketTarget(socket_path);
  if (!target.ok()) return target.status().WithPrefix("cannot dial plugin socket");
  auto channel = grpc::CreateCustomChannel(*target, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(DeadlineIn(timeout))) {
    return UnavailableError("cannot dial plugin socket " + socket_path + " within " +
                            std::to_string(timeout.count()) + " ms");
  }
  return std::shared_ptr<v1beta1::DevicePlugin::StubInterface>(
      v1beta1::DevicePlugin::NewStub(channel));
}

Status ValidateSnapshot(const std::string& resource, const v1beta1::ListAndWatchResponse& snapshot,
                        const SnapshotLimits& limits) {
  const std::size_t count = static_cast<std::size_t>(snapshot.devices_size());
  if (count > limits.max_devices) {
    return InvalidArgumentError("ListAndWatch of " + resource + " sent " + std::to_string(count) +
                                " devices, more than the limit of " +
                                std::to_string(limits.max_devices));
  }
  for (const auto& d : snapshot.devices()) {
    if (d.id().size() <= limits.max_id_bytes) continue;
    std::string shown = d.id().substr(0, 64);
    for (char& c : shown) {
      if (static_cast<unsigned char>(c) < 0x20 || c == '"' || c == '\\') c = '?';
    }
    return InvalidArgumentError("ListAndWatch of " + resource + " sent device id \"" + shown +
                                "...\" of " + std::to_string(d.id().size()) +
                                " bytes, longer than the limit of " +
                                std::to_string(limits.max_id_bytes));
  }
  return OkStatus();
}

Endpoint::Endpoint(std::string resource, std::string socket_path,
                   std::shared_ptr<v1beta1::DevicePlugin::StubInterface> stub, Deadlines deadlines,
                   Callbacks callbacks, SnapshotLimits limits)
    : resource_(std::move(resource)),
      socket_path_(std::move(socket_path)),
      stub_(std::move(stub)),
      deadlines_(deadlines),
      callbacks_(std::move(callbacks)),
      limits_(limits) {}

Endpoint::~Endpoint() { Stop(); }

StatusOr<std::shared_ptr<Endpoint>> Endpoint::Connect(
    std::string resource, std::string socket_path,
    std::shared_ptr<v1beta1::DevicePlugin::StubInterface> stub, Deadlines deadlines,
    Callbacks callbacks, SnapshotLimits limits,
    const std::function<void(const std::shared_ptr<Endpoint>&)>& on_created) {
  std::shared_ptr<Endpoint> ep(new Endpoint(std::move(resource), std::move(socket_path),
                                            std::move(stub), deadlines, std::move(callbacks),
                                            limits));
  if (on_created) on_created(ep);
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(deadlines.options));
    InFlightCall call(ep.get(), &ctx);
    if (!call.admitted()) return ep->CancelledCallError(kGetDevicePluginOptions);
    v1beta1::Empty empty;
    grpc::Status s = ep->stub_->GetDevicePluginOptions(&ctx, empty, &ep->options_);
    if (!s.ok()) {
      ep->CountError(kGetDevicePluginOptions);
      return pluginapi::FromGrpcStatus(
          s, "GetDevicePluginOptions of " + ep->resource_ + " at " + ep->socket_path_);
    }
  }
  ep->reader_ = std::thread([raw = ep.get()] { raw->ReadLoop(); });
  if (Status s = ep->WaitForFirstSnapshot(); !s.ok()) {
    ep->Stop();
    return s;
  }
  return ep;
}

bool Endpoint::HasFirstSnapshotOrEnded() const {
  return latest_.seq > 0 || stream_ended_ || !first_refusal_.ok() || calls_cancelled_;
}

Status Endpoint::WaitForFirstSnapshot() {
  kdm::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(kdm::Condition(this, &Endpoint::HasFirstSnapshotOrEnded),
                       absl::FromChrono(deadlines_.first_snapshot));
  if (latest_.seq > 0) return OkStatus();
  if (!first_refusal_.ok()) return first_refusal_;
  if (calls_cancelled_) return CancelledCallError(kListAndWatch);
  if (stream_ended_) {
    grpc::Status why = stream_status_.ok()
                           ? grpc::Status(grpc::StatusCode::UNAVAILABLE, "stream closed")
                           : stream_status_;
    return UnavailableError(
        pluginapi::FromGrpcStatus(
            why, "ListAndWatch of " + resource_ + " ended before its first device list")
            .message());
  }
  CountError(kListAndWatch);
  return DeadlineExceededError("ListAndWatch of " + resource_ + " at " + socket_path_ +
                               " sent no device list within " +
                               std::to_string(deadlines_.first_snapshot.count()) + " ms");
}

void Endpoint::ReadLoop() {
  v1beta1::Empty empty;
  std::unique_ptr<grpc::ClientReaderInterface<v1beta1::ListAndWatchResponse>> reader =
      stub_->ListAndWatch(&stream_context_, empty);
  // Each message is parsed onto an arena of its own, which the shared
  // snapshot keeps alive: a 10,000-device list is 10,000 small messages, and
  // freeing them one by one cost as much as parsing them.
  struct ArenaHolder {
    google::protobuf::Arena arena;
  };
  auto holder = std::make_shared<ArenaHolder>();
  auto* response =
      google::protobuf::Arena::CreateMessage<v1beta1::ListAndWatchResponse>(&holder->arena);
  auto next_message = [&] {
    holder = std::make_shared<ArenaHolder>();
    response =
        google::protobuf::Arena::CreateMessage<v1beta1::ListAndWatchResponse>(&holder->arena);
  };
  while (reader->Read(response)) {
    if (Status valid = ValidateSnapshot(resource_, *response, limits_); !valid.ok()) {
      // Dropped: the previous snapshot (if any) stays the latest.
      spdlog::error("event=snapshot_refused resource={} socket={} error={}",
                    QuoteLogValue(resource_, kMaxLogValueBytes),
                    QuoteLogValue(socket_path_, kMaxLogValueBytes),
                    QuoteLogValue(valid.message(), kMaxLogValueBytes));
      {
        kdm::MutexLock lock(&mu_);
        if (latest_.seq == 0 && first_refusal_.ok()) first_refusal_ = valid;
      }
      next_message();
      if (callbacks_.on_snapshot_refused) callbacks_.on_snapshot_refused(this, valid);
      continue;
    }
    std::shared_ptr<const v1beta1::ListAndWatchResponse> previous;
    {
      kdm::MutexLock lock(&mu_);
      latest_.seq++;
      previous = std::move(latest_.devices);
      // Aliasing: the snapshot points at the message and owns its arena.
      latest_.devices = std::shared_ptr<const v1beta1::ListAndWatchResponse>(holder, response);
    }
    previous.reset();  // freed outside the lock
    next_message();
    if (callbacks_.on_update) callbacks_.on_update(this);
  }
  grpc::Status status = reader->Finish();
  bool notify;
  {
    kdm::MutexLock lock(&mu_);
    stream_ended_ = true;
    stream_status_ = status;
    notify = !stop_requested_;
  }
  if (notify) {
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      // A message bigger than the channel's max receive size: gRPC refuses
      // it and ends the stream; the plugin counts as disconnected.
      spdlog::error("event=listandwatch_message_too_large resource={} socket={} error={}",
                    QuoteLogValue(resource_, kMaxLogValueBytes),
                    QuoteLogValue(socket_path_, kMaxLogValueBytes),
                    QuoteLogValue(status.error_message(), kMaxLogValueBytes));
    }
    spdlog::info("event=listandwatch_ended resource={} socket={} code={} message={}",
                 QuoteLogValue(resource_, kMaxLogValueBytes),
                 QuoteLogValue(socket_path_, kMaxLogValueBytes),
                 static_cast<int>(status.error_code()),
                 QuoteLogValue(status.error_message(), kMaxLogValueBytes));
    if (!status.ok()) CountError(kListAndWatch);
    if (callbacks_.on_stream_end) callbacks_.on_stream_end(this);
  }
}

void Endpoint::Stop() {
  kdm::MutexLock stop_lock(&stop_mu_);
  {
    kdm::MutexLock lock(&mu_);
    stop_requested_ = true;
  }
  stream_context_.TryCancel();
  if (reader_.joinable()) {
    if (reader_.get_id() == std::this_thread::get_id()) {
      // Only reachable if the last owner is dropped inside a callback; the
      // thread is about to return, so it is left to finish by itself.
      reader_.detach();
    } else {
      reader_.join();
    }
  }
}

Endpoint::InFlightCall::InFlightCall(Endpoint* ep, grpc::ClientContext* ctx) : ep_(ep), ctx_(ctx) {
  kdm::MutexLock lock(&ep_->mu_);
  if (ep_->calls_cancelled_) return;
  ep_->calls_.insert(ctx_);
  admitted_ = true;
}

Endpoint::InFlightCall::~InFlightCall() {
  if (!admitted_) return;
  kdm::MutexLock lock(&ep_->mu_);
  ep_->calls_.erase(ctx_);
}

int Endpoint::CancelCalls() {
  kdm::MutexLock lock(&mu_);
  calls_cancelled_ = true;
  // TryCancel neither blocks nor calls back into the Endpoint: safe under mu_,
  // which keeps each context alive until its call has unregistered it.
  for (grpc::ClientContext* ctx : calls_) ctx->TryCancel();
  return static_cast<int>(calls_.size());
}

Status Endpoint::CancelledCallError(const char* method) const {
  return CancelledError(std::string(method) + " of " + resource_ + " cancelled: shutting down");
}

Endpoint::Snapshot Endpoint::Latest() const {
  kdm::MutexLock lock(&mu_);
  return latest_;
}

bool Endpoint::stopped() const {
  kdm::MutexLock lock(&mu_);
  return stream_ended_ || stop_requested_;
}

Status Endpoint::StoppedError() const {
  return UnavailableError("endpoint " + resource_ + " has been stopped");
}

void Endpoint::CountError(const char* method) const {
  if (callbacks_.on_rpc_error) callbacks_.on_rpc_error(method);
}

StatusOr<std::vector<std::string>> Endpoint::GetPreferredAllocation(
    const std::vector<std::string>& available, const std::vector<std::string>& must_include,
    int size) {
  if (stopped()) return StoppedError();
  v1beta1::PreferredAllocationRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : available) c->add_available_deviceids(id);
  for (const auto& id : must_include) c->add_must_include_deviceids(id);
  c->set_allocation_size(size);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(deadlines_.rpc));
  InFlightCall call(this, &ctx);
  if (!call.admitted()) return CancelledCallError(kGetPreferredAllocation);
  v1beta1::PreferredAllocationResponse response;
  grpc::Status s = stub_->GetPreferredAllocation(&ctx, request, &response);
  if (!s.ok()) {
    CountError(kGetPreferredAllocation);
    return pluginapi::FromGrpcStatus(s, "GetPreferredAllocation of " + resource_);
  }
  if (response.container_responses_size() == 0) {
    return InvalidArgumentError("GetPreferredAllocation of " + resource_ +
                                " returned no container response");
  }
  const auto& ids = response.container_responses(0).deviceids();
  return std::vector<std::string>(ids.begin(), ids.end());
}

StatusOr<v1beta1::ContainerAllocateResponse> Endpoint::Allocate(
    const std::vector<std::string>& ids) {
  if (stopped()) return StoppedError();
  v1beta1::AllocateRequest request;
  auto* c = request.add_container_requests();
  for (const auto& id : ids) c->add_devices_ids(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(deadlines_.rpc));
  InFlightCall call(this, &ctx);
  if (!call.admitted()) return CancelledCallError(kAllocate);
  v1beta1::AllocateResponse response;
  grpc::Status s = stub_->Allocate(&ctx, request, &response);
  if (!s.ok()) {
    CountError(kAllocate);
    return pluginapi::FromGrpcStatus(s, "Allocate of " + resource_);
  }
  if (response.container_responses_size() == 0) {
    CountError(kAllocate);
    return Status(StatusCode::kUnknown,
                  "Allocate of " + resource_ + " returned no container response");
  }
  return response.container_responses(0);
}

Status Endpoint::PreStartContainer(const std::vector<std::string>& ids) {
  if (stopped()) return StoppedError();
  v1beta1::PreStartContainerRequest request;
  for (const auto& id : ids) request.add_devices_ids(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(deadlines_.pre_start));
  InFlightCall call(this, &ctx);
  if (!call.admitted()) return CancelledCallError(kPreStartContainer);
  v1beta1::PreStartContainerResponse response;
  grpc::Status s = stub_->PreStartContainer(&ctx, request, &response);
  if (!s.ok()) {
    CountError(kPreStartContainer);
    return pluginapi::FromGrpcStatus(s, "PreStartContainer of " + resource_);
  }
  return OkStatus();
}

}  // namespace kdm::devicemanager
