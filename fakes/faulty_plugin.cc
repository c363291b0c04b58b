#include "kdm/fakes/faulty_plugin.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/env.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::fakes {
namespace {

namespace fs = std::filesystem;
// gRPC deadlines take system_clock time points only.
using SystemClock = std::chrono::system_clock;
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class Fault {
  kRegBadVersion,
  kRegBadResourceName,
  kRegEndpointPath,
  kRegOptionsMismatch,
  kLwNoSnapshot,
  kLwDuplicateIds,
  kLwBadHealth,
  kLwNegativeNuma,
  kLwDeltaUpdates,
  kAllocTwoResponses,
  kAllocAcceptUnknown,
  kAllocRelativePath,
  kAllocBadPermissions,
  kAllocBadEnv,
  kAllocBadCdi,
  kAllocNotConcurrent,
  kPrefWrongSize,
  kPrefNotSubset,
  kPrefDropMustInclude,
  kPrefDuplicates,
  kPrefRandom,
  kPrefSlow,
  kPrestartUnimplemented,
  kLwDropBreaks,
  kNoReregister,
};

struct FaultEntry {
  const char* name;
  Fault fault;
};

// The catalogue's order (docs/conformance.md).
constexpr FaultEntry kFaults[] = {
    {"reg-bad-version", Fault::kRegBadVersion},
    {"reg-bad-resource-name", Fault::kRegBadResourceName},
    {"reg-endpoint-path", Fault::kRegEndpointPath},
    {"reg-options-mismatch", Fault::kRegOptionsMismatch},
    {"lw-no-snapshot", Fault::kLwNoSnapshot},
    {"lw-duplicate-ids", Fault::kLwDuplicateIds},
    {"lw-bad-health", Fault::kLwBadHealth},
    {"lw-negative-numa", Fault::kLwNegativeNuma},
    {"lw-delta-updates", Fault::kLwDeltaUpdates},
    {"alloc-two-responses", Fault::kAllocTwoResponses},
    {"alloc-accept-unknown", Fault::kAllocAcceptUnknown},
    {"alloc-relative-path", Fault::kAllocRelativePath},
    {"alloc-bad-permissions", Fault::kAllocBadPermissions},
    {"alloc-bad-env", Fault::kAllocBadEnv},
    {"alloc-bad-cdi", Fault::kAllocBadCdi},
    {"alloc-not-concurrent", Fault::kAllocNotConcurrent},
    {"pref-wrong-size", Fault::kPrefWrongSize},
    {"pref-not-subset", Fault::kPrefNotSubset},
    {"pref-drop-must-include", Fault::kPrefDropMustInclude},
    {"pref-duplicates", Fault::kPrefDuplicates},
    {"pref-random", Fault::kPrefRandom},
    {"pref-slow", Fault::kPrefSlow},
    {"prestart-unimplemented", Fault::kPrestartUnimplemented},
    {"lw-drop-breaks", Fault::kLwDropBreaks},
    {"no-reregister", Fault::kNoReregister},
};

bool IsPreferredFault(Fault f) {
  switch (f) {
    case Fault::kPrefWrongSize:
    case Fault::kPrefNotSubset:
    case Fault::kPrefDropMustInclude:
    case Fault::kPrefDuplicates:
    case Fault::kPrefRandom:
    case Fault::kPrefSlow:
      return true;
    default:
      return false;
  }
}

// Deadline of one Register call (as the SDK's default); Stop cancels it.
constexpr milliseconds kRegisterTimeout{10'000};
// lw-delta-updates: one single-device message this often.
constexpr milliseconds kDeltaInterval{200};
// How often a waiting handler looks at its client (gRPC's sync API has no
// cancellation callback).
constexpr milliseconds kCancelPoll{10};
// alloc-not-concurrent holds each call this long, so that overlap is certain.
constexpr milliseconds kAllocateHold{20};
// pref-slow never holds a call longer than this.
constexpr milliseconds kSlowBound{60'000};

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

// Identity of a file, to notice that it was removed and created again. The
// change time tells a new file apart even when it reuses the inode number.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  int64_t ctime_sec = 0;
  int64_t ctime_nsec = 0;
  friend bool operator==(const FileId&, const FileId&) = default;
};

std::optional<FileId> StatFile(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return std::nullopt;
  return FileId{st.st_dev, st.st_ino, st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
}

}  // namespace

const std::vector<std::string>& FaultNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>();
    for (const FaultEntry& e : kFaults) v->push_back(e.name);
    return v;
  }();
  return *names;
}

