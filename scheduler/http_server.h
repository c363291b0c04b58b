// ExtenderServer: the extender's HTTP(S) surface (docs/extender.md, "HTTP"):
//   POST /filter, POST /prioritize  -> Extender (JSON in, JSON out)
//   GET /healthz                    -> 200 "ok"
//   GET /metrics                    -> Prometheus text
// Anything else is 404 (unknown path) or 405 (wrong method), with a JSON
// {"Error": ...}. A body above max_body_bytes is refused with 400 and the
// connection closed; every read and write has a deadline.
//
// Threads: `threads` owned threads run one Asio loop (connections are served
// concurrently, a request's work runs on the thread that read it); Stop()
// closes the listener and every connection and joins them.
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
#include <memory>
#include <string>

#include "kdm/base/status.h"
#include "kdm/scheduler/extender.h"
#include "kdm/scheduler/metrics.h"

namespace kdm::scheduler {

class ExtenderServer {
 public:
  struct Options {
    // "HOST:PORT", "[V6]:PORT" or ":PORT" (every address); port 0 picks one.
    std::string listen = "127.0.0.1:0";
    // PEM text; both set: HTTPS, neither: HTTP.
    std::string tls_cert_pem;
    std::string tls_key_pem;
    int threads = 2;
    uint64_t max_body_bytes = 256ull << 20;
    // Bounds each request's read and each answer's write.
    std::chrono::milliseconds io_timeout{30'000};
    // Not owned; must outlive the server.
    Extender* extender = nullptr;
    ExtenderMetrics* metrics = nullptr;
  };

  // Binds and starts serving. INVALID_ARGUMENT for a bad address, PEM or
  // option; UNAVAILABLE when the address cannot be bound (names it).
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

// Splits "HOST:PORT" as above. INVALID_ARGUMENT naming the text.
Status ParseListenAddress(const std::string& text, std::string* host, uint16_t* port);

}  // namespace kdm::scheduler

#endif  // KDM_SCHEDULER_HTTP_SERVER_H_
