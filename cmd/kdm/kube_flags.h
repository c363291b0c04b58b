// The flags that say how a kdm command reaches the kube-apiserver, in one
// place for every command that needs one (`kdm publish`, `kdm kubelet
// --publish`, `kdm extender`):
//   --kubeconfig FILE   this kubeconfig alone
//   --context NAME      the kubeconfig context to use instead of current-context
//   --in-cluster        the pod's service account (token and CA) and the
//                       KUBERNETES_SERVICE_HOST/PORT environment
// Without --kubeconfig or --in-cluster, kubectl's loading rules pick the
// config: KUBECONFIG (a ':'-separated list, merged), else ~/.kube/config,
// else in-cluster when running in a pod (kube::LoadClientConfig). Which one
// was used is logged once (event=kubeconfig_loaded). See docs/kube.md.
//
// Example:
//   KubeClientFlags kube_flags;
//   AddKubeClientFlags(cmd, &kube_flags);
//   ...
//   if (Status s = CheckKubeClientFlags(kube_flags); !s.ok()) -> usage (2)
//   StatusOr<std::unique_ptr<kube::Client>> client = MakeKubeClient(kube_flags);  -> runtime (1)
#ifndef KDM_CMD_KDM_KUBE_FLAGS_H_
#define KDM_CMD_KDM_KUBE_FLAGS_H_

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "kdm/base/status.h"
#include "kdm/kube/client.h"

namespace kdm::cli {

struct KubeClientFlags {
  std::string kubeconfig;
  std::string context;
  bool in_cluster = false;

  // One of the flags was given (a command whose API server client is
  // optional, `kdm extender`, makes one only then).
  bool given() const { return !kubeconfig.empty() || in_cluster || !context.empty(); }
};

// Adds --kubeconfig, --context and --in-cluster to `cmd`, stored in `flags`
// (which must outlive the parse).
void AddKubeClientFlags(CLI::App* cmd, KubeClientFlags* flags);

// A usage error (INVALID_ARGUMENT, the caller exits 2) for --in-cluster
// with --kubeconfig or --context, or an empty --context.
Status CheckKubeClientFlags(const KubeClientFlags& flags);

// The client the flags and the loading rules describe; logs
// event=kubeconfig_loaded once. Errors (the caller exits 1) are one line
// naming the flag or variable and, for a kubeconfig, the file and field:
//   "--kubeconfig: kubeconfig /x: users[0].user.auth-provider: not supported by kdm"
//   "KUBECONFIG=\"/a:/b\": none of the files it lists exists"
//   "no kubeconfig: KUBECONFIG is not set, /root/.kube/config does not exist, ..."
StatusOr<std::unique_ptr<kube::Client>> MakeKubeClient(const KubeClientFlags& flags);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_KUBE_FLAGS_H_
