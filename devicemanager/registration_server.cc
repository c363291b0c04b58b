#include "kdm/devicemanager/registration_server.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/env.h"
#include "kdm/base/file_system.h"
#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/grpc_server.h"
#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"
#include "spdlog/spdlog.h"

namespace kdm::devicemanager {

namespace {

using SteadyClock = std::chrono::steady_clock;

// Everything in a refused request is the plugin's word: quoted and cut so
// that it can neither forge a log line nor flood the log.
constexpr std::size_t kMaxLoggedField = 256;

std::string Millis(std::chrono::milliseconds d) { return std::to_string(d.count()) + "ms"; }

}  // namespace

// The callback API: a waiting call holds no thread, only its reactor and the
// few validated strings below. Calls run on the workers (at most
// max_in_flight, started as calls arrive); one more thread answers the
// calls that waited too long.
class RegistrationServer::Service final : public v1beta1::Registration::CallbackService {
 public:
  Service(std::string dir, Handler handler, RejectObserver on_invalid, Limits limits)
      : dir_(std::move(dir)),
        handler_(std::move(handler)),
        on_invalid_(std::move(on_invalid)),
        limits_(limits),
        expirer_([this] { ExpireWaiting(); }) {}

  ~Service() override {
    BeginStop();
    Join();
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1beta1::RegisterRequest* request,
                                     v1beta1::Empty*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    StatusOr<std::string> socket = Validate(*request);
    if (!socket.ok()) {
      if (on_invalid_) on_invalid_(socket.status());
      LogRejected(request->resource_name(), request->endpoint(), request->version(),
                  socket.status());
      reactor->Finish(pluginapi::ToGrpcStatus(socket.status()));
      return reactor;
    }
    Call call{reactor,
              context,
              request->resource_name(),
              request->endpoint(),
              std::move(*socket),
              WaitDeadline(*context)};
    Status refused;
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) {
        refused = UnavailableError("registration server stopping");
      } else if (running_ + static_cast<int>(queue_.size()) >=
                 limits_.max_in_flight + limits_.max_waiting) {
        refused = ResourceExhaustedError(
            "too many Register calls (" + std::to_string(limits_.max_in_flight) + " in flight, " +
            std::to_string(limits_.max_waiting) + " waiting, the limits); try again later");
      } else {
        queue_.push_back(std::move(call));
        ++queue_version_;
        // A worker for every call that is running or waiting, up to the cap.
        if (static_cast<int>(workers_.size()) < limits_.max_in_flight &&
            workers_.size() < static_cast<std::size_t>(running_) + queue_.size()) {
          workers_.emplace_back([this] { Work(); });
        }
        return reactor;
      }
    }
    RefuseBusy(call, refused, "register_rejected_busy");
    return reactor;
  }

  // New calls are answered UNAVAILABLE; waiting ones too, now.
  void BeginStop() {
    std::deque<Call> waiting;
    {
      kdm::MutexLock lock(&mu_);
      if (stopping_) return;
      stopping_ = true;
      waiting.swap(queue_);
    }
    for (Call& c : waiting) {
      c.reactor->Finish(pluginapi::ToGrpcStatus(UnavailableError("registration server stopping")));
    }
  }

  // Waits for the running calls. REQUIRES: BeginStop() was called.
  void Join() {
    std::vector<std::thread> workers;
    {
      kdm::MutexLock lock(&mu_);
      workers.swap(workers_);
    }
    for (std::thread& t : workers) t.join();
    if (expirer_.joinable()) expirer_.join();
  }

 private:
  struct Call {
    grpc::ServerUnaryReactor* reactor;
    grpc::CallbackServerContext* context;
    std::string resource;
    std::string endpoint;
    std::string socket;
    // When it stops waiting for a slot.
    SteadyClock::time_point wait_deadline;
  };

  SteadyClock::time_point WaitDeadline(const grpc::CallbackServerContext& context) const {
    const auto now = SteadyClock::now();
    auto wait = std::chrono::duration_cast<SteadyClock::duration>(limits_.max_wait);
    const auto client = context.deadline();
    if (client != std::chrono::system_clock::time_point::max()) {
      const auto left = std::chrono::duration_cast<SteadyClock::duration>(
          client - std::chrono::system_clock::now());
      wait = std::max(SteadyClock::duration::zero(), std::min(wait, left));
    }
    return now + wait;
  }

  StatusOr<std::string> Validate(const v1beta1::RegisterRequest& request) {
    KDM_RETURN_IF_ERROR(pluginapi::ValidateVersion(request.version()));
    KDM_RETURN_IF_ERROR(pluginapi::ValidateResourceName(request.resource_name()));
    KDM_ASSIGN_OR_RETURN(std::string socket,
                         pluginapi::CheckPluginEndpoint(dir_, request.endpoint()));
    if (const std::size_t bytes = request.ByteSizeLong(); bytes > kMaxQueuedRequestBytes) {
      return InvalidArgumentError("RegisterRequest of " + std::to_string(bytes) +
                                  " bytes (at most " + std::to_string(kMaxQueuedRequestBytes) +
                                  "; unknown fields?)");
    }
    return socket;
  }

  // The worker threads: take the oldest waiting call, run it, repeat; end
  // once stopping with nothing left.
  void Work() {
    while (true) {
      std::optional<Call> call;
      {
        kdm::MutexLock lock(&mu_);
        mu_.Await(kdm::Condition(this, &Service::HasCallOrStopping));
        if (queue_.empty()) return;
        call = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      Run(*call);
      kdm::MutexLock lock(&mu_);
      --running_;
    }
  }

  bool HasCallOrStopping() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queue_.empty();
  }

  void Run(const Call& call) {
    if (call.context->IsCancelled()) {
      // The plugin gave up (its deadline) while waiting: nobody to answer.
      call.reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled while waiting"));
      return;
    }
    Status s = handler_(call.resource, call.socket);
    if (s.ok()) {
      spdlog::info("event=register_accepted resource={} endpoint={}", call.resource, call.endpoint);
    } else {
      LogRejected(call.resource, call.endpoint, pluginapi::kVersion, s);
    }
    call.reactor->Finish(pluginapi::ToGrpcStatus(s));
  }

  // The one thread that answers calls whose wait is over: sleeps until the
  // earliest wait deadline, a new call, or Stop.
  void ExpireWaiting() {
    uint64_t seen_version = 0;
    while (true) {
      std::vector<Call> expired;
      {
        kdm::MutexLock lock(&mu_);
        const auto now = SteadyClock::now();
        auto next = SteadyClock::time_point::max();
        for (auto it = queue_.begin(); it != queue_.end();) {
          if (it->wait_deadline <= now) {
            expired.push_back(std::move(*it));
            it = queue_.erase(it);
          } else {
            next = std::min(next, it->wait_deadline);
            ++it;
          }
        }
        if (expired.empty()) {
          if (stopping_) return;
          seen_version = queue_version_;
          auto changed = [this, seen_version]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
            return stopping_ || queue_version_ != seen_version;
          };
          if (next == SteadyClock::time_point::max()) {
            mu_.Await(kdm::Condition(&changed));
          } else {
            mu_.AwaitWithTimeout(kdm::Condition(&changed), absl::FromChrono(next - now));
          }
          continue;
        }
      }
      for (Call& c : expired) {
        RefuseBusy(c,
                   ResourceExhaustedError("waited " + Millis(limits_.max_wait) + " for one of " +
                                          std::to_string(limits_.max_in_flight) +
                                          " Register slots (all held by calls in flight); try "
                                          "again later"),
                   "register_wait_expired");
      }
    }
  }

  void LogRejected(const std::string& resource, const std::string& endpoint,
                   std::string_view version, const Status& s) {
    spdlog::warn("event=register_rejected resource={} endpoint={} version={} error={}",
                 QuoteLogValue(resource, kMaxLoggedField), QuoteLogValue(endpoint, kMaxLoggedField),
                 QuoteLogValue(version, kMaxLoggedField),
                 QuoteLogValue(s.message(), 2 * kMaxLoggedField));
  }

  // Answers a call that never reached the Handler (queue full, waited too
  // long, stopping).
  void RefuseBusy(const Call& call, const Status& s, std::string_view event) {
    if (on_invalid_ && s.code() == StatusCode::kResourceExhausted) on_invalid_(s);
    // A flood of refusals must not flood the log: a few lines per second,
    // with the number left out.
    std::optional<int64_t> suppressed;
    {
      kdm::MutexLock lock(&log_mu_);
      suppressed = busy_log_.Admit(event, LogRateLimiter::Clock::now());
    }
    if (suppressed) {
      spdlog::warn(
          "event={} resource={} endpoint={} in_flight_limit={} waiting_limit={} error={} "
          "suppressed={}",
          event, QuoteLogValue(call.resource, kMaxLogValueBytes),
          QuoteLogValue(call.endpoint, kMaxLogValueBytes), limits_.max_in_flight,
          limits_.max_waiting, QuoteLogValue(s.message(), kMaxLogValueBytes), *suppressed);
    }
    call.reactor->Finish(pluginapi::ToGrpcStatus(s));
  }

  const std::string dir_;
  const Handler handler_;
  const RejectObserver on_invalid_;
  const Limits limits_;

  kdm::Mutex mu_;
  std::deque<Call> queue_ ABSL_GUARDED_BY(mu_);
  uint64_t queue_version_ ABSL_GUARDED_BY(mu_) = 0;
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_ ABSL_GUARDED_BY(mu_);

  kdm::Mutex log_mu_;
  LogRateLimiter busy_log_ ABSL_GUARDED_BY(log_mu_){/*burst=*/5, std::chrono::seconds(1)};

  // Last: started by the constructor once everything above is ready.
  std::thread expirer_;
};

