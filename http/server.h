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
// - At most max_connections are open at once. A new connection beyond them
//   closes the one that has waited longest for its request (never one whose
//   request is being answered), so held connections cannot lock clients
//   out; if every connection is being answered, the new one is closed.
// - HTTPS when a certificate and key are given (TLS 1.2 or later).
//
// Handlers run on the server's threads (`threads` of them, owned), one
// request at a time per connection; a handler must not block for long.
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
// parse): `status` is 400, 413 or 431, `message` one line saying why.
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
  };

  // Binds and starts serving with `handler`. Errors: INVALID_ARGUMENT for a
  // bad address (ParseListenAddress's message), option or PEM ("TLS
  // certificate: ...", "TLS key: ..."); UNAVAILABLE naming the address when
  // its host does not resolve or it cannot be bound.
  static StatusOr<std::unique_ptr<Server>> Start(Options options, Handler handler);

  // Stops if running.
  virtual ~Server() = default;
  // The bound port (the real one when 0 was asked).
  virtual uint16_t port() const = 0;
  // Closes the listener and every connection and joins the threads; a
  // handler that is running finishes first. Idempotent. Not from a handler.
  virtual void Stop() = 0;
};

}  // namespace kdm::http

#endif  // KDM_HTTP_SERVER_H_