Status CheckFaultName(std::string_view name) {
  for (const FaultEntry& e : kFaults) {
    if (name == e.name) return OkStatus();
  }
  std::string known;
  for (const FaultEntry& e : kFaults) known += (known.empty() ? "" : ", ") + std::string(e.name);
  // A huge name is cut, so that the message stays one readable line.
  constexpr size_t kShown = 64;
  std::string shown(name.substr(0, kShown));
  if (name.size() > kShown) shown += "...";
  return InvalidArgumentError("unknown fault \"" + shown + "\" (known: " + known + ")");
}

class FaultyPlugin::Impl {
 public:
  Impl(Fault fault, std::string fault_name, PluginConfig config,
       std::unique_ptr<FakeDevicePlugin> healthy)
      : fault_(fault),
        fault_name_(std::move(fault_name)),
        config_(std::move(config)),
        healthy_(std::move(healthy)),
        socket_path_(healthy_->server().SocketPath()),
        kubelet_path_(
            (fs::path(socket_path_).parent_path() / std::string(pluginapi::kKubeletSocketName))
                .string()),
        offers_preferred_(healthy_->config().policy.has_value()),
        random_(std::random_device{}()) {}

  ~Impl() { Stop(); }

  Status Start() ABSL_LOCKS_EXCLUDED(lifecycle_mu_, mu_) {
    kdm::MutexLock life(&lifecycle_mu_);
    {
      kdm::MutexLock lock(&mu_);
      if (started_) return FailedPreconditionError("faulty plugin already started");
      if (stopping_) return FailedPreconditionError("faulty plugin already stopped");
      started_ = true;
    }
    KDM_RETURN_IF_ERROR(Serve());
    supervisor_ = std::thread([this] { Supervise(); });
    return OkStatus();
  }

