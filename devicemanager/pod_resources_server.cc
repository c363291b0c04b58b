// PodResourcesServer: podresources v1 over a sync gRPC server on a unix socket.
#include "kdm/devicemanager/pod_resources_server.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kdm/base/env.h"
#include "kdm/base/sync.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/grpc_server.h"
#include "kdm/pluginapi/unix_target.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::devicemanager {
namespace {

// Every request of this API is a few strings; anything bigger is refused by
// gRPC with RESOURCE_EXHAUSTED before it reaches a handler.
constexpr int kMaxRequestBytes = 64 * 1024;

// The kubelet's form: one ContainerDevices per device per NUMA node; a
// device without topology appears once, with no topology.
void AppendDevices(const std::vector<ContainerDevices>& in,
                   google::protobuf::RepeatedPtrField<v1::ContainerDevices>* out) {
  for (const ContainerDevices& group : in) {
    for (const std::string& id : group.device_ids) {
      v1::ContainerDevices* d = out->Add();
      d->set_resource_name(group.resource_name);
      d->add_device_ids(id);
      if (group.numa_node.has_value()) d->mutable_topology()->add_nodes()->set_id(*group.numa_node);
    }
  }
}

class Service final : public v1::PodResourcesLister::Service {
 public:
  Service(Manager* manager, std::function<std::vector<ActivePod>()> active_pods)
      : manager_(manager), active_pods_(std::move(active_pods)) {}

  grpc::Status List(grpc::ServerContext*, const v1::ListPodResourcesRequest*,
                    v1::ListPodResourcesResponse* response) override {
    for (const ActivePod& pod : ActivePods()) Fill(pod, response->add_pod_resources());
    return grpc::Status::OK;
  }

  grpc::Status GetAllocatableResources(grpc::ServerContext*, const v1::AllocatableResourcesRequest*,
                                       v1::AllocatableResourcesResponse* response) override {
    AppendDevices(manager_->GetAllocatableDevices(), response->mutable_devices());
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext*, const v1::GetPodResourcesRequest* request,
                   v1::GetPodResourcesResponse* response) override {
    if (request->pod_name().empty()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "pod_name must not be empty");
    }
    for (const ActivePod& pod : ActivePods()) {
      if (pod.name == request->pod_name() && pod.namespace_name == request->pod_namespace()) {
        Fill(pod, response->mutable_pod_resources());
        return grpc::Status::OK;
      }
    }
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        "pod " + request->pod_name() + " in namespace " + request->pod_namespace() + " not found");
  }

 private:
  std::vector<ActivePod> ActivePods() const {
    if (!active_pods_) return {};
    return active_pods_();
  }

  // The proto of the shared read path's answer (pod_resources.h).
  void Fill(const ActivePod& pod, v1::PodResources* out) const {
    PodResources read = PodResourcesOf(*manager_, pod);
    out->set_name(read.name);
    out->set_namespace_(read.namespace_name);
    for (const ContainerResources& container : read.containers) {
      v1::ContainerResources* c = out->add_containers();
      c->set_name(container.name);
      AppendDevices(container.devices, c->mutable_devices());
    }
  }

  Manager* const manager_;
  const std::function<std::vector<ActivePod>()> active_pods_;
};

class PodResourcesServerImpl final : public PodResourcesServer {
 public:
  PodResourcesServerImpl(std::string socket_path, std::unique_ptr<Service> service,
                         const Options& bounds)
      : socket_path_(std::move(socket_path)),
        service_(std::move(service)),
        max_connection_idle_(bounds.max_connection_idle),
        max_memory_bytes_(bounds.max_memory_bytes),
        max_threads_(bounds.max_threads) {}
  ~PodResourcesServerImpl() override { Stop(); }

