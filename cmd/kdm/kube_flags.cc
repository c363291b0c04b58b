#include "kube_flags.h"

#include <utility>

#include "cli_common.h"
#include "kdm/kube/kubeconfig.h"

namespace kdm::cli {

void AddKubeClientFlags(CLI::App* cmd, KubeClientFlags* flags) {
  cmd->add_option("--kubeconfig", flags->kubeconfig,
                  "Reach the API server with this kubeconfig (its current context)")
      ->type_name("FILE");
  cmd->add_flag("--in-cluster", flags->in_cluster,
                "Reach the API server as a pod (service account token and CA, "
                "KUBERNETES_SERVICE_HOST/PORT)");
}

Status CheckKubeClientFlags(const KubeClientFlags& flags, bool required) {
  if (!flags.kubeconfig.empty() && flags.in_cluster) {
    return InvalidArgumentError("--kubeconfig and --in-cluster: give one, not both");
  }
  if (required && !flags.given()) {
    return InvalidArgumentError("one of --kubeconfig FILE or --in-cluster is required");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<kube::Client>> MakeKubeClient(const KubeClientFlags& flags) {
  KDM_RETURN_IF_ERROR(CheckKubeClientFlags(flags, /*required=*/true));
  kube::Client::Options options;
  if (flags.in_cluster) {
    StatusOr<kube::ClientConfig> config = kube::LoadInClusterConfig();
    if (!config.ok()) return config.status().WithPrefix("--in-cluster");
    options.config = *std::move(config);
  } else {
    StatusOr<std::string> path = AbsolutePathFlag("--kubeconfig", flags.kubeconfig);
    if (!path.ok()) return path.status();
    StatusOr<kube::ClientConfig> config = kube::LoadKubeconfig(*path);
    if (!config.ok()) return config.status().WithPrefix("--kubeconfig");
    options.config = *std::move(config);
  }
  StatusOr<std::unique_ptr<kube::Client>> client = kube::Client::Create(std::move(options));
  if (!client.ok()) {
    return client.status().WithPrefix(flags.in_cluster ? "--in-cluster" : "--kubeconfig");
  }
  return client;
}

}  // namespace kdm::cli
