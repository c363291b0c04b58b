// MetricsServer: GET /metrics and GET /healthz on kdm's one HTTP server
// (kdm/http/server.h), one owned thread. The server's connection policy
// applies: at most 8 KiB of header (else 431) and 4 KiB of body (else 413),
// a whole request within 10 s of connecting or of the last answer, and at
// most 64 connections, a new one beyond them closing the one that has
// waited longest for its request, so connections that are opened and held
// cannot lock scrapes out.
#include <spdlog/spdlog.h>

#include <memory>
#include <string>

#include "kdm/devicemanager/metrics.h"
#include "kdm/http/metrics.h"
#include "kdm/http/server.h"

namespace kdm::devicemanager {
namespace {

http::Response AnswerScrape(Metrics& metrics, const Manager* manager, const http::Request& req) {
  const std::string_view path = req.path();
  http::Response res;
  if (path != "/metrics" && path != "/healthz") {
    res.status = 404;
    res.body = "not found: try /metrics or /healthz\n";
  } else if (req.method != "GET") {
    res.status = 405;
    res.body = "only GET is allowed\n";
    res.headers = {{"Allow", "GET"}};
  } else if (path == "/healthz") {
    res.body = "ok\n";
  } else {
    res.content_type = http::kExpositionContentType;
    res.body = metrics.Render(manager);
  }
  return res;
}

class MetricsServerImpl final : public MetricsServer {
 public:
  explicit MetricsServerImpl(std::unique_ptr<http::Server> server) : server_(std::move(server)) {}
  ~MetricsServerImpl() override { Stop(); }

  int port() const override { return server_->port(); }
  void Stop() override { server_->Stop(); }

 private:
  const std::unique_ptr<http::Server> server_;
};

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host_port,
                                                              std::shared_ptr<Metrics> metrics,
                                                              const Manager* manager) {
  if (!metrics) return InvalidArgumentError("metrics must not be null");
  http::Server::Options options;
  options.listen = host_port;
  options.listen_name = "metrics address";
  options.threads = 1;
  options.max_header_bytes = 8 * 1024;
  options.max_body_bytes = 4 * 1024;
  options.request_timeout = std::chrono::seconds(10);
  options.write_timeout = std::chrono::seconds(10);
  options.max_connections = 64;
  KDM_ASSIGN_OR_RETURN(
      std::unique_ptr<http::Server> server,
      http::Server::Start(std::move(options), [metrics, manager](http::Request& r) {
        return AnswerScrape(*metrics, manager, r);
      }));
  // The one line saying where metrics are served (its callers log none).
  spdlog::info("event=metrics_serving addr={} port={}", host_port, server->port());
  return std::unique_ptr<MetricsServer>(new MetricsServerImpl(std::move(server)));
}

}  // namespace kdm::devicemanager
