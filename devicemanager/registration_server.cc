#include "kdm/devicemanager/registration_server.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <utility>

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

// Threads of the Registration server beyond Limits::max_in_flight.
constexpr int kExtraThreads = 8;

}  // namespace

class RegistrationServer::Service final : public v1beta1::Registration::Service {
 public:
  Service(std::string dir, Handler handler, RejectObserver on_invalid, int max_in_flight)
      : dir_(std::move(dir)),
        handler_(std::move(handler)),
        on_invalid_(std::move(on_invalid)),
        max_in_flight_(max_in_flight) {}

  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    // Counted before anything else, released on every return.
    const int in_flight = in_flight_.fetch_add(1) + 1;
    struct Release {
      std::atomic<int>& n;
      ~Release() { n.fetch_sub(1); }
    } release{in_flight_};
    if (in_flight > max_in_flight_) return RefuseBusy(*request);
    Status s = Handle(*request);
    if (s.ok()) {
      spdlog::info("event=register_accepted resource={} endpoint={}", request->resource_name(),
                   request->endpoint());
    } else {
      // Everything in a refused request is the plugin's word: quoted and cut so
      // that it can neither forge a log line nor flood the log.
      constexpr std::size_t kMaxLogged = 256;
      spdlog::warn("event=register_rejected resource={} endpoint={} version={} error={}",
                   QuoteLogValue(request->resource_name(), kMaxLogged),
                   QuoteLogValue(request->endpoint(), kMaxLogged),
                   QuoteLogValue(request->version(), kMaxLogged),
                   QuoteLogValue(s.message(), 2 * kMaxLogged));
    }
    return pluginapi::ToGrpcStatus(s);
  }

 private:
  Status Handle(const v1beta1::RegisterRequest& request) {
    StatusOr<std::string> socket = Validate(request);
    if (!socket.ok()) {
      if (on_invalid_) on_invalid_(socket.status());
      return socket.status();
    }
    return handler_(request.resource_name(), *socket);
  }

  StatusOr<std::string> Validate(const v1beta1::RegisterRequest& request) {
    KDM_RETURN_IF_ERROR(pluginapi::ValidateVersion(request.version()));
    KDM_RETURN_IF_ERROR(pluginapi::ValidateResourceName(request.resource_name()));
    return pluginapi::CheckPluginEndpoint(dir_, request.endpoint());
  }

  grpc::Status RefuseBusy(const v1beta1::RegisterRequest& request) {
    Status s =
        ResourceExhaustedError("too many Register calls in flight (" +
                               std::to_string(max_in_flight_) + ", the limit); try again later");
    if (on_invalid_) on_invalid_(s);
    // A flood of refusals must not flood the log: a few lines per second,
    // with the number left out.
    std::optional<int64_t> suppressed;
    {
      kdm::MutexLock lock(&log_mu_);
      suppressed = busy_log_.Admit("register_busy", LogRateLimiter::Clock::now());
    }
    if (suppressed) {
      spdlog::warn("event=register_rejected_busy resource={} endpoint={} limit={} suppressed={}",
                   QuoteLogValue(request.resource_name(), kMaxLogValueBytes),
                   QuoteLogValue(request.endpoint(), kMaxLogValueBytes), max_in_flight_,
                   *suppressed);
    }
    return pluginapi::ToGrpcStatus(s);
  }

  const std::string dir_;
  const Handler handler_;
  const RejectObserver on_invalid_;
  const int max_in_flight_;
  std::atomic<int> in_flight_{0};
  kdm::Mutex log_mu_;
  LogRateLimiter busy_log_ ABSL_GUARDED_BY(log_mu_){/*burst=*/5, std::chrono::seconds(1)};
};

RegistrationServer::RegistrationServer(std::string dir, std::string socket_path, Handler handler,
                                       RejectObserver on_invalid, Limits limits)
    : dir_(std::move(dir)),
      socket_path_(std::move(socket_path)),
      service_(std::make_unique<Service>(dir_, std::move(handler), std::move(on_invalid),
                                         limits.max_in_flight)) {}

RegistrationServer::~RegistrationServer() { Stop(); }

StatusOr<std::unique_ptr<RegistrationServer>> RegistrationServer::Start(const std::string& dir,
                                                                        Handler handler,
                                                                        RejectObserver on_invalid,
                                                                        Limits limits) {
  if (limits.max_in_flight < 1) {
    return InvalidArgumentError("max Register calls in flight must be at least 1, got " +
                                std::to_string(limits.max_in_flight));
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
  // The sync server starts a thread per call in flight. Room for every call
  // the counter lets through plus the pollers and the calls it refuses
  // (refusing takes a thread briefly); past that gRPC refuses by itself.
  grpc::ResourceQuota quota("kdm-registration");
  quota.SetMaxThreads(limits.max_in_flight + kExtraThreads);
  builder.SetResourceQuota(quota);
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
  // Running Register calls are bounded by the dial/options/stream deadlines.
  pluginapi::StopUnixServer(server_.get(), socket_path_, std::chrono::seconds(1));
}

}  // namespace kdm::devicemanager