  void Stop() ABSL_LOCKS_EXCLUDED(lifecycle_mu_, mu_) {
    kdm::MutexLock life(&lifecycle_mu_);
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;  // ends every stream and held call within kCancelPoll
      if (register_context_ != nullptr) register_context_->TryCancel();
    }
    if (supervisor_.joinable()) supervisor_.join();
    ShutdownServer();
    kdm::MutexLock lock(&mu_);
    if (socket_id_ && StatFile(socket_path_) == socket_id_) ::unlink(socket_path_.c_str());
  }

  const std::string& fault_name() const { return fault_name_; }
  const FakeDevicePlugin& healthy() const { return *healthy_; }
  const std::string& socket_path() const { return socket_path_; }

  int RegistrationCount() const {
    kdm::MutexLock lock(&mu_);
    return registration_count_;
  }

  bool WaitForRegistrationCount(int count, milliseconds timeout) const {
    kdm::MutexLock lock(&mu_);
    auto reached = [this, count]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registration_count_ >= count; };
    return mu_.AwaitWithTimeout(kdm::Condition(&reached), absl::FromChrono(timeout));
  }

  int HeldCalls() const {
    kdm::MutexLock lock(&mu_);
    return held_calls_;
  }

  Status LastRegistrationError() const {
    kdm::MutexLock lock(&mu_);
    return last_registration_error_;
  }

  // --- the RPC bodies (called by Service) ----------------------------------

  v1beta1::DevicePluginOptions Options() const {
    v1beta1::DevicePluginOptions o;
    o.set_pre_start_required(config_.pre_start || fault_ == Fault::kPrestartUnimplemented);
    o.set_get_preferred_allocation_available(offers_preferred_);
    return o;
  }

  grpc::Status ListAndWatch(uint64_t generation, grpc::ServerContext* context,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) {
    {
      kdm::MutexLock lock(&mu_);
      if (fault_ == Fault::kLwDropBreaks && stream_cancelled_) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "ListAndWatch is broken since a client cancelled a stream "
                            "(fault lw-drop-breaks)");
      }
    }
    const v1beta1::ListAndWatchResponse snapshot = Snapshot();
    bool client_gone = false;
    std::optional<HeldCall> held;
    if (fault_ == Fault::kLwNoSnapshot) {
      held.emplace(this);
    } else {
      client_gone = !writer->Write(snapshot);
    }
    // lw-delta-updates: per stream, the health each device was last sent with.
    std::vector<bool> healthy(snapshot.devices_size(), true);
    int next_delta = 0;
    auto delta_at = SteadyClock::now() + kDeltaInterval;
    while (!client_gone) {
      if (context->IsCancelled()) {
        client_gone = true;
        break;
      }
      if (WaitEnded(generation, kCancelPoll)) break;
      if (fault_ == Fault::kLwDeltaUpdates && !healthy.empty() && SteadyClock::now() >= delta_at) {
        delta_at += kDeltaInterval;
        int i = next_delta++ % static_cast<int>(healthy.size());
        healthy[i] = !healthy[i];
        v1beta1::ListAndWatchResponse delta;
        *delta.add_devices() = snapshot.devices(i);
        delta.mutable_devices(0)->set_health(
            std::string(healthy[i] ? pluginapi::kHealthy : pluginapi::kUnhealthy));
        client_gone = !writer->Write(delta);
      }
    }
    if (client_gone) {
      kdm::MutexLock lock(&mu_);
      stream_cancelled_ = true;
    }
    return grpc::Status::OK;
  }

  grpc::Status Allocate(const v1beta1::AllocateRequest& request,
                        v1beta1::AllocateResponse* response) {
    if (fault_ == Fault::kAllocNotConcurrent) {
      bool idle = false;
      if (!allocate_in_flight_.compare_exchange_strong(idle, true)) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "busy: another Allocate is in flight (fault alloc-not-concurrent)");
      }
      HoldUnlessStopping(kAllocateHold);
      grpc::Status s = AllocateContainers(request, response);
      allocate_in_flight_ = false;
      return s;
    }
    return AllocateContainers(request, response);
  }

  grpc::Status PreferredAllocation(grpc::ServerContext* context,
                                   const v1beta1::PreferredAllocationRequest& request,
                                   v1beta1::PreferredAllocationResponse* response) {
    if (!offers_preferred_) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "GetPreferredAllocation is not offered by " + config_.resource_name);
    }
    const int devices = static_cast<int>(healthy_->topology().size());
    for (const auto& container : request.container_requests()) {
      if (fault_ == Fault::kPrefSlow && container.allocation_size() >= std::max(1, devices - 1)) {
        const auto start = SteadyClock::now();
        const char* ended = HoldUntilCancelled(context);
        spdlog::info(
            "event=fault_applied fault={} rpc=GetPreferredAllocation size={} "
            "held_ms={} ended={}",
            fault_name_, container.allocation_size(),
            std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count(), ended);
        return grpc::Status(grpc::StatusCode::CANCELLED,
                            "GetPreferredAllocation held until the client gave up "
                            "(fault pref-slow)");
      }
      StatusOr<v1beta1::ContainerPreferredAllocationResponse> r = PreferredFor(container);
      if (!r.ok()) return pluginapi::ToGrpcStatus(r.status());
      auto* ids = r->mutable_deviceids();
      switch (fault_) {
        case Fault::kPrefWrongSize:
          if (!ids->empty()) ids->RemoveLast();
          break;
        case Fault::kPrefNotSubset:
          if (!ids->empty()) *ids->Mutable(ids->size() - 1) = "no-such-device";
          break;
        case Fault::kPrefDuplicates:
          if (ids->size() >= 2) {
            *ids->Mutable(ids->size() - 1) = ids->Get(0);
          } else if (ids->size() == 1) {
            *ids->Add() = ids->Get(0);
          }
          break;
        default:
          break;
      }
      if (IsPreferredFault(fault_)) {
        spdlog::info("event=fault_applied fault={} rpc=GetPreferredAllocation size={} answer={}",
                     fault_name_, container.allocation_size(), Join(Strings(*ids)));
      }
      *response->add_container_responses() = std::move(*r);
    }
    return grpc::Status::OK;
  }

  grpc::Status PreStart(const v1beta1::PreStartContainerRequest& request) {
    if (fault_ == Fault::kPrestartUnimplemented) {
      return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                          "PreStartContainer is not implemented (fault prestart-unimplemented)");
    }
    spdlog::info("event=pre_start_container resource={} devices={}", config_.resource_name,
                 Join(Strings(request.devices_ids())));
    return grpc::Status::OK;
  }

 private:
  class Service;

  // Counts one held call for as long as it lives.
  class HeldCall {
   public:
    explicit HeldCall(Impl* impl) : impl_(impl) {
      kdm::MutexLock lock(&impl_->mu_);
      ++impl_->held_calls_;
    }
    ~HeldCall() {
      kdm::MutexLock lock(&impl_->mu_);
      --impl_->held_calls_;
    }
    HeldCall(const HeldCall&) = delete;
    HeldCall& operator=(const HeldCall&) = delete;

   private:
    Impl* const impl_;
  };

  // The healthy snapshot, broken by the lw-* faults that corrupt its content.
  v1beta1::ListAndWatchResponse Snapshot() const {
    std::vector<plugin::Device> devices;
    for (const topology::DeviceInfo& d : healthy_->topology().devices()) {
      plugin::Device dev{d.id, true, {}};
      if (d.numa) dev.numa_nodes.push_back(*d.numa);
      devices.push_back(std::move(dev));
    }
    v1beta1::ListAndWatchResponse r = plugin::ToListAndWatchResponse(devices);
    if (r.devices().empty()) return r;
    switch (fault_) {
      case Fault::kLwDuplicateIds:
        *r.add_devices() = r.devices(0);
        break;
      case Fault::kLwBadHealth:
        r.mutable_devices(0)->set_health("healthy");
        break;
      case Fault::kLwNegativeNuma: {
        v1beta1::TopologyInfo* t = r.mutable_devices(0)->mutable_topology();
        t->clear_nodes();
        t->add_nodes()->set_id(-1);
        break;
      }
      default:
        break;
    }
    return r;
  }

  grpc::Status AllocateContainers(const v1beta1::AllocateRequest& request,
                                  v1beta1::AllocateResponse* response) {
    for (const auto& container : request.container_requests()) {
      StatusOr<v1beta1::ContainerAllocateResponse> r = fault_ == Fault::kAllocAcceptUnknown
                                                           ? AllocateAcceptingUnknown(container)
                                                           : healthy_->Allocate(container);
      if (!r.ok()) return pluginapi::ToGrpcStatus(r.status());
      switch (fault_) {
        case Fault::kAllocRelativePath:
          if (!r->devices().empty()) {
            std::string path = r->devices(0).host_path();
            path.erase(0, path.find_first_not_of('/'));
            r->mutable_devices(0)->set_host_path(path.empty() ? "dev/nvidia0" : path);
          }
          break;
        case Fault::kAllocBadPermissions:
          if (!r->devices().empty()) r->mutable_devices(0)->set_permissions("rwx");
          break;
        case Fault::kAllocBadEnv:
          (*r->mutable_envs())["1 BAD=NAME"] = "1";
          break;
        case Fault::kAllocBadCdi:
          r->add_cdi_devices()->set_name(
              container.devices_ids().empty() ? "gpu0" : container.devices_ids(0));
          break;
        default:
          break;
      }
      *response->add_container_responses() = std::move(*r);
    }
    if (fault_ == Fault::kAllocTwoResponses && !response->container_responses().empty()) {
      v1beta1::ContainerAllocateResponse extra = response->container_responses(0);
      *response->add_container_responses() = std::move(extra);
    }
    switch (fault_) {
      case Fault::kAllocTwoResponses:
      case Fault::kAllocAcceptUnknown:
      case Fault::kAllocRelativePath:
      case Fault::kAllocBadPermissions:
      case Fault::kAllocBadEnv:
      case Fault::kAllocBadCdi:
        spdlog::info("event=fault_applied fault={} rpc=Allocate container_responses={}",
                     fault_name_, response->container_responses_size());
        break;
      default:
        break;
    }
    return grpc::Status::OK;
  }

  // alloc-accept-unknown: the healthy answer for the known ids, with the
  // visible-devices env naming every id asked for, known or not.
  StatusOr<v1beta1::ContainerAllocateResponse> AllocateAcceptingUnknown(
      const v1beta1::ContainerAllocateRequest& request) const {
    v1beta1::ContainerAllocateRequest known;
    std::set<std::string> seen;
    std::vector<std::string> all;
    for (const std::string& id : request.devices_ids()) {
      all.push_back(id);
      if (healthy_->topology().IndexOf(id) && seen.insert(id).second) known.add_devices_ids(id);
    }
    v1beta1::ContainerAllocateResponse r;
    if (!known.devices_ids().empty()) {
      KDM_ASSIGN_OR_RETURN(r, healthy_->Allocate(known));
    }
    (*r.mutable_envs())[healthy_->visible_devices_env()] = Join(all);
    return r;
  }

  StatusOr<v1beta1::ContainerPreferredAllocationResponse> PreferredFor(
      const v1beta1::ContainerPreferredAllocationRequest& request) {
    // Every fault answers only what the healthy plugin could answer at all.
    KDM_ASSIGN_OR_RETURN(v1beta1::ContainerPreferredAllocationResponse healthy,
                         healthy_->PreferredAllocation(request));
    const std::set<std::string> must(request.must_include_deviceids().begin(),
                                     request.must_include_deviceids().end());
    std::vector<std::string> rest;
    {
      std::set<std::string> seen;
      for (const std::string& id : request.available_deviceids()) {
        if (!must.count(id) && seen.insert(id).second) rest.push_back(id);
      }
    }
    const size_t size = std::max(0, request.allocation_size());
    if (fault_ == Fault::kPrefDropMustInclude && !must.empty()) {
      v1beta1::ContainerPreferredAllocationRequest without_must;
      for (const std::string& id : rest) without_must.add_available_deviceids(id);
      without_must.set_allocation_size(request.allocation_size());
      StatusOr<v1beta1::ContainerPreferredAllocationResponse> r =
          healthy_->PreferredAllocation(without_must);
      if (r.ok()) return r;
      v1beta1::ContainerPreferredAllocationResponse fewer;
      for (size_t i = 0; i < rest.size() && i < size; ++i) fewer.add_deviceids(rest[i]);
      return fewer;
    }
    if (fault_ == Fault::kPrefRandom) {
      const size_t pick = size > must.size() ? size - must.size() : 0;
      kdm::MutexLock lock(&mu_);
      std::set<std::string> answer;
      for (int attempt = 0; attempt < 20; ++attempt) {
        std::shuffle(rest.begin(), rest.end(), random_);
        answer = must;
        answer.insert(rest.begin(), rest.begin() + std::min(pick, rest.size()));
        if (answer != last_random_answer_) break;
      }
      last_random_answer_ = answer;
      v1beta1::ContainerPreferredAllocationResponse r;
      for (const std::string& id : request.must_include_deviceids()) r.add_deviceids(id);
      for (size_t i = 0; i < pick && i < rest.size(); ++i) r.add_deviceids(rest[i]);
      return r;
    }
    return healthy;
  }

  // True when the stream of `generation` must end (Stop, or the server was
  // replaced); otherwise waits at most `d` for that.
  bool WaitEnded(uint64_t generation, milliseconds d) ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    auto ended = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopping_ || generation != generation_;
    };
    return mu_.AwaitWithTimeout(kdm::Condition(&ended), absl::FromChrono(d));
  }

  void HoldUnlessStopping(milliseconds d) ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(kdm::Condition(&stopping_), absl::FromChrono(d));
  }

  // pref-slow: until the client cancels (or its deadline passes), Stop, or
  // kSlowBound. Returns which of them ended the wait.
  const char* HoldUntilCancelled(grpc::ServerContext* context) ABSL_LOCKS_EXCLUDED(mu_) {
    HeldCall held(this);
    const auto end = SteadyClock::now() + kSlowBound;
    while (true) {
      if (context->IsCancelled()) return "client_gone";
      if (SteadyClock::now() >= end) return "bound";
      kdm::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(kdm::Condition(&stopping_), absl::FromChrono(kCancelPoll))) {
        return "stopping";
      }
    }
  }

  // Binds the socket and starts a new serving generation. Runs in Start or
  // on the supervisor thread, never both at once.
  Status Serve() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops the current server (if any); its streams end.
  void ShutdownServer() ABSL_LOCKS_EXCLUDED(mu_);
  Status RegisterOnce() ABSL_LOCKS_EXCLUDED(mu_);
  // The one background thread: registers with back-off, watches kubelet.sock
  // and its own socket. Joined in Stop.
  void Supervise() ABSL_LOCKS_EXCLUDED(mu_);
  // Waits up to `d` for Stop; false when stopping.
  bool SleepFor(milliseconds d) ABSL_LOCKS_EXCLUDED(mu_) {
    kdm::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(kdm::Condition(&stopping_), absl::FromChrono(d));
    return !stopping_;
  }

  const Fault fault_;
  const std::string fault_name_;
  const PluginConfig config_;
  const std::unique_ptr<FakeDevicePlugin> healthy_;
  const std::string socket_path_;
  const std::string kubelet_path_;
  const bool offers_preferred_;

  // Held for the whole of Start and of Stop, so that they never interleave.
  kdm::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  // Guards the state below; never held across a gRPC call. Waiters use
  // kdm::Condition, so changes need no explicit notification.
  mutable kdm::Mutex mu_;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;  // bumped per serving generation
  int registration_count_ ABSL_GUARDED_BY(mu_) = 0;
  Status last_registration_error_ ABSL_GUARDED_BY(mu_);
  std::optional<FileId> socket_id_ ABSL_GUARDED_BY(mu_);
  // The Register call in flight, so that Stop can cancel it.
  grpc::ClientContext* register_context_ ABSL_GUARDED_BY(mu_) = nullptr;
  // lw-drop-breaks: a client has cancelled a stream.
  bool stream_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Calls the fault holds now (lw-no-snapshot, pref-slow).
  int held_calls_ ABSL_GUARDED_BY(mu_) = 0;
  // pref-random.
  std::mt19937 random_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> last_random_answer_ ABSL_GUARDED_BY(mu_);

  // alloc-not-concurrent.
  std::atomic<bool> allocate_in_flight_{false};

  // The server objects: touched by Start, then only by the supervisor
  // thread, then (after it is joined) by Stop.
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Service> service_;
  std::thread supervisor_;
};

