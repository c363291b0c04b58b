#include "kdm/pluginapi/sdk/plugin_server.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/env.h"
#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::plugin {

std::string DefaultSocketName(const std::string& resource_name) {
  std::string name = resource_name;
  for (char& c : name) {
    bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '.' || c == '-' || c == '_';
    if (!keep) c = '_';
  }
  return name + ".sock";
}

PluginServer::Options AllocateNothingOptions(std::string resource_name, std::string plugin_dir,
                                             std::vector<Device> devices) {
  PluginServer::Options o;
  o.resource_name = std::move(resource_name);
  o.plugin_dir = std::move(plugin_dir);
  o.devices = std::move(devices);
  o.allocate = [](const v1beta1::ContainerAllocateRequest&) {
    return StatusOr<v1beta1::ContainerAllocateResponse>(v1beta1::ContainerAllocateResponse());
  };
  return o;
}

namespace {

namespace fs = std::filesystem;
// gRPC deadlines take system_clock time points only; they bound real I/O, so
// they stay on real time whatever Options::clock is.
using GrpcClock = std::chrono::system_clock;

// Identity of a file, to notice that it was removed and created again.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  friend bool operator==(const FileId&, const FileId&) = default;
};

std::optional<FileId> StatFile(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino};
}

// The ids a server lists, for the unlisted-id check of its calls; immutable,
// replaced whole by SetDevices.
using ListedIds = std::unordered_set<std::string>;

std::shared_ptr<const ListedIds> IdsOf(const std::vector<Device>& devices) {
  auto ids = std::make_shared<ListedIds>();
  ids->reserve(devices.size());
  for (const Device& d : devices) ids->insert(d.id);
  return ids;
}

// `code` naming the first id of `ids` that `listed` lacks (quoted and
// capped: the id comes from the caller), for the RPC `rpc` of `resource`.
template <typename Ids>
Status RefuseUnlisted(StatusCode code, const ListedIds& listed, const Ids& ids,
                      std::string_view rpc, const std::string& resource) {
  for (const std::string& id : ids) {
    if (listed.count(id) == 0) {
      return Status(code, std::string(rpc) + ": device " + QuoteLogValue(id, kMaxLogValueBytes) +
                              " is not a device of " + resource);
    }
  }
  return OkStatus();
}

// The handler the server builds from Options' functions (allocate,
// get_preferred_allocation, pre_start_container): the options advertise
// exactly the functions that are set.
class FunctionHandler final : public PerContainerHandler {
 public:
  FunctionHandler(std::string resource_name, PluginServer::AllocateHandler allocate,
                  PluginServer::PreferredAllocationHandler preferred,
                  PluginServer::PreStartHandler pre_start)
      : resource_name_(std::move(resource_name)),
        allocate_(std::move(allocate)),
        preferred_(std::move(preferred)),
        pre_start_(std::move(pre_start)) {}

  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    v1beta1::DevicePluginOptions o;
    o.set_pre_start_required(static_cast<bool>(pre_start_));
    o.set_get_preferred_allocation_available(static_cast<bool>(preferred_));
    return o;
  }

  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call) override {
    if (!preferred_) {
      return UnimplementedError("GetPreferredAllocation is not offered by " + resource_name_);
    }
    return PerContainerHandler::GetPreferredAllocation(request, call);
  }

  Status PreStartContainer(const std::vector<std::string>& device_ids, CallContext&) override {
    return pre_start_ ? pre_start_(device_ids) : OkStatus();
  }

 protected:
  StatusOr<v1beta1::ContainerAllocateResponse> AllocateContainer(
      const v1beta1::ContainerAllocateRequest& request) override {
    return allocate_(request);
  }
  StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferContainer(
      const v1beta1::ContainerPreferredAllocationRequest& request) override {
    return preferred_(request);
  }

 private:
  const std::string resource_name_;
  const PluginServer::AllocateHandler allocate_;
  const PluginServer::PreferredAllocationHandler preferred_;
  const PluginServer::PreStartHandler pre_start_;
};

