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
#include <utility>
#include <vector>

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

// A cluster's proxy-url, http:// (HTTP CONNECT) or socks5://: every
// connection to the server is a tunnel through it.
struct ProxyConfig {
  std::string url;  // as written, for messages
  std::string host;
  uint16_t port = 0;
  bool empty() const { return host.empty(); }
};

// A user's `exec` credential plugin (client.authentication.k8s.io/v1 or
// v1beta1), run by kube/exec_credential.h for a token.
struct ExecConfig {
  // For messages: `user "u1" (kubeconfig /x: users[0].user.exec)`.
  std::string who;
  // The command as written, and the kubeconfig's directory: a command with
  // a '/' that is not absolute is resolved against it, one without a '/'
  // is looked up in PATH (as kubectl does).
  std::string command;
  std::string kubeconfig_dir;
  std::vector<std::string> args;
  std::vector<std::pair<std::string, std::string>> env;
  std::string api_version;
  std::string install_hint;
  // KUBERNETES_EXEC_INFO, the ExecCredential the plugin is given
  // (spec.interactive false, spec.cluster when provideClusterInfo).
  std::string exec_info_json;
};

struct ClientConfig {
  // What the config was read from, for messages: "kubeconfig /x",
  // "kubeconfig /a:/b" (a merged KUBECONFIG list) or "in-cluster".
  std::string source;
  // How it was found (kubeconfig_loaded's source=): "--kubeconfig",
  // "KUBECONFIG", "home" (~/.kube/config), "in-cluster"; and the context
  // used ("" in-cluster).
  std::string found_by;
  std::string context;
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
  // The name the server's certificate is verified against and sent as SNI
  // (tls-server-name); empty: the server URL's host.
  std::string tls_server_name;
  // proxy-url (http:// or socks5://); empty: a direct connection.
  ProxyConfig proxy;
  // The user's exec plugin, when it has one (token and tokenFile are then
  // empty: the plugin's token is used).
  std::optional<ExecConfig> exec;

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

// Looks up an environment variable; std::getenv when empty.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

struct InClusterOptions {
  // Holds `token` and `ca.crt`.
  std::string service_account_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
  // Looks up KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT; std::getenv
  // when empty. Tests pass their own.
  EnvLookup lookup_env;
  Env* env = Env::Default();
};

// A pod's config: the service's host and port from the environment, the CA
// from `<dir>/ca.crt` (read now), the token file `<dir>/token` (read before
// each request; it must exist now). Errors: FAILED_PRECONDITION when the
// environment variables are missing (not in a pod); INVALID_ARGUMENT for a
// bad port; the file's error for a missing CA or token.
StatusOr<ClientConfig> LoadInClusterConfig(const InClusterOptions& options = {});

// client-go's loading rules (kubectl's): which kubeconfig, or the pod's
// in-cluster config, a command uses.
struct LoadingRules {
  // --kubeconfig: this file alone (absolute, or relative to the working
  // directory).
  std::string kubeconfig;
  // --context: the context to use instead of current-context.
  std::string context;
  // --in-cluster: the pod's config, nothing else.
  bool in_cluster = false;
  // KUBECONFIG, HOME, KUBERNETES_SERVICE_HOST/PORT; std::getenv when empty.
  EnvLookup lookup_env;
  // The home directory; empty: lookup_env("HOME").
  std::string home;
  InClusterOptions in_cluster_options;
  Env* env = Env::Default();
};

// In order: rules.kubeconfig alone; else KUBECONFIG, a ':'-separated list
// merged as client-go merges it (for clusters, users and contexts the first
// file that names an entry wins; current-context from the first file that
// sets it; relative names in each file against that file's directory;
// files that do not exist are skipped, but not all of them); else
// $HOME/.kube/config if it exists; else in-cluster when running in a pod
// (KUBERNETES_SERVICE_HOST set and the service-account token present).
// Errors: INVALID_ARGUMENT naming the file and field (as LoadKubeconfig), or
// naming KUBECONFIG when none of its files exist; NOT_FOUND when no source
// is there at all (the message lists what was tried); --context with
// --in-cluster is INVALID_ARGUMENT.
StatusOr<ClientConfig> LoadClientConfig(const LoadingRules& rules);

// Reads a token file: its content with surrounding whitespace removed.
// Errors: the read's error, or INVALID_ARGUMENT for an empty token.
StatusOr<std::string> ReadTokenFile(const std::string& path, Env* env = Env::Default());

}  // namespace kdm::kube

#endif  // KDM_KUBE_KUBECONFIG_H_