// The gRPC service of one serving generation; a new generation gets a new
// object because a grpc::Service can be registered with one server only.
class FaultyPlugin::Impl::Service final : public v1beta1::DevicePlugin::Service {
 public:
  Service(Impl* owner, uint64_t generation) : owner_(owner), generation_(generation) {}

  grpc::Status GetDevicePluginOptions(grpc::ServerContext*, const v1beta1::Empty*,
                                      v1beta1::DevicePluginOptions* response) override {
    *response = owner_->Options();
    return grpc::Status::OK;
  }
  grpc::Status ListAndWatch(grpc::ServerContext* context, const v1beta1::Empty*,
                            grpc::ServerWriter<v1beta1::ListAndWatchResponse>* writer) override {
    return owner_->ListAndWatch(generation_, context, writer);
  }
  grpc::Status GetPreferredAllocation(grpc::ServerContext* context,
                                      const v1beta1::PreferredAllocationRequest* request,
                                      v1beta1::PreferredAllocationResponse* response) override {
    return owner_->PreferredAllocation(context, *request, response);
  }
  grpc::Status Allocate(grpc::ServerContext*, const v1beta1::AllocateRequest* request,
                        v1beta1::AllocateResponse* response) override {
    return owner_->Allocate(*request, response);
  }
  grpc::Status PreStartContainer(grpc::ServerContext*,
                                 const v1beta1::PreStartContainerRequest* request,
                                 v1beta1::PreStartContainerResponse*) override {
    return owner_->PreStart(*request);
  }