class PluginServerImpl;

// The gRPC service of one serving generation. It forwards to the server,
// which owns the state; a new generation gets a new service object because a
// grpc::Service can only ever be registered with one server.
class DevicePluginService final : public v1beta1::DevicePlugin::Service {
 public:
  DevicePluginService(PluginServerImpl* owner, uint64_t generation)
      : owner_(owner), generation_(generation) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* response) override;
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override;
  grpc::Status GetPreferredAllocation(grpc::ServerContext* context,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override;
  grpc::Status Allocate(grpc::ServerContext* context, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override;
  grpc::Status PreStartContainer(grpc::ServerContext* context,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse*) override;

 private:
  PluginServerImpl* owner_;
  uint64_t generation_;
};

class PluginServerImpl final : public PluginServer {
 public:
  PluginServerImpl(Options options, std::string socket_path,
                   std::shared_ptr<DevicePluginHandler> handler)
      : options_(std::move(options)),
        socket_path_(std::move(socket_path)),
        kubelet_socket_path_(
            (fs::path(socket_path_).parent_path() / std::string(pluginapi::kKubeletSocketName))
                .string()),
        handler_(std::move(handler)),
        devices_(std::make_shared<const std::vector<Device>>(options_.devices)),
        listed_ids_(IdsOf(options_.devices)) {}

  ~PluginServerImpl() override { Stop(); }

  Status Start() override {
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return FailedPreconditionError("plugin server already stopped");
      if (started_) return FailedPreconditionError("plugin server already started");
      started_ = true;
    }
    KDM_RETURN_IF_ERROR(Serve());
    // The supervisor also watches our own socket, so it runs even when
    // registration is off.
    OpenWatch();
    supervisor_ = std::thread([this] { Supervise(); });
    return OkStatus();
  }

  void Stop() override {
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;  // wakes every stream and held call: their conditions hold
      // A Register call in flight would otherwise hold Stop for its deadline.
      if (register_context_ != nullptr) register_context_->TryCancel();
    }
    if (watcher_) watcher_->Wake();
    if (supervisor_.joinable()) supervisor_.join();
    watcher_.reset();
    ShutdownServer();
    // Only remove the socket if it is still ours (a new plugin instance may
    // have bound the same path since).
    kdm::MutexLock lock(&mu_);
    if (socket_id_ && StatFile(socket_path_) == socket_id_) ::unlink(socket_path_.c_str());
  }

  void SetDevices(std::vector<Device> devices) override {
    std::shared_ptr<const ListedIds> ids = IdsOf(devices);
    auto snapshot = std::make_shared<const std::vector<Device>>(std::move(devices));
    kdm::MutexLock lock(&mu_);
    devices_ = std::move(snapshot);
    listed_ids_ = std::move(ids);
    ++version_;
  }

  Status SetHealth(const std::string& device_id, bool healthy) override {
    kdm::MutexLock lock(&mu_);
    auto it = std::find_if(devices_->begin(), devices_->end(),
                           [&](const Device& d) { return d.id == device_id; });
    if (it == devices_->end()) {
      return NotFoundError("unknown device \"" + device_id + "\" for resource " +
                           options_.resource_name);
    }
    if (it->healthy == healthy) return OkStatus();
    // Snapshots are immutable (a stream may be writing the current one):
    // a change is a new one.
    auto changed = std::make_shared<std::vector<Device>>(*devices_);
    (*changed)[it - devices_->begin()].healthy = healthy;
    devices_ = std::move(changed);
    ++version_;
    return OkStatus();
  }

  std::vector<Device> Devices() const override {
    kdm::MutexLock lock(&mu_);
    return *devices_;
  }

  std::string SocketPath() const override { return socket_path_; }

  bool Registered() const override {
    kdm::MutexLock lock(&mu_);
    return registered_;
  }

  int RegistrationCount() const override {
    kdm::MutexLock lock(&mu_);
    return registration_count_;
  }

  Status LastRegistrationError() const override {
    kdm::MutexLock lock(&mu_);
    return last_registration_error_;
  }

  bool WaitForRegistrationCount(int count, std::chrono::milliseconds timeout) const override {
    kdm::MutexLock lock(&mu_);
    auto reached = [this, count]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registration_count_ >= count; };
    return mu_.AwaitWithTimeout(kdm::Condition(&reached), absl::FromChrono(timeout));
  }

  int OpenStreams() const override {
    kdm::MutexLock lock(&mu_);
    return open_streams_;
  }

  uint64_t StreamWakeupsForTest() const override {
    kdm::MutexLock lock(&mu_);
    return stream_wakeups_;
  }

  // --- called by DevicePluginService ---------------------------------------

  DevicePluginHandler& handler() { return *handler_; }

  // OK when the check is off or every id the call names is one the server
  // lists now; else NOT_FOUND (Allocate, PreStartContainer) or
  // INVALID_ARGUMENT (GetPreferredAllocation: its available ids must be
  // devices, as kdm's allocator says) naming the first other id. Ids reach
  // the handler only past this check (Options::refuse_unlisted_ids).
  Status CheckAllocateIds(const v1beta1::AllocateRequest& request) const {
    if (!options_.refuse_unlisted_ids) return OkStatus();
    std::shared_ptr<const ListedIds> listed = ListedIdsNow();
    for (const auto& container : request.container_requests()) {
      KDM_RETURN_IF_ERROR(RefuseUnlisted(StatusCode::kNotFound, *listed, container.devices_ids(),
                                         "Allocate", options_.resource_name));
    }
    return OkStatus();
  }
  Status CheckPreferredIds(const v1beta1::PreferredAllocationRequest& request) const {
    if (!options_.refuse_unlisted_ids) return OkStatus();
    std::shared_ptr<const ListedIds> listed = ListedIdsNow();
    for (const auto& container : request.container_requests()) {
      KDM_RETURN_IF_ERROR(RefuseUnlisted(StatusCode::kInvalidArgument, *listed,
                                         container.available_deviceids(), "GetPreferredAllocation",
                                         options_.resource_name));
      KDM_RETURN_IF_ERROR(RefuseUnlisted(StatusCode::kInvalidArgument, *listed,
                                         container.must_include_deviceids(),
                                         "GetPreferredAllocation", options_.resource_name));
    }
    return OkStatus();
  }
  Status CheckPreStartIds(const v1beta1::PreStartContainerRequest& request) const {
    if (!options_.refuse_unlisted_ids) return OkStatus();
    return RefuseUnlisted(StatusCode::kNotFound, *ListedIdsNow(), request.devices_ids(),
                          "PreStartContainer", options_.resource_name);
  }

  // One call: the server's side of CallContext. Its waits end on Stop or a
  // new serving generation at once (both are conditions on mu_), and on a
  // client that gave up within cancel_check_interval.
  class Call : public ListAndWatchStream {
   public:
    Call(PluginServerImpl* server, uint64_t generation, grpc::ServerContext* context,
         grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer = nullptr)
        : server_(server), generation_(generation), context_(context), writer_(writer) {}

    bool ClientGone() const override { return context_->IsCancelled(); }

    bool Ended() const override {
      {
        kdm::MutexLock lock(&server_->mu_);
        if (server_->EndedLocked(generation_)) return true;
      }
      return ClientGone();
    }

    WaitResult WaitUntilEnded(TimePoint deadline) override { return Wait(std::nullopt, deadline); }

    std::shared_ptr<const std::vector<Device>> Devices(uint64_t* version) const override {
      kdm::MutexLock lock(&server_->mu_);
      *version = server_->version_;
      return server_->devices_;
    }

    WaitResult WaitForChange(uint64_t seen, std::optional<TimePoint> deadline) override {
      return Wait(seen, deadline);
    }

    bool Write(const v1beta1::ListAndWatchResponse& message) override {
      return writer_ != nullptr && writer_->Write(message);
    }

   private:
    // Waits for the end of the call, a version other than `seen` (when
    // given) or `deadline` (when given).
    WaitResult Wait(std::optional<uint64_t> seen, std::optional<TimePoint> deadline) {
      PluginServerImpl* s = server_;
      auto woken = [s, this, seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu_) {
        return s->EndedLocked(generation_) || (seen && s->version_ != *seen);
      };
      while (true) {
        // The one bounded part: gRPC's sync API cannot tell us when the
        // client cancels, so look at it every cancel_check_interval. This
        // and the caller's deadline stay on real time, not Options::clock:
        // they are a liveness poll of a real gRPC call, and the deadline a
        // handler's bound on holding one.
        TimePoint until = std::chrono::steady_clock::now() + s->options_.cancel_check_interval;
        if (deadline) until = std::min(until, *deadline);
        {
          kdm::MutexLock lock(&s->mu_);
          s->mu_.AwaitWithTimeout(kdm::Condition(&woken),
                                  absl::FromChrono(until - std::chrono::steady_clock::now()));
          ++s->stream_wakeups_;
          if (s->EndedLocked(generation_)) return WaitResult::kEnded;
          if (seen && s->version_ != *seen) return WaitResult::kChanged;
        }
        if (ClientGone()) return WaitResult::kEnded;
        if (deadline && std::chrono::steady_clock::now() >= *deadline) {
          return WaitResult::kDeadline;
        }
      }
    }

    PluginServerImpl* const server_;
    const uint64_t generation_;
    grpc::ServerContext* const context_;
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* const writer_;
  };

  // A stream: counted in OpenStreams while the handler serves it.
  grpc::Status StreamDevices(uint64_t generation, grpc::ServerContext* context,
                             grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
    {
      kdm::MutexLock lock(&mu_);
      ++open_streams_;
    }
    Call stream(this, generation, context, writer);
    Status s = handler_->ListAndWatch(stream);
    {
      kdm::MutexLock lock(&mu_);
      --open_streams_;
    }
    return pluginapi::ToGrpcStatus(s);
  }

 private:
  // True when the calls of serving generation `generation` must end.
  bool EndedLocked(uint64_t generation) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || generation != generation_;
  }

  std::shared_ptr<const ListedIds> ListedIdsNow() const {
    kdm::MutexLock lock(&mu_);
    return listed_ids_;
  }

  // Binds the socket and starts a new serving generation.
  Status Serve() {
    fs::path dir = fs::path(socket_path_).parent_path();
    struct stat st;
    if (::stat(dir.c_str(), &st) != 0) {
      if (errno == EACCES) {
        return PermissionDeniedError("plugin directory " + dir.string() + " is not accessible");
      }
      return FailedPreconditionError("plugin directory " + dir.string() + " does not exist");
    }
    if (!S_ISDIR(st.st_mode)) {
      return FailedPreconditionError("plugin directory " + dir.string() + " is not a directory");
    }
    if (::access(dir.c_str(), W_OK | X_OK) != 0) {
      return PermissionDeniedError("plugin directory " + dir.string() + " is not writable");
    }
    // A stale socket (from a previous run, or a kubelet that removed and we
    // re-create) would make bind fail.
    if (::unlink(socket_path_.c_str()) != 0 && errno != ENOENT) {
      return ErrnoToStatus(errno, "cannot remove stale socket " + socket_path_);
    }
    uint64_t generation;
    {
      kdm::MutexLock lock(&mu_);
      generation = ++generation_;
      registered_ = false;
      withheld_ = false;
    }
    auto service = std::make_unique<DevicePluginService>(this, generation);
    grpc::ServerBuilder builder;
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(socket_path_);
    if (!target.ok()) return target.status();
    builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
    builder.RegisterService(service.get());
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (!server) {
      return UnavailableError("cannot serve on unix socket " + socket_path_);
    }
    ::chmod(socket_path_.c_str(), 0600);
    if (options_.after_bind_for_test) options_.after_bind_for_test();
    kdm::MutexLock lock(&server_mu_);
    server_ = std::move(server);
    service_ = std::move(service);
    {
      kdm::MutexLock state_lock(&mu_);
      socket_id_ = StatFile(socket_path_);
    }
    return OkStatus();
  }

  void ShutdownServer() {
    std::unique_ptr<grpc::Server> server;
    std::unique_ptr<DevicePluginService> service;
    {
      kdm::MutexLock lock(&server_mu_);
      server = std::move(server_);
      service = std::move(service_);
    }
    if (!server) return;
    {
      kdm::MutexLock lock(&mu_);
      ++generation_;  // ends every stream of the old generation
    }
    // The generation bump woke every stream and held call; the deadline
    // cancels anything still in flight (e.g. a hung handler).
    server->Shutdown(GrpcClock::now() + std::chrono::seconds(2));
    server->Wait();
  }

  // Watches the plugin directory (Env's directory watcher: inotify) so that a
  // kubelet restart (kubelet.sock created again, our socket deleted) is seen
  // at once, even when the new kubelet.sock reuses the old inode number.
  // Without a watch (e.g. no inotify watches left) the supervisor falls back
  // to polling with stat.
  void OpenWatch() {
    std::string dir = fs::path(socket_path_).parent_path().string();
    StatusOr<std::unique_ptr<DirectoryWatcher>> watcher = options_.env->WatchDirectory(dir);
    if (watcher.ok()) watcher_ = std::move(*watcher);
  }

  // Waits until options_.clock has moved on by `d`, a directory event or
  // Stop(), whichever comes first. Returns false when stopping.
  //
  // The clock's deadline is a timer that ends the wait (waking the watcher),
  // so a FakeClock's Advance() ends it at once. Each real wait below is also
  // bounded by `d` in real time, after which the loop looks at the clock
  // again: with the real clock the deadline has passed by then, with a fake
  // one nothing has changed and it waits again. A stale Wake() (the timer
  // firing just as an event ended the wait) only makes a later round return
  // early, and the loop waits again.
  bool SleepFor(std::chrono::milliseconds d) {
    const Clock::TimePoint deadline = options_.clock->Now() + d;
    {
      kdm::MutexLock lock(&mu_);
      sleep_due_ = false;
    }
    const Clock::TimerId timer = options_.clock->ScheduleAt(deadline, [this] {
      {
        kdm::MutexLock lock(&mu_);
        sleep_due_ = true;
      }
      if (watcher_) watcher_->Wake();
    });
    auto ended = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || sleep_due_; };
    while (true) {
      {
        kdm::MutexLock lock(&mu_);
        if (ended()) break;
      }
      if (options_.clock->Now() >= deadline) break;
      if (watcher_) {
        std::vector<DirectoryWatcher::Event> events = watcher_->Wait(d);
        if (!events.empty()) {
          NoteDirectoryEvents(events);
          break;
        }
      } else {
        kdm::MutexLock lock(&mu_);
        mu_.AwaitWithTimeout(kdm::Condition(&ended), absl::FromChrono(d));
      }
    }
    // After Cancel the timer's callback is not running and never will.
    options_.clock->Cancel(timer);
    kdm::MutexLock lock(&mu_);
    return !stopping_;
  }

  void DrainDirectoryEvents() {
    if (watcher_) NoteDirectoryEvents(watcher_->ReadEvents());
  }

  void NoteDirectoryEvents(const std::vector<DirectoryWatcher::Event>& events) {
    using Kind = DirectoryWatcher::EventKind;
    for (const DirectoryWatcher::Event& e : events) {
      if (e.name == pluginapi::kKubeletSocketName &&
          (e.kind == Kind::kCreated || e.kind == Kind::kMovedIn)) {
        kubelet_recreated_ = true;
      }
    }
  }

  // Builds the RegisterRequest and sends it, unless the rewrite hook
  // withholds it. Returns whether it was sent (and accepted).
  StatusOr<bool> RegisterOnce() {
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(kubelet_socket_path_);
    if (!target.ok()) return target.status();
    const std::string refused = "registration of " + options_.resource_name + " refused";
    StatusOr<v1beta1::DevicePluginOptions> plugin_options = handler_->GetDevicePluginOptions();
    if (!plugin_options.ok()) {
      return plugin_options.status().WithPrefix("registration of " + options_.resource_name +
                                                ": GetDevicePluginOptions");
    }
    v1beta1::RegisterRequest request;
    request.set_version(std::string(pluginapi::kVersion));
    request.set_endpoint(fs::path(socket_path_).filename().string());
    request.set_resource_name(options_.resource_name);
    *request.mutable_options() = std::move(*plugin_options);
    if (options_.rewrite_register_request &&
        !options_.rewrite_register_request(request, RegistrationCount())) {
      return false;
    }
    auto channel = grpc::CreateChannel(*target, grpc::InsecureChannelCredentials());
    auto stub = v1beta1::Registration::NewStub(channel);
    grpc::ClientContext context;
    context.set_deadline(GrpcClock::now() + options_.register_timeout);
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return CancelledError("plugin server stopping");
      register_context_ = &context;
    }
    v1beta1::Empty empty;
    grpc::Status s = stub->Register(&context, request, &empty);
    {
      kdm::MutexLock lock(&mu_);
      register_context_ = nullptr;
    }
    KDM_RETURN_IF_ERROR(pluginapi::FromGrpcStatus(s, refused));
    return true;
  }

  // The one background thread: registers (with back-off) and watches for a
  // kubelet restart. Owned by the server; joined in Stop().
  void Supervise() {
    std::chrono::milliseconds backoff = options_.register_backoff_initial;
    std::optional<FileId> kubelet_id = StatFile(kubelet_socket_path_);
    while (true) {
      {
        kdm::MutexLock lock(&mu_);
        if (stopping_) return;
      }
      // Our own socket gone: the kubelet restarted and cleaned the directory.
      std::optional<FileId> own = StatFile(socket_path_);
      bool own_lost;
      {
        kdm::MutexLock lock(&mu_);
        // No identity: the socket was deleted between bind and stat (a
        // kubelet cleaning the directory as it starts); serve it again.
        own_lost = !socket_id_ || own != socket_id_;
      }
      if (own_lost) {
        ShutdownServer();
        if (Status s = Serve(); !s.ok()) {
          {
            kdm::MutexLock lock(&mu_);
            last_registration_error_ = s;
          }
          if (!SleepFor(backoff)) return;
          backoff = std::min(backoff * 2, options_.register_backoff_max);
          continue;
        }
      }
      // kubelet.sock created again: a restarted kubelet.
      std::optional<FileId> kid = StatFile(kubelet_socket_path_);
      if (kid != kubelet_id || kubelet_recreated_) {
        kubelet_recreated_ = false;
        kubelet_id = kid;
        kdm::MutexLock lock(&mu_);
        registered_ = false;
        withheld_ = false;
      }
      bool need_register;
      {
        kdm::MutexLock lock(&mu_);
        need_register =
            options_.register_with_kubelet && !registered_ && !withheld_ && kid.has_value();
      }
      if (need_register) {
        // This registration answers every kubelet.sock creation seen so
        // far: consume them, so that one restart causes one registration.
        // A creation after this point is seen on the next round.
        DrainDirectoryEvents();
        kubelet_recreated_ = false;
        kubelet_id = StatFile(kubelet_socket_path_);
        StatusOr<bool> sent = RegisterOnce();
        {
          kdm::MutexLock lock(&mu_);
          if (stopping_) return;
          if (!sent.ok()) {
            last_registration_error_ = sent.status();
          } else if (*sent) {
            registered_ = true;
            ++registration_count_;
            last_registration_error_ = OkStatus();
            backoff = options_.register_backoff_initial;
          } else {
            withheld_ = true;
          }
        }
        if (!sent.ok()) {
          if (!SleepFor(backoff)) return;
          backoff = std::min(backoff * 2, options_.register_backoff_max);
          continue;
        }
      }
      if (!SleepFor(options_.watch_interval)) return;
    }
  }

  const Options options_;
  const std::string socket_path_;
  const std::string kubelet_socket_path_;
  const std::shared_ptr<DevicePluginHandler> handler_;

  // Guards the serving state below; never held across a gRPC call. Waiters
  // use kdm::Condition, so changes need no explicit notification.
  mutable kdm::Mutex mu_;
  // The newest snapshot; immutable, so a stream can write it without the lock.
  std::shared_ptr<const std::vector<Device>> devices_ ABSL_GUARDED_BY(mu_);
  // The ids of devices_ (SetHealth keeps them), for the unlisted-id check.
  std::shared_ptr<const ListedIds> listed_ids_ ABSL_GUARDED_BY(mu_);
  uint64_t version_ ABSL_GUARDED_BY(mu_) = 1;     // bumped on every device change
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped per serving generation
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  // The rewrite hook withheld the registration with the current kubelet.
  bool withheld_ ABSL_GUARDED_BY(mu_) = false;
  int registration_count_ ABSL_GUARDED_BY(mu_) = 0;
  // The supervisor's current SleepFor reached its deadline on the clock.
  bool sleep_due_ ABSL_GUARDED_BY(mu_) = false;
  int open_streams_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t stream_wakeups_ ABSL_GUARDED_BY(mu_) = 0;
  Status last_registration_error_ ABSL_GUARDED_BY(mu_);
  std::optional<FileId> socket_id_ ABSL_GUARDED_BY(mu_);
  // The Register call in flight, so that Stop can cancel it.
  grpc::ClientContext* register_context_ ABSL_GUARDED_BY(mu_) = nullptr;

  // Guards the server objects; held while swapping them, never during Wait.
  // Lock order: server_mu_ before mu_.
  kdm::Mutex server_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<grpc::Server> server_ ABSL_GUARDED_BY(server_mu_);
  std::unique_ptr<DevicePluginService> service_ ABSL_GUARDED_BY(server_mu_);

  // Used by the supervisor thread only (and Start/Stop around it); Stop()
  // calls watcher_->Wake() from its own thread, which the watcher allows.
  std::unique_ptr<DirectoryWatcher> watcher_;  // null: no watch, stat polling only
  bool kubelet_recreated_ = false;

  std::thread supervisor_;
};

