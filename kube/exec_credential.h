// kube::ExecCredentialProvider: the bearer token of a kubeconfig user's
// `exec` credential plugin (client.authentication.k8s.io/v1 or v1beta1, as
// EKS, GKE and AKS write them), run as kubectl runs it and cached until the
// token's expirationTimestamp.
//
// - The command: an absolute path; a relative one with a '/' is against the
//   kubeconfig's directory; a bare name is looked up in PATH. Not found: the
//   error carries the user's installHint.
// - Its environment: kdm's own, plus the config's `env`, plus
//   KUBERNETES_EXEC_INFO (the ExecCredential input: spec.interactive false,
//   spec.cluster when provideClusterInfo). stdin is /dev/null; stderr is
//   kdm's stderr; it runs in its own process group.
// - Bounded: `timeout` (30 s), after which the whole process group is
//   killed, and `max_output_bytes` (1 MiB) of stdout, past which the same.
// - Its stdout must be one ExecCredential of the config's apiVersion with
//   status.token and optionally status.expirationTimestamp (RFC 3339); a
//   client certificate in status is refused by name.
// - Cached: Token() runs the plugin only when no token is cached or the
//   cached one has expired (on the clock's WallNow()); Invalidate() (after
//   a 401) drops it.
//
// Errors are one line naming the user and the kubeconfig field, e.g.
//   exec plugin of user "eks" (kubeconfig /x: users[0].user.exec): exited with status 1
//
// Thread-safety: Token() and Invalidate() may be called from any thread;
// one run at a time (concurrent callers wait for it and share its token).
//
// Example:
//   auto provider = kube::ExecCredentialProvider::Create({.config = *config.exec});
//   KDM_ASSIGN_OR_RETURN(std::string token, provider->Token());
#ifndef KDM_KUBE_EXEC_CREDENTIAL_H_
#define KDM_KUBE_EXEC_CREDENTIAL_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "kdm/base/clock.h"
#include "kdm/base/status.h"
#include "kdm/kube/kubeconfig.h"

namespace kdm::kube {

class ExecCredentialProvider {
 public:
  struct Options {
    ExecConfig config;
    std::chrono::milliseconds timeout{30'000};
    uint64_t max_output_bytes = 1 << 20;
    // WallNow() decides expiry. Null: the real clock.
    std::shared_ptr<kdm::Clock> clock;
  };

  static std::unique_ptr<ExecCredentialProvider> Create(Options options);
  virtual ~ExecCredentialProvider() = default;

  // The cached token, or the plugin's new one. Errors: NOT_FOUND (command
  // not found, with the install hint), DEADLINE_EXCEEDED (killed after
  // `timeout`), UNAUTHENTICATED for everything else the plugin did wrong
  // (exit status, garbage, wrong apiVersion or kind, no token, too much
  // output); each names the user.
  virtual StatusOr<std::string> Token() = 0;

  // Drops `token` from the cache (the server refused it); the next Token()
  // runs the plugin again. A token already replaced is left alone.
  virtual void Invalidate(const std::string& token) = 0;

  // How many times the plugin has been started.
  virtual int runs() const = 0;
};

// An RFC 3339 time ("2026-11-28T02:00:00Z", "...T02:00:00.5+01:00") as
// seconds since the epoch; nullopt when it is not one.
std::optional<int64_t> ParseRfc3339(std::string_view text);

}  // namespace kdm::kube

#endif  // KDM_KUBE_EXEC_CREDENTIAL_H_
