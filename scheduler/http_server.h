// ExtenderServer: the extender's HTTP(S) surface (docs/extender.md, "HTTP"),
// routes on kdm's one HTTP server (kdm/http/server.h, which owns the
// connection policy: limits, timeouts, keep-alive, the bound on connections):
//   POST /filter, POST /prioritize  -> Extender (JSON in, JSON out)
//   POST /bind                      -> Extender::Bind (the bindVerb)
//   GET /healthz, GET /livez        -> 200 "ok" while the process serves
//                                      (liveness: no cache is looked at)
//   GET /readyz                     -> 200 "ok" once not_ready() says ""; else
//                                      503 with its one-line reason (text)
//   GET /metrics                    -> Prometheus text
// Anything else is 404 (unknown path) or 405 (wrong method), with a JSON
// {"Error": ...}. A request the server refuses on its own (a body above
// max_body_bytes, a header above 8 KiB, one that is not HTTP) gets 400 with
// a JSON {"Error": ...} naming the limit, and the connection is closed. A
// body past max_total_body_bytes (all bodies in flight together) or a
// filter/prioritize finding max_queued requests waiting gets 503 with
// "Retry-After: 1" and a JSON {"Error": ...}, counted in
// kdm_extender_busy_total{reason}.
//
// Threads: `io_threads` owned threads read and write the connections and
// answer /healthz and /metrics; POST /filter and /prioritize run on
// `threads` worker threads (and so does /bind), so scoring never holds
// /healthz. Stop() tells
// the extender to stop scoring (Extender::Stop), then closes the listener
// and every connection and joins the threads.
//
// Thread-safety: port() and Stop() from any thread.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(auto server, ExtenderServer::Start({.listen = "127.0.0.1:8888",
//                                                            .extender = &extender}));
#ifndef KDM_SCHEDULER_HTTP_SERVER_H_
#define KDM_SCHEDULER_HTTP_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "kdm/base/status.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/metrics.h"

namespace kdm::scheduler {

class ExtenderServer {
 public:
  struct Options {
    // HOST:PORT as http::ParseListenAddress reads it: "127.0.0.1:8888",
    // "[::1]:8888" or ":8888" (every address); port 0 picks one.
    std::string listen = "127.0.0.1:0";
    // PEM text; both set: HTTPS, neither: HTTP.
    std::string tls_cert_pem;
    std::string tls_key_pem;
    // Workers running filter and prioritize; requests that may wait for one.
    int threads = 2;
    size_t max_queued = 16;
    int io_threads = 2;
    uint64_t max_body_bytes = 128ull << 20;
    // All request bodies in flight together; 0: unbounded. At least
    // max_body_bytes.
    uint64_t max_total_body_bytes = 192ull << 20;
    // Bounds each request's read (idle keep-alive time included) and each
    // answer's write.
    std::chrono::milliseconds io_timeout{30'000};
    // Connections open at once; past it the one idle longest is closed.
    size_t max_connections = 64;
    // Not owned; must outlive the server.
    Extender* extender = nullptr;
    ExtenderMetrics* metrics = nullptr;
    // Why the extender is not ready yet (e.g. "node cache not synced"), ""
    // once it is; called on an io thread for each GET /readyz, so it must
    // not block. Unset: always ready.
    std::function<std::string()> not_ready;
  };

  // Binds and starts serving. INVALID_ARGUMENT for a bad address (naming
  // --listen), PEM or option; UNAVAILABLE when the address cannot be bound
  // (names it).
  static StatusOr<std::unique_ptr<ExtenderServer>> Start(Options options);

  virtual ~ExtenderServer() = default;
  virtual uint16_t port() const = 0;
  // Idempotent.
  virtual void Stop() = 0;
};

// Keeps freed memory of large requests in the process's heap instead of
// returning it to the kernel (glibc's mmap and trim thresholds raised to
// 1 GiB), so that the next 40 MB body or answer reuses pages already mapped:
// on virtual machines a fresh page costs far more than the copy into it
// (docs/extender.md, "Speed"). Process-wide; call once at start.
void KeepLargeAllocationsMapped();

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_HTTP_SERVER_H_
