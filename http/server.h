// kdm::http::Server: the one HTTP/1.1 server of kdm, behind `kdm extender`
// (POST /filter, /prioritize, GET /healthz, /metrics) and the node agent's
// GET /metrics and /healthz. It owns the connection policy, so both behave
// alike toward a bad or hostile client:
//
// - A request's header is at most max_header_bytes (else 431) and its body
//   at most max_body_bytes (else 413); anything that does not parse as
//   HTTP/1.1 gets 400. After such an answer the connection is closed.
// - A whole request must arrive within request_timeout of the connection
//   (TLS handshake included) or of the last answer; a connection that waits
//   longer, idle or sending slowly, is closed. An answer must be written
//   within write_timeout.
// - Keep-alive: the connection stays open after an answer unless the
//   request said "Connection: close" (or was HTTP/1.0 without keep-alive).
// - At most max_connections are open at once, and never more than the fd
//   limit allows: the cap is min(max_connections, RLIMIT_NOFILE's soft limit
//   - the fds open at start - kFdReserve), at least 1, said at start
//   (event=http_connection_cap). A new connection beyond it closes the one
//   that has waited longest for its request (never one whose request is
//   being answered), so held connections cannot lock clients out; if every
//   connection is being answered, the new one is closed.
// - When accept fails for want of fds or memory (EMFILE, ENFILE, ENOBUFS,
//   ENOMEM) the server closes the connection idle longest and stops
//   accepting for a while (10 ms, doubling to 1 s while it lasts), logged
//   with counts (event=http_accept_backoff); it never spins.
// - One budget for every request body in flight (max_total_body_bytes):
//   a body is reserved from its Content-Length before it is read (a chunked
//   one as it grows) and released once its handler has run; a request past
//   the budget gets 503 with "Retry-After: 1" and the connection is closed
//   (what the client still sends is read and dropped for up to
//   request_timeout, so that it sees the answer).
// - Handlers of the requests `offload` picks run on `workers` owned threads
//   (at most max_queued waiting, beyond them 503 with Retry-After); the
//   others on the I/O threads, so a slow handler never holds /healthz.
// - HTTPS when a certificate and key are given (TLS 1.2 or later).
//
// Handlers run on the server's I/O threads (`threads` of them, owned), or
// on its worker threads (above), one request at a time per connection; a
// handler on the I/O threads must not block for long.
//
// Thread-safety: port() and Stop() may be called from any thread.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto server, http::Server::Start(
//       {.listen = "127.0.0.1:0"},
//       [](http::Request& r) { return http::Response{.body = "ok\n"}; }));
//   ... server->port() ...
//   server->Stop();
#ifndef KDM_HTTP_SERVER_H_
#define KDM_HTTP_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::http {

struct Request {
  std::string method;  // "GET", "POST", ...
  std::string target;  // the path with any query: "/metrics?x=1"
  std::string body;
  // The path of target, without the query.
  std::string_view path() const { return std::string_view(target).substr(0, target.find('?')); }
};

struct Response {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  // More header fields, e.g. {"Allow", "GET"}.
  std::vector<std::pair<std::string, std::string>> headers;
};

// Answers one request. Runs on a server thread.
using Handler = std::function<Response(Request& request)>;

// What the server answers on its own (the limits, a request that does not
// parse, the server busy): `status` is 400, 413, 431 or 503, `message` one
// line saying why. The server adds "Retry-After: 1" to a 503.
using RefusalHandler = std::function<Response(int status, const std::string& message)>;

class Server {
 public:
  struct Options {
    // HOST:PORT as ParseListenAddress reads it (listen_address.h).
    std::string listen = "127.0.0.1:0";
    // How errors name the address: "--listen", "metrics address".
    std::string listen_name = "listen address";
    // PEM text; both set: HTTPS, neither: HTTP.
    std::string tls_cert_pem;
    std::string tls_key_pem;
    // Owned threads running the connections. 1..256.
    int threads = 1;
    uint64_t max_header_bytes = 8 * 1024;
    uint64_t max_body_bytes = 4 * 1024;
    std::chrono::milliseconds request_timeout{10'000};
    std::chrono::milliseconds write_timeout{10'000};
    // At least 1.
    size_t max_connections = 64;
    // The Server header field of every answer; empty: none.
    std::string server_header;
    // The answer to a refused request; default: text/plain `message` and "\n".
    RefusalHandler refusal;
    // All request bodies in flight together; 0: no bound but max_body_bytes.
    uint64_t max_total_body_bytes = 0;
    // Spare capacity each body with a Content-Length is read into (a
    // parser's padding), so that a handler can pad it without a copy.
    uint64_t body_padding = 0;
    // Requests whose handler runs on the worker threads (none when unset or
    // workers is 0). Called on an I/O thread with the whole request.
    std::function<bool(const Request&)> offload;
    // Worker threads (0..256) and the requests that may wait for one.
    int workers = 0;
    size_t max_queued = 16;
    // Called once when Stop() begins, before it waits for running handlers:
    // the place to tell long handlers to finish early.
    std::function<void()> on_stop;
    // Called on each 503 the server answers on its own: `reason` is
    // "body_budget" or "queue_full". Any thread.
    std::function<void(std::string_view reason)> on_busy;
  };

  // fds kept free for the rest of the process (log files, API server
  // connections) when the connection cap is derived from the fd limit.
  static constexpr uint64_t kFdReserve = 32;

  // Binds and starts serving with `handler`. Errors: INVALID_ARGUMENT for a
  // bad address (ParseListenAddress's message), option or PEM ("TLS
  // certificate: ...", "TLS key: ..."); UNAVAILABLE naming the address when
  // its host does not resolve or it cannot be bound.
  static StatusOr<std::unique_ptr<Server>> Start(Options options, Handler handler);

  // Stops if running.
  virtual ~Server() = default;
  // The bound port (the real one when 0 was asked).
  virtual uint16_t port() const = 0;
  // Calls on_stop, closes the listener and every connection and joins the
  // threads; a handler that is running finishes first (on_stop is how it
  // learns to finish early); queued ones never run. Idempotent. Not from a
  // handler.
  virtual void Stop() = 0;
};

}  // namespace kdm::http

#endif  // KDM_HTTP_SERVER_H_
