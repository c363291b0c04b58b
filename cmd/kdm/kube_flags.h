// The flags that say how a kdm command reaches the kube-apiserver, in one
// place for every command that needs one (`kdm publish`, `kdm kubelet
// --publish`, `kdm extender`):
//   --kubeconfig FILE   a kubeconfig (its current context)
//   --in-cluster        the pod's service account (token and CA) and the
//                       KUBERNETES_SERVICE_HOST/PORT environment
// See docs/kube.md for what is read from each.
//
// Example:
//   KubeClientFlags kube_flags;
//   AddKubeClientFlags(cmd, &kube_flags);
//   ...
//   if (Status s = CheckKubeClientFlags(kube_flags, /*required=*/true); !s.ok()) -> usage (2)
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
  bool in_cluster = false;

  bool given() const { return !kubeconfig.empty() || in_cluster; }
};

// Adds --kubeconfig and --in-cluster to `cmd`, stored in `flags` (which must
// outlive the parse).
void AddKubeClientFlags(CLI::App* cmd, KubeClientFlags* flags);

// A usage error (INVALID_ARGUMENT, the caller exits 2) for both flags
// given, or, when `required`, for neither.
Status CheckKubeClientFlags(const KubeClientFlags& flags, bool required);

// The client the flags describe. REQUIRES: CheckKubeClientFlags passed with
// one of them given. Errors (the caller exits 1) are one line naming the
// flag and, for a kubeconfig, the file and field:
//   "--kubeconfig: kubeconfig /x: users[0].user.token-file: ..."
//   "--in-cluster: KUBERNETES_SERVICE_HOST is not set (not in a pod?)"
StatusOr<std::unique_ptr<kube::Client>> MakeKubeClient(const KubeClientFlags& flags);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_KUBE_FLAGS_H_