 private:
  Impl* const owner_;
  const uint64_t generation_;
};

Status FaultyPlugin::Impl::Serve() {
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
  if (::unlink(socket_path_.c_str()) != 0 && errno != ENOENT) {
    return ErrnoToStatus(errno, "cannot remove stale socket " + socket_path_);
  }
  uint64_t generation;
  {
    kdm::MutexLock lock(&mu_);
    generation = ++generation_;
  }
  auto service = std::make_unique<Service>(this, generation);
  KDM_ASSIGN_OR_RETURN(std::string target, pluginapi::UnixSocketTarget(socket_path_));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target, grpc::InsecureServerCredentials());
  builder.RegisterService(service.get());
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server) return UnavailableError("cannot serve on unix socket " + socket_path_);
  ::chmod(socket_path_.c_str(), 0600);
  server_ = std::move(server);
  service_ = std::move(service);
  if (config_.after_bind_for_test) config_.after_bind_for_test();
  kdm::MutexLock lock(&mu_);
  socket_id_ = StatFile(socket_path_);
  return OkStatus();
}

void FaultyPlugin::Impl::ShutdownServer() {
  if (!server_) return;
  {
    kdm::MutexLock lock(&mu_);
    ++generation_;  // ends every stream of the old generation
  }
  // Streams and held calls end within kCancelPoll; the deadline cancels
  // anything still in flight.
  server_->Shutdown(SystemClock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
  service_.reset();
}

Status FaultyPlugin::Impl::RegisterOnce() {
  KDM_ASSIGN_OR_RETURN(std::string target, pluginapi::UnixSocketTarget(kubelet_path_));
  auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
  auto stub = v1beta1::Registration::NewStub(channel);
  const std::string socket_name = fs::path(socket_path_).filename().string();
  v1beta1::RegisterRequest request;
  request.set_version(fault_ == Fault::kRegBadVersion ? "v1beta2"
                                                      : std::string(pluginapi::kVersion));
  request.set_endpoint(fault_ == Fault::kRegEndpointPath ? "../" + socket_name : socket_name);
  std::string resource = config_.resource_name;
  if (fault_ == Fault::kRegBadResourceName) {
    resource = resource.substr(0, resource.find('/')) + "/Bad Name!";
  }
  request.set_resource_name(resource);
  *request.mutable_options() = Options();
  if (fault_ == Fault::kRegOptionsMismatch) {
    request.mutable_options()->set_pre_start_required(!Options().pre_start_required());
  }
  grpc::ClientContext context;
  context.set_deadline(SystemClock::now() + kRegisterTimeout);
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_) return CancelledError("stopping");
    register_context_ = &context;
  }
  v1beta1::Empty empty;
  grpc::Status s = stub->Register(&context, request, &empty);
  {
    kdm::MutexLock lock(&mu_);
    register_context_ = nullptr;
  }
  if (!s.ok()) {
    return pluginapi::FromGrpcStatus(s, "registration of " + config_.resource_name + " refused");
  }
  spdlog::info("event=fault_registered fault={} version={} resource={} endpoint={}", fault_name_,
               request.version(), QuoteLogValue(request.resource_name()),
               QuoteLogValue(request.endpoint()));
  return OkStatus();
}

