// kube::Client: HTTPS requests to the kube-apiserver (GET, merge PATCH, a
// create POST, and a streaming GET for watches), with the credentials of a
// ClientConfig.
//
// - TLS verification is on unless the config says insecure-skip-tls-verify:
//   the server's certificate must chain to the config's CA (or the system's
//   roots when the config has none) and name the host (DNS name or IP
//   address). SNI carries the host name (never an IP address, RFC 6066).
//   A client certificate and key are presented when the config has them.
// - Every call has a deadline, which bounds everything: name lookup, connect,
//   handshake, the answer, and the waits between retries.
// - Retries: 409 (not for Post), 429, 5xx and connection failures are tried
//   again with exponential back-off and jitter; a Retry-After header
//   (seconds) replaces the back-off for that wait. A wait that would end
//   past the deadline is not started: the last failure is returned instead.
// - Errors are one line naming the method, the path and the server's
//   message: 401 -> UNAUTHENTICATED, 403 -> PERMISSION_DENIED, 404 ->
//   NOT_FOUND, 409 -> ABORTED, 410 -> FAILED_PRECONDITION ("410 Gone"),
//   other 4xx -> INVALID_ARGUMENT, 429/5xx/network -> UNAVAILABLE, the
//   deadline -> DEADLINE_EXCEEDED. A certificate that fails verification is
//   UNAVAILABLE and is not retried.
// - Only what is used is read: a PATCH's 2xx body not at all, an error
//   body up to max_error_body_bytes (its Status message is parsed only
//   when it came whole), a 2xx body up to max_body_bytes, a watch line up to
//   max_line_bytes; the connection is closed on the rest.
// - One connection per request (Connection: close): kdm's traffic is a PATCH
//   a second at most and long-lived watches.
//
// The HTTPS transport (connection, TLS, deadline, streaming) is
// kdm::http::HttpsClient; this class adds the Kubernetes part.
//
// Thread-safety: every method may be called from any thread, concurrently.
// The header names no Boost or OpenSSL type.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto client, kube::Client::Create({.config = config}));
//   KDM_RETURN_IF_ERROR(client->MergePatch("/api/v1/nodes/n1", body, 10s));
#ifndef KDM_KUBE_CLIENT_H_
#define KDM_KUBE_CLIENT_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "kdm/base/clock.h"
#include "kdm/base/status.h"
#include "kdm/http/client.h"
#include "kdm/kube/kubeconfig.h"

namespace kdm::kube {

// Lets another thread end a call in flight (a watch, usually) at once; see
// kdm/http/client.h. Cancel() is sticky. Thread-safe.
using Cancellation = http::Cancellation;

struct RetryPolicy {
  // Most attempts per call, the first included.
  int max_attempts = 8;
  // Back-off before retry n (n = 1, 2, ...): initial * 2^(n-1), at most max,
  // plus up to half of it again as jitter.
  std::chrono::milliseconds initial_backoff{100};
  std::chrono::milliseconds max_backoff{5000};
  // A Retry-After longer than this is cut to it.
  std::chrono::milliseconds max_retry_after{60'000};
};

class Client {
 public:
  struct Options {
    ClientConfig config;
    RetryPolicy retry;
    // The biggest answer body accepted (a LIST of 5,000 nodes is ~50 MB).
    uint64_t max_body_bytes = 256ull << 20;
    // The longest watch event (one line of a watch) accepted: 8 MiB, over 5
    // times the biggest object etcd stores by default (1.5 MiB).
    uint64_t max_line_bytes = 8ull << 20;
    // How much of an error answer's body is read (for the server's message:
    // a Status object; a longer body is quoted, not parsed).
    uint64_t max_error_body_bytes = 4096;
    std::string user_agent = "kdm";
    // The time seam: a call's deadline is counted and the waits between
    // retries are slept on it (a FakeClock's Advance() ends them); the
    // network I/O of each attempt runs in real time, bounded by what is left
    // of the deadline. Null is taken as NewRealClock() too.
    std::shared_ptr<kdm::Clock> clock = NewRealClock();
    // Seed of the jitter; 0 picks one at random.
    uint64_t jitter_seed = 0;
  };

  struct Response {
    int status = 0;
    std::string body;
    // A non-2xx body longer than max_error_body_bytes: `body` is its start.
    bool body_truncated = false;
  };

  // Checks the config (PEM certificates and key parse, the key matches the
  // certificate). Errors: INVALID_ARGUMENT naming the PEM's origin.
  static StatusOr<std::unique_ptr<Client>> Create(Options options);

  virtual ~Client() = default;

  // GET `path` (with any query, e.g. "/api/v1/nodes?limit=500"): the body of
  // a 2xx answer, or the error described above.
  virtual StatusOr<std::string> Get(std::string_view path, std::chrono::milliseconds timeout,
                                    Cancellation* cancel = nullptr) = 0;

  // PATCH `path` with `json` as application/merge-patch+json: OK for a 2xx
  // answer, whose body (the patched object, unused) is not read, or the
  // error described above.
  virtual Status MergePatch(std::string_view path, std::string_view json,
                            std::chrono::milliseconds timeout, Cancellation* cancel = nullptr) = 0;

  // POST `path` with `json` as application/json to create an object (a
  // pods/binding): OK for a 2xx answer, whose body (the created object or a
  // Status, unused) is not read, or the error described above. Retried as
  // above except on 409: a create answered 409 Conflict (it exists, or the
  // pod is bound already) is returned at once as ABORTED, never posted
  // again. A 409 that answers a retry (an earlier attempt was answered 5xx
  // or lost after it was sent, so it may have landed) says so in its
  // message: "... (attempt N: an earlier attempt may have been applied)".
  virtual Status Post(std::string_view path, std::string_view json,
                      std::chrono::milliseconds timeout, Cancellation* cancel = nullptr) = 0;

  // The one request, with retries, answering any HTTP status: GET/PATCH and
  // error mapping for callers that handle statuses themselves (410 on LIST).
  virtual StatusOr<Response> Send(std::string_view method, std::string_view path,
                                  std::string_view json_body, std::chrono::milliseconds timeout,
                                  Cancellation* cancel = nullptr) = 0;

  // A streaming GET (a watch): connects within `connect_timeout` (with
  // retries as above), then calls `on_line` with each line of a 2xx body as
  // it arrives (without its '\n'), until the server ends the body (OK), no
  // byte arrives for `idle_timeout` (DEADLINE_EXCEEDED), `on_line` returns
  // false (OK), `cancel` fires (CANCELLED) or the connection fails
  // (UNAVAILABLE). A non-2xx answer is returned as the error described above
  // without calling `on_line`. A line longer than max_body_bytes is an error.
  virtual Status Stream(std::string_view path, std::chrono::milliseconds connect_timeout,
                        std::chrono::milliseconds idle_timeout,
                        const std::function<bool(std::string_view line)>& on_line,
                        Cancellation* cancel = nullptr) = 0;

  // The error a non-2xx answer becomes (exposed for callers of Send).
  static Status StatusForResponse(std::string_view method, std::string_view path,
                                  const Response& response);
};

}  // namespace kdm::kube

#endif  // KDM_KUBE_CLIENT_H_