RegistrationServer::RegistrationServer(std::string dir, std::string socket_path, Handler handler,
                                       RejectObserver on_invalid, Limits limits)
    : dir_(std::move(dir)),
      socket_path_(std::move(socket_path)),
      service_(std::make_unique<Service>(dir_, std::move(handler), std::move(on_invalid), limits)) {
}

RegistrationServer::~RegistrationServer() { Stop(); }

StatusOr<std::unique_ptr<RegistrationServer>> RegistrationServer::Start(const std::string& dir,
                                                                        Handler handler,
                                                                        RejectObserver on_invalid,
                                                                        Limits limits) {
  if (limits.max_in_flight < 1) {
    return InvalidArgumentError("max Register calls in flight must be at least 1, got " +
                                std::to_string(limits.max_in_flight));
  }
  if (limits.max_waiting < 0) {
    return InvalidArgumentError("max Register calls waiting must be at least 0, got " +
                                std::to_string(limits.max_waiting));
  }
  if (limits.max_wait <= std::chrono::milliseconds::zero()) {
    return InvalidArgumentError("the longest wait of a Register call must be positive, got " +
                                Millis(limits.max_wait));
  }
  StatusOr<std::string> abs =
      pluginapi::AbsoluteSocketPath(JoinPath(dir, pluginapi::kKubeletSocketName));
  if (!abs.ok()) return abs.status().WithPrefix("registration socket");
  const std::string& socket = *abs;
  StatusOr<std::string> target = pluginapi::UnixSocketTarget(socket);
  if (!target.ok()) return target.status().WithPrefix("registration socket");
  ::unlink(socket.c_str());
  std::unique_ptr<RegistrationServer> rs(
      new RegistrationServer(dir, socket, std::move(handler), std::move(on_invalid), limits));
  grpc::ServerBuilder builder;
  int bound_port = 0;
  builder.AddListeningPort(*target, grpc::InsecureServerCredentials(), &bound_port);
  builder.RegisterService(rs->service_.get());
  rs->server_ = builder.BuildAndStart();
  if (!rs->server_) {
    return UnavailableError("cannot serve Registration on " + socket);
  }
  // Only the node agent's user may register plugins. The directory (0750)
  // already keeps others out while the socket briefly has the umask's mode.
  if (::chmod(socket.c_str(), 0600) != 0) {
    Status error = ErrnoToStatus(errno, "cannot make " + socket + " mode 0600");
    rs->Stop();
    return error;
  }
  spdlog::info("event=registration_serving socket={}", socket);
  return rs;
}

void RegistrationServer::Stop() {
  if (stopped_) return;
  stopped_ = true;
  service_->BeginStop();
  // Running Register calls are bounded by the dial/options/stream deadlines;
  // gRPC's shutdown waits until each is answered.
  pluginapi::StopUnixServer(server_.get(), socket_path_, std::chrono::seconds(1));
  service_->Join();
}

}  // namespace kdm::devicemanager
