#include "kdm/conformance/registrar.h"

#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/file_system.h"
#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/grpc_server.h"
#include "kdm/pluginapi/unix_target.h"
#include "spdlog/spdlog.h"

namespace kdm::conformance {

class Registrar::Service final : public v1beta1::Registration::Service {
 public:
  grpc::Status Register(grpc::ServerContext*, const v1beta1::RegisterRequest* request,
                        v1beta1::Empty*) override {
    spdlog::info("event=register_received resource={} endpoint={} version={}",
                 QuoteLogValue(request->resource_name(), kMaxLogValueBytes),
                 QuoteLogValue(request->endpoint(), kMaxLogValueBytes),
                 QuoteLogValue(request->version(), kMaxLogValueBytes));
    kdm::MutexLock lock(&mu_);
    registrations_.push_back({*request, std::chrono::steady_clock::now()});
    return grpc::Status::OK;
  }

  std::vector<Registration> Registrations() const {
    kdm::MutexLock lock(&mu_);
    return registrations_;
  }

  bool WaitForCount(size_t count, std::chrono::milliseconds timeout) const {
    kdm::MutexLock lock(&mu_);
    auto enough = [&]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return registrations_.size() >= count; };
    return mu_.AwaitWithTimeout(kdm::Condition(&enough), absl::FromChrono(timeout));
  }

 private:
  mutable kdm::Mutex mu_;
  std::vector<Registration> registrations_ ABSL_GUARDED_BY(mu_);
};

struct Registrar::Server {
  std::unique_ptr<grpc::Server> server;
};

Registrar::Registrar(std::string socket_path)
    : socket_path_(std::move(socket_path)), service_(std::make_unique<Service>()) {}

Registrar::~Registrar() { Stop(); }

StatusOr<std::unique_ptr<Registrar>> Registrar::Start(const std::string& plugin_dir) {
  StatusOr<std::string> socket =
      pluginapi::AbsoluteSocketPath(JoinPath(plugin_dir, pluginapi::kKubeletSocketName));
  if (!socket.ok()) return socket.status().WithPrefix("registration socket");
  KDM_RETURN_IF_ERROR(EnsureDirectory(plugin_dir, 0750));
  std::unique_ptr<Registrar> r(new Registrar(*socket));
  KDM_RETURN_IF_ERROR(r->Serve());
  return r;
}

Status Registrar::Serve() {
  ::unlink(socket_path_.c_str());
  KDM_ASSIGN_OR_RETURN(std::string target, pluginapi::UnixSocketTarget(socket_path_));
  grpc::ServerBuilder builder;
  builder.AddListeningPort(target, grpc::InsecureServerCredentials());
  builder.RegisterService(service_.get());
  auto server = std::make_unique<Server>();
  server->server = builder.BuildAndStart();
  if (!server->server) return UnavailableError("cannot serve Registration on " + socket_path_);
  server_ = std::move(server);
  spdlog::debug("event=registration_serving socket={}", socket_path_);
  return OkStatus();
}

Status Registrar::Restart() {
  Stop();
  return Serve();
}

void Registrar::Stop() {
  if (!server_) return;
  // Register calls return at once, so a short grace is enough.
  pluginapi::StopUnixServer(server_->server.get(), socket_path_, std::chrono::seconds(1));
  server_.reset();
}

std::vector<Registrar::Registration> Registrar::Registrations() const {
  return service_->Registrations();
}

bool Registrar::WaitForCount(size_t count, std::chrono::milliseconds timeout) const {
  return service_->WaitForCount(count, timeout);
}

}  // namespace kdm::conformance