  Status Serve() {
    grpc::ServerBuilder builder;
    int bound_port = 0;
    StatusOr<std::string> target = pluginapi::UnixSocketTarget(socket_path_);
    if (!target.ok()) return target.status().WithPrefix("pod-resources socket");
    builder.AddListeningPort(*target, grpc::InsecureServerCredentials(), &bound_port);
    builder.SetMaxReceiveMessageSize(kMaxRequestBytes);
    grpc::ResourceQuota quota("kdm-pod-resources");
    quota.Resize(max_memory_bytes_);
    quota.SetMaxThreads(max_threads_);
    builder.SetResourceQuota(quota);
    if (max_connection_idle_.count() > 0) {
      builder.AddChannelArgument(
          GRPC_ARG_MAX_CONNECTION_IDLE_MS,
          static_cast<int>(std::min<int64_t>(max_connection_idle_.count(), INT32_MAX)));
    }
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    if (!server_) return UnavailableError("cannot serve pod-resources on " + socket_path_);
    if (::chmod(socket_path_.c_str(), 0600) != 0) {
      Status error = ErrnoToStatus(errno, "cannot make " + socket_path_ + " mode 0600");
      Stop();
      return error;
    }
    spdlog::info("event=pod_resources_serving socket={}", socket_path_);
    return OkStatus();
  }

  void Stop() override {
    kdm::MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    // Handlers only read in-memory state; a short deadline is plenty.
    if (server_) pluginapi::StopUnixServer(server_.get(), socket_path_, std::chrono::seconds(1));
  }

  const std::string& socket_path() const override { return socket_path_; }

 private:
  const std::string socket_path_;
  const std::unique_ptr<Service> service_;
  const std::chrono::milliseconds max_connection_idle_;
  const size_t max_memory_bytes_;
  const int max_threads_;
  std::unique_ptr<grpc::Server> server_;
  kdm::Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

Status PrepareSocketPath(const std::string& socket_path) {
  namespace fs = std::filesystem;
  fs::path path(socket_path);
  fs::path dir = path.parent_path();
  std::error_code ec;
  if (!dir.empty() && !fs::exists(dir, ec)) {
    fs::create_directories(dir, ec);
    if (ec) return ErrnoToStatus(ec.value(), "cannot create directory " + dir.string());
    if (::chmod(dir.c_str(), 0750) != 0) {
      return ErrnoToStatus(errno, "cannot make " + dir.string() + " mode 0750");
    }
  } else if (!dir.empty() && !fs::is_directory(dir, ec)) {
    return FailedPreconditionError(dir.string() + " is not a directory");
  }
  struct stat st;
  if (::lstat(socket_path.c_str(), &st) == 0) {
    // A stale socket from a previous run is removed; anything else is not
    // ours to delete.
    if (!S_ISSOCK(st.st_mode)) {
      return FailedPreconditionError(socket_path + " exists and is not a socket");
    }
    if (::unlink(socket_path.c_str()) != 0) {
      return ErrnoToStatus(errno, "cannot remove stale socket " + socket_path);
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<PodResourcesServer>> PodResourcesServer::Start(Options options) {
  if (options.socket_path.empty()) return InvalidArgumentError("socket_path must not be empty");
  // Absolute from here on: logs and errors name the file itself.
  StatusOr<std::string> abs = pluginapi::AbsoluteSocketPath(options.socket_path);
  if (!abs.ok()) return abs.status().WithPrefix("pod-resources socket");
  options.socket_path = *abs;
  if (options.manager == nullptr) return InvalidArgumentError("manager must not be null");
  if (options.max_connection_idle.count() < 0) {
    return InvalidArgumentError("max_connection_idle must not be negative");
  }
  if (options.max_memory_bytes < (1u << 20)) {
    return InvalidArgumentError("max_memory_bytes must be at least 1 MiB, got " +
                                std::to_string(options.max_memory_bytes));
  }
  if (options.max_threads < 4) {
    return InvalidArgumentError("max_threads must be at least 4, got " +
                                std::to_string(options.max_threads));
  }
  KDM_RETURN_IF_ERROR(PrepareSocketPath(options.socket_path));
  auto server = std::make_unique<PodResourcesServerImpl>(
      options.socket_path,
      std::make_unique<Service>(options.manager, std::move(options.active_pods)), options);
  KDM_RETURN_IF_ERROR(server->Serve());
  return std::unique_ptr<PodResourcesServer>(std::move(server));
}

}  // namespace kdm::devicemanager