void FaultyPlugin::Impl::Supervise() {
  milliseconds backoff = config_.register_backoff_initial;
  std::optional<FileId> kubelet_id = StatFile(kubelet_path_);
  // Registered with the kubelet that kubelet_id identifies.
  bool registered = false;
  auto back_off = [&] {
    bool go_on = SleepFor(backoff);
    backoff = std::min(backoff * 2, config_.register_backoff_max);
    return go_on;
  };
  while (true) {
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    // Our own socket gone: a restarted kubelet cleaned the directory.
    bool own_lost;
    {
      kdm::MutexLock lock(&mu_);
      // No identity: the socket was deleted between bind and stat (a
      // kubelet cleaning the directory as it starts); serve it again.
      own_lost = !socket_id_ || StatFile(socket_path_) != socket_id_;
    }
    if (own_lost) {
      ShutdownServer();
      if (Status s = Serve(); !s.ok()) {
        {
          kdm::MutexLock lock(&mu_);
          last_registration_error_ = s;
        }
        if (!back_off()) return;
        continue;
      }
      registered = false;
    }
    // kubelet.sock created again: a restarted kubelet.
    std::optional<FileId> kid = StatFile(kubelet_path_);
    if (kid != kubelet_id) {
      kubelet_id = kid;
      registered = false;
    }
    bool register_now = config_.register_with_kubelet && !registered && kid.has_value();
    if (register_now && fault_ == Fault::kNoReregister) {
      kdm::MutexLock lock(&mu_);
      register_now = registration_count_ == 0;
    }
    if (register_now) {
      Status s = RegisterOnce();
      {
        kdm::MutexLock lock(&mu_);
        if (stopping_) return;
        if (s.ok()) {
          ++registration_count_;
          last_registration_error_ = OkStatus();
        } else {
          last_registration_error_ = s;
        }
      }
      if (!s.ok()) {
        if (!back_off()) return;
        continue;
      }
      registered = true;
      backoff = config_.register_backoff_initial;
    }
    if (!SleepFor(config_.watch_interval)) return;
  }
}

