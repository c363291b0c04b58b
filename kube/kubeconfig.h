// kube::ClientConfig: where the kube-apiserver is and how kdm proves who it
// is, read from a kubeconfig file (kubectl's format: the current context's
// cluster and user) or from a pod's in-cluster environment.
//
// Every byte a client needs is read here, once, except the bearer token of a
// token file (`tokenFile`, or the in-cluster service-account token), which the
// client reads again before every request because the kubelet rotates it.
// Relative file names in a kubeconfig are resolved against the kubeconfig's
// own directory, as kubectl does. See docs/kube.md.
//
// Errors name the file and the field, e.g.
//   kubeconfig /x: users[0].user.client-key-data: not base64
//
// Thread-safety: plain values and free functions; safe from any thread.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(kube::ClientConfig config, kube::LoadKubeconfig(path));
//   KDM_ASSIGN_OR_RETURN(auto client, kube::Client::Create({.config = config}));
#ifndef KDM_KUBE_KUBECONFIG_H_
#define KDM_KUBE_KUBECONFIG_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::kube {

// The most a kubeconfig, a PEM file or a token file may hold.
inline constexpr uint64_t kMaxKubeconfigBytes = 4 << 20;
inline constexpr uint64_t kMaxCredentialFileBytes = 1 << 20;

// PEM text and where it came from ("kubeconfig /x: users[0].user.client-key-data"
// or a file name), so that a later TLS error can name its origin.
struct Pem {
  std::string text;
  std::string origin;
  bool empty() const { return text.empty(); }
};

struct ClientConfig {
  // What the config was read from, for messages: "kubeconfig /x" or "in-cluster".
  std::string source;
  // The server: https only. host is a name, an IPv4 address or an IPv6
  // address without brackets; base_path is "" or a prefix such as "/k8s/c1".
  std::string host;
  uint16_t port = 443;
  std::string base_path;
  // TLS. An empty ca means the system's trusted roots.
  Pem ca;
  bool insecure_skip_tls_verify = false;
  Pem client_certificate;
  Pem client_key;
  // Credentials: a fixed token, or a file read again before every request
  // (token_file wins when both are set, as kubectl's tokenFile does not).
  std::string token;
  std::string token_file;

  // "https://host:port" plus base_path (IPv6 hosts in brackets).
  std::string ServerUrl() const;
};

// Reads `path` through `env` (capped at kMaxKubeconfigBytes).
// Errors: NOT_FOUND / PERMISSION_DENIED from reading; INVALID_ARGUMENT naming
// the field for anything wrong inside (no current-context, a context naming a
// cluster that is not there, a server that is not https://host[:port],
// base64 that does not decode, a file that cannot be read, ...).
StatusOr<ClientConfig> LoadKubeconfig(const std::string& path, Env* env = Env::Default());

// The same, on text already read. `path` is used for messages and to resolve
// relative file names (against its directory).
StatusOr<ClientConfig> ParseKubeconfig(std::string_view yaml, const std::string& path,
                                       Env* env = Env::Default());

// kubectl's --context: the context to use instead of current-context.
StatusOr<ClientConfig> ParseKubeconfigContext(std::string_view yaml, const std::string& path,
                                              const std::string& context_name,
                                              Env* env = Env::Default());

struct InClusterOptions {
  // Holds `token` and `ca.crt`.
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  // Looks up KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT; std::getenv
  // when empty. Tests pass their own.
  std::function<std::optional<std::string>(const std::string&)> lookup_env;
  Env* env = Env::Default();
};

// A pod's config: the service's host and port from the environment, the CA
// from `<dir>/ca.crt` (read now), the token file `<dir>/token` (read before
// each request; it must exist now). Errors: FAILED_PRECONDITION when the
// environment variables are missing (not in a pod); INVALID_ARGUMENT for a
// bad port; the file's error for a missing CA or token.
StatusOr<ClientConfig> LoadInClusterConfig(const InClusterOptions& options = {});

// Reads a token file: its content with surrounding whitespace removed.
// Errors: the read's error, or INVALID_ARGUMENT for an empty token.
StatusOr<std::string> ReadTokenFile(const std::string& path, Env* env = Env::Default());

}  // namespace kdm::kube

#endif  // KDM_KUBE_KUBECONFIG_H_