grpc::Status DevicePluginService::GetDevicePluginOptions(grpc::ServerContext*,
                                                         const v1beta1::Empty*,
                                                         v1beta1::DevicePluginOptions* response) {
  StatusOr<v1beta1::DevicePluginOptions> o = owner_->handler().GetDevicePluginOptions();
  if (!o.ok()) return pluginapi::ToGrpcStatus(o.status());
  *response = std::move(*o);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::ListAndWatch(
    grpc::ServerContext* context, const v1beta1::Empty*,
    grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
  return owner_->StreamDevices(generation_, context, writer);
}

grpc::Status DevicePluginService::GetPreferredAllocation(
    grpc::ServerContext* context, const v1beta1::PreferredAllocationRequest* request,
    v1beta1::PreferredAllocationResponse* response) {
  if (Status ids = owner_->CheckPreferredIds(*request); !ids.ok()) {
    return pluginapi::ToGrpcStatus(ids);
  }
  PluginServerImpl::Call call(owner_, generation_, context);
  StatusOr<v1beta1::PreferredAllocationResponse> r =
      owner_->handler().GetPreferredAllocation(*request, call);
  if (!r.ok()) return pluginapi::ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::Allocate(grpc::ServerContext* context,
                                           const v1beta1::AllocateRequest* request,
                                           v1beta1::AllocateResponse* response) {
  if (Status ids = owner_->CheckAllocateIds(*request); !ids.ok()) {
    return pluginapi::ToGrpcStatus(ids);
  }
  PluginServerImpl::Call call(owner_, generation_, context);
  StatusOr<v1beta1::AllocateResponse> r = owner_->handler().Allocate(*request, call);
  if (!r.ok()) return pluginapi::ToGrpcStatus(r.status());
  *response = std::move(*r);
  return grpc::Status::OK;
}

grpc::Status DevicePluginService::PreStartContainer(
    grpc::ServerContext* context, const v1beta1::PreStartContainerRequest* request,
    v1beta1::PreStartContainerResponse*) {
  if (Status listed = owner_->CheckPreStartIds(*request); !listed.ok()) {
    return pluginapi::ToGrpcStatus(listed);
  }
  PluginServerImpl::Call call(owner_, generation_, context);
  std::vector<std::string> ids(request->devices_ids().begin(), request->devices_ids().end());
  return pluginapi::ToGrpcStatus(owner_->handler().PreStartContainer(ids, call));
}

}  // namespace

StatusOr<std::unique_ptr<PluginServer>> PluginServer::Create(Options options) {
  if (options.resource_name.empty()) {
    return InvalidArgumentError("plugin options: resource_name is empty");
  }
  const bool functions =
      options.allocate || options.get_preferred_allocation || options.pre_start_container;
  if (options.handler && functions) {
    return InvalidArgumentError("plugin options for " + options.resource_name +
                                ": give a handler or handler functions, not both");
  }
  if (!options.handler && !options.allocate) {
    return InvalidArgumentError("plugin options for " + options.resource_name +
                                ": no Allocate handler");
  }
  if (!options.clock) {
    return InvalidArgumentError("plugin options for " + options.resource_name + ": clock is null");
  }
  if (options.plugin_dir.empty()) {
    return InvalidArgumentError("plugin options for " + options.resource_name +
                                ": plugin_dir is empty");
  }
  if (options.socket_name.empty()) options.socket_name = DefaultSocketName(options.resource_name);
  // The rules the kubelet side applies to RegisterRequest.endpoint: a name
  // it would refuse is refused here, before anything is served.
  if (Status name = pluginapi::CheckEndpointName(options.socket_name); !name.ok()) {
    return name.WithPrefix("plugin options for " + options.resource_name + ": socket_name");
  }
  if (options.socket_name == pluginapi::kKubeletSocketName) {
    return InvalidArgumentError("plugin options for " + options.resource_name +
                                ": socket_name must not be kubelet.sock");
  }
  // Both sockets, absolute (a relative plugin_dir is read against the
  // working directory now) and short enough for a unix socket.
  const std::filesystem::path dir(options.plugin_dir);
  StatusOr<std::string> socket_path =
      pluginapi::AbsoluteSocketPath((dir / options.socket_name).string());
  if (!socket_path.ok()) return socket_path.status().WithPrefix("plugin socket");
  StatusOr<std::string> kubelet_path =
      pluginapi::AbsoluteSocketPath((dir / std::string(pluginapi::kKubeletSocketName)).string());
  if (!kubelet_path.ok()) return kubelet_path.status().WithPrefix("kubelet socket");
  std::shared_ptr<DevicePluginHandler> handler = options.handler;
  if (!handler) {
    handler = std::make_shared<FunctionHandler>(options.resource_name, options.allocate,
                                                options.get_preferred_allocation,
                                                options.pre_start_container);
  }
  return std::unique_ptr<PluginServer>(std::make_unique<PluginServerImpl>(
      std::move(options), std::move(*socket_path), std::move(handler)));
}

}  // namespace kdm::plugin