StatusOr<std::unique_ptr<FaultyPlugin>> FaultyPlugin::Create(PluginConfig config,
                                                             std::string fault) {
  KDM_RETURN_IF_ERROR(CheckFaultName(fault));
  Fault f = Fault::kRegBadVersion;
  for (const FaultEntry& e : kFaults) {
    if (fault == e.name) f = e.fault;
  }
  PluginConfig healthy_config = config;
  healthy_config.register_with_kubelet = false;
  // The pref-* faults need GetPreferredAllocation whatever --policy says.
  if (IsPreferredFault(f) && !healthy_config.policy) {
    healthy_config.policy = topology::Policy::kPacked;
  }
  KDM_ASSIGN_OR_RETURN(std::unique_ptr<FakeDevicePlugin> healthy,
                       FakeDevicePlugin::Create(std::move(healthy_config)));
  return std::unique_ptr<FaultyPlugin>(new FaultyPlugin(
      std::make_unique<Impl>(f, std::move(fault), std::move(config), std::move(healthy))));
}

FaultyPlugin::FaultyPlugin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
FaultyPlugin::~FaultyPlugin() { Stop(); }
Status FaultyPlugin::Start() { return impl_->Start(); }
void FaultyPlugin::Stop() { impl_->Stop(); }
std::string FaultyPlugin::SocketPath() const { return impl_->socket_path(); }
int FaultyPlugin::RegistrationCount() const { return impl_->RegistrationCount(); }
bool FaultyPlugin::WaitForRegistrationCount(int count, std::chrono::milliseconds timeout) const {
  return impl_->WaitForRegistrationCount(count, timeout);
}
Status FaultyPlugin::LastRegistrationError() const { return impl_->LastRegistrationError(); }
int FaultyPlugin::HeldCalls() const { return impl_->HeldCalls(); }
const std::string& FaultyPlugin::fault() const { return impl_->fault_name(); }
const FakeDevicePlugin& FaultyPlugin::healthy() const { return impl_->healthy(); }

}  // namespace kdm::fakes
