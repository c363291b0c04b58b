// kdm::http::HttpsClient: the HTTPS transport of kdm's API server client
// (kube/client.h keeps the Kubernetes part: paths, credentials, retries,
// error mapping). One call is one connection and one request: name lookup,
// connect, TLS handshake (with verification, SNI and an optional client
// certificate), the request, the answer's header and its body, whole or line
// by line. One deadline bounds all of it; a Cancellation ends it at once.
//
// Thread-safety: RoundTrip may be called from any thread, concurrently.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto client, http::HttpsClient::Create({.host = "10.0.0.1",
//                                                               .port = 6443, ...}));
//   http::RoundTripResult r = client->RoundTrip(request, deadline);
#ifndef KDM_HTTP_CLIENT_H_
#define KDM_HTTP_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/base/sync.h"

namespace kdm::http {

// Lets another thread end a call in flight (a watch, usually) at once.
// Cancel() is sticky: every later call given this object fails at once
// with CANCELLED. Thread-safe.
class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  void Cancel();
  bool cancelled() const;

  // For a client: registers what Cancel() runs while a call is in flight
  // (nullptr when it ends). Returns false (and registers nothing) when
  // already cancelled.
  bool SetCanceller(std::function<void()> canceller);

 private:
  mutable Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> canceller_ ABSL_GUARDED_BY(mu_);
};

// PEM text and where it came from (a file name, a kubeconfig field), so that
// an error can name its origin.
struct PemSource {
  std::string text;
  std::string origin;
};

struct ClientRequest {
  std::string method;
  std::string target;  // path and query
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  // Only the status and headers of a 2xx answer are read; its body is left
  // unread (the connection is closed).
  bool discard_body = false;
};

struct ClientResponse {
  int status = 0;
  std::string body;         // empty when streamed or discarded
  std::string retry_after;  // the Retry-After header's value, if any
  // A non-2xx body longer than Options::max_error_body_bytes: `body` is its
  // start, the rest was not read.
  bool body_truncated = false;
};

// What one round trip ended with: an answer, or an error and whether trying
// again could help.
struct RoundTripResult {
  std::optional<ClientResponse> response;
  Status error;
  bool retryable = false;
  // A 2xx body was handed to on_line to its end or until on_line, the idle
  // bound or the connection ended it (`error` says which): the call is over.
  bool streamed = false;
};

class HttpsClient {
 public:
  struct Options {
    // The server: a DNS name, an IPv4 address or an IPv6 address without
    // brackets.
    std::string host;
    uint16_t port = 443;
    // How errors name the server, e.g. "https://10.0.0.1:6443".
    std::string server_name;
    // The name the server's certificate is verified against and sent as
    // SNI instead of `host` (a kubeconfig's tls-server-name); empty: host.
    std::string tls_server_name;
    // A proxy: a tunnel through it, HTTP CONNECT or SOCKS5 as proxy_url's
    // scheme says (it also names it in errors). Empty proxy_host: direct.
    std::string proxy_host;
    uint16_t proxy_port = 0;
    std::string proxy_url;
    // Trusted roots; empty text: the system's.
    PemSource ca;
    bool insecure_skip_tls_verify = false;
    // Presented when set (both or neither).
    PemSource client_certificate;
    PemSource client_key;
    // The biggest 2xx answer body accepted (RESOURCE_EXHAUSTED past it).
    uint64_t max_body_bytes = 256ull << 20;
    // The longest line of a streamed body (one watch event) accepted
    // (RESOURCE_EXHAUSTED past it): 8 MiB, over 5 times the biggest object
    // etcd stores by default (1.5 MiB).
    uint64_t max_line_bytes = 8ull << 20;
    // How much of a non-2xx body is kept (for its message); the rest is
    // not read.
    uint64_t max_error_body_bytes = 4096;
  };

  // Builds the TLS context. Errors: INVALID_ARGUMENT naming the PEM's origin
  // (not a certificate, not a key, a key that does not match).
  static StatusOr<std::unique_ptr<HttpsClient>> Create(Options options);

  virtual ~HttpsClient() = default;

  // Sends `request` (Host, Content-Length added) on a new connection and
  // reads the answer with a ResponseReader (response_reader.h: what is kept
  // of a body, and the limits). With
  // `on_line`, a 2xx body is handed over line by line (without '\n' or '\r';
  // empty lines skipped) as it arrives, and no byte may take longer than
  // `idle_timeout` (DEADLINE_EXCEEDED); on_line returning false ends the
  // call. Errors: DEADLINE_EXCEEDED past `deadline`, CANCELLED, UNAVAILABLE
  // naming the server and the step (retryable, except a certificate that
  // fails verification), RESOURCE_EXHAUSTED for a body or a line over its limit.
  virtual RoundTripResult RoundTrip(
      const ClientRequest& request, std::chrono::steady_clock::time_point deadline,
      Cancellation* cancel = nullptr,
      const std::function<bool(std::string_view line)>* on_line = nullptr,
      std::chrono::milliseconds idle_timeout = std::chrono::milliseconds(0)) = 0;
};

// The reason phrase of an HTTP status ("Not Found"); empty when unknown.
std::string ReasonPhrase(int status);

}  // namespace kdm::http

#endif  // KDM_HTTP_CLIENT_H_
