#include "kdm/devicemanager/pod_resources_client.h"

#include <grpcpp/grpcpp.h>
#include <sys/stat.h>

#include <utility>

#include "kdm/pluginapi/grpc_status.h"
#include "kdm/pluginapi/unix_target.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::devicemanager {
namespace {

// One wire entry as kdm's entries: one per NUMA node, or one without.
void AppendDevices(const v1::ContainerDevices& in, std::vector<ContainerDevices>& out) {
  std::vector<std::string> ids(in.device_ids().begin(), in.device_ids().end());
  if (in.topology().nodes().empty()) {
    out.push_back({in.resource_name(), std::move(ids), std::nullopt});
    return;
  }
  for (const auto& node : in.topology().nodes()) {
    out.push_back({in.resource_name(), ids, node.id()});
  }
}

class PodResourcesClientImpl final : public PodResourcesClient {
 public:
  PodResourcesClientImpl(Options options, const std::string& target)
      : options_(std::move(options)),
        stub_(v1::PodResourcesLister::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}

  StatusOr<std::vector<PodResources>> List() override {
    v1::ListPodResourcesResponse response;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    KDM_RETURN_IF_ERROR(Check(stub_->List(&ctx, v1::ListPodResourcesRequest(), &response), "List"));
    std::vector<PodResources> pods;
    pods.reserve(response.pod_resources_size());
    for (const auto& p : response.pod_resources()) {
      PodResources pod{p.namespace_(), p.name(), {}};
      for (const auto& c : p.containers()) {
        ContainerResources container{c.name(), {}};
        for (const auto& d : c.devices()) AppendDevices(d, container.devices);
        pod.containers.push_back(std::move(container));
      }
      pods.push_back(std::move(pod));
    }
    return pods;
  }

  StatusOr<std::vector<ContainerDevices>> GetAllocatableResources() override {
    v1::AllocatableResourcesResponse response;
    grpc::ClientContext ctx;
    SetDeadline(ctx);
    KDM_RETURN_IF_ERROR(
        Check(stub_->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &response),
              "GetAllocatableResources"));
    std::vector<ContainerDevices> out;
    for (const auto& d : response.devices()) AppendDevices(d, out);
    return out;
  }

  const std::string& socket_path() const override { return options_.socket_path; }

 private:
  void SetDeadline(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + options_.timeout);
  }

  Status Check(const grpc::Status& s, const char* method) const {
    return pluginapi::FromGrpcStatus(
        s, std::string(method) + " on " + options_.socket_path + " failed");
  }

  const Options options_;
  const std::unique_ptr<v1::PodResourcesLister::Stub> stub_;
};

}  // namespace

StatusOr<std::unique_ptr<PodResourcesClient>> PodResourcesClient::Connect(Options options) {
  if (options.timeout <= std::chrono::milliseconds::zero()) {
    return InvalidArgumentError("pod-resources client timeout must be positive, got " +
                                std::to_string(options.timeout.count()) + " ms");
  }
  KDM_ASSIGN_OR_RETURN(std::string target, pluginapi::UnixSocketTarget(options.socket_path));
  struct stat st;
  if (::stat(options.socket_path.c_str(), &st) != 0) {
    return NotFoundError("pod-resources socket " + options.socket_path + " does not exist");
  }
  if (!S_ISSOCK(st.st_mode)) {
    return FailedPreconditionError("pod-resources socket " + options.socket_path +
                                   " is not a socket");
  }
  return std::unique_ptr<PodResourcesClient>(
      std::make_unique<PodResourcesClientImpl>(std::move(options), target));
}

}  // namespace kdm::devicemanager
