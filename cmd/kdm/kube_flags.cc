#include "kube_flags.h"

#include <spdlog/spdlog.h>

#include <utility>

#include "cli_common.h"
#include "kdm/base/log_value.h"
#include "kdm/kube/kubeconfig.h"

namespace kdm::cli {

void AddKubeClientFlags(CLI::App* cmd, KubeClientFlags* flags) {
  cmd->add_option("--kubeconfig", flags->kubeconfig,
                  "Reach the API server with this kubeconfig alone (default: KUBECONFIG, else "
                  "~/.kube/config, else in-cluster in a pod)")
      ->type_name("FILE");
  cmd->add_option("--context", flags->context,
                  "The kubeconfig context to use (default: its current-context)")
      ->type_name("NAME");
  cmd->add_flag("--in-cluster", flags->in_cluster,
                "Reach the API server as a pod (service account token and CA, "
                "KUBERNETES_SERVICE_HOST/PORT)");
}

Status CheckKubeClientFlags(const KubeClientFlags& flags) {
  if (!flags.kubeconfig.empty() && flags.in_cluster) {
    return InvalidArgumentError("--kubeconfig and --in-cluster: give one, not both");
  }
  if (!flags.context.empty() && flags.in_cluster) {
    return InvalidArgumentError(
        "--context and --in-cluster: a context is in a kubeconfig, --in-cluster has none");
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<kube::Client>> MakeKubeClient(const KubeClientFlags& flags) {
  KDM_RETURN_IF_ERROR(CheckKubeClientFlags(flags));
  const std::string prefix =
      flags.in_cluster ? "--in-cluster" : (flags.kubeconfig.empty() ? "" : "--kubeconfig");
  auto named = [&prefix](const Status& s) { return prefix.empty() ? s : s.WithPrefix(prefix); };
  kube::LoadingRules rules;
  StatusOr<std::string> path = AbsolutePathFlag("--kubeconfig", flags.kubeconfig);
  if (!path.ok()) return path.status();
  rules.kubeconfig = *path;
  rules.context = flags.context;
  rules.in_cluster = flags.in_cluster;
  StatusOr<kube::ClientConfig> config = kube::LoadClientConfig(rules);
  if (!config.ok()) return named(config.status());
  spdlog::info("event=kubeconfig_loaded source={} config={} context={} server={}", config->found_by,
               QuoteLogValue(config->source, kMaxLogValueBytes),
               QuoteLogValue(config->context, kMaxLogValueBytes),
               QuoteLogValue(config->ServerUrl(), kMaxLogValueBytes));
  kube::Client::Options options;
  options.config = *std::move(config);
  StatusOr<std::unique_ptr<kube::Client>> client = kube::Client::Create(std::move(options));
  if (!client.ok()) return named(client.status());
  return client;
}

}  // namespace kdm::cli
