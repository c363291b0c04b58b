#include "kdm/scheduler/http_server.h"

#include <malloc.h>

#include <chrono>
#include <string_view>

#include "kdm/http/server.h"
#include "kdm/scheduler/extender_json.h"

namespace kdm::scheduler {
namespace {

HttpAnswer RouteExtenderRequest(const ExtenderServer::Options& o, http::Request& req,
                                std::string* verb) {
  const std::string_view path = req.path();
  const bool post = req.method == "POST";
  const bool get = req.method == "GET";
  if (path == "/filter" || path == "/prioritize") {
    *verb = std::string(path.substr(1));
    if (!post) return {405, EncodeError(std::string(path) + " takes POST")};
    PadBody(&req.body);
    return path == "/filter" ? o.extender->Filter(req.body) : o.extender->Prioritize(req.body);
  }
  if (path == "/bind") {
    *verb = "bind";
    if (!post) return {405, EncodeError("/bind takes POST")};
    return o.extender->Bind(req.body);
  }
  if (path == "/healthz" || path == "/livez") {
    // Both say the process serves; neither looks at the caches.
    *verb = std::string(path.substr(1));
    if (!get) return {405, EncodeError(std::string(path) + " takes GET")};
    return {200, "ok"};
  }
  if (path == "/readyz") {
    *verb = "readyz";
    if (!get) return {405, EncodeError("/readyz takes GET")};
    std::string not_ready = o.not_ready ? o.not_ready() : std::string();
    if (!not_ready.empty()) return {503, std::move(not_ready)};
    return {200, "ok"};
  }
  if (path == "/metrics") {
    *verb = "metrics";
    if (!get) return {405, EncodeError("/metrics takes GET")};
    return {200, o.metrics ? o.metrics->Text() : ""};
  }
  *verb = "other";
  return {404,
          EncodeError("no such path: " + std::string(path.substr(0, 200)) +
                      " (POST /filter, POST /prioritize, POST /bind, GET /healthz, GET /livez, "
                      "GET /readyz, GET /metrics)")};
}

http::Response AnswerExtenderRequest(const ExtenderServer::Options& o, http::Request& req) {
  const auto start = std::chrono::steady_clock::now();
  std::string verb;
  HttpAnswer a = RouteExtenderRequest(o, req, &verb);
  // The probes answer plain text, a not-ready /readyz its reason too.
  const bool probe = verb == "healthz" || verb == "livez" || verb == "readyz";
  const bool json = !(probe || verb == "metrics") || (a.status != 200 && verb != "readyz");
  http::Response res;
  res.status = a.status;
  res.content_type =
      json ? "application/json" : (verb == "metrics" ? "text/plain; version=0.0.4" : "text/plain");
  res.body = std::move(a.body);
  if (o.metrics && (verb == "filter" || verb == "prioritize" || verb == "bind")) {
    o.metrics->Request(
        verb, a.status,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } else if (o.metrics && a.status >= 400) {
    o.metrics->Request(verb, a.status, 0);
  }
  return res;
}

class ExtenderServerImpl final : public ExtenderServer {
 public:
  explicit ExtenderServerImpl(Options options) : options_(std::move(options)) {}
  ~ExtenderServerImpl() override { Stop(); }

  Status Init() {
    if (options_.extender == nullptr) return InvalidArgumentError("no extender");
    if (options_.threads < 1 || options_.threads > 256) {
      return InvalidArgumentError("threads must be 1..256");
    }
    if (options_.max_total_body_bytes != 0 &&
        options_.max_total_body_bytes < options_.max_body_bytes) {
      return InvalidArgumentError("max_total_body_bytes is below max_body_bytes");
    }
    ExtenderMetrics* metrics = options_.metrics;
    http::Server::Options o;
    o.listen = options_.listen;
    o.listen_name = "--listen";
    o.tls_cert_pem = options_.tls_cert_pem;
    o.tls_key_pem = options_.tls_key_pem;
    o.threads = options_.io_threads;
    o.workers = options_.threads;
    o.max_queued = options_.max_queued;
    o.offload = [](const http::Request& r) {
      return r.path() == "/filter" || r.path() == "/prioritize" || r.path() == "/bind";
    };
    Extender* extender = options_.extender;
    o.on_stop = [extender] { extender->Stop(); };
    o.on_busy = [metrics](std::string_view reason) {
      if (metrics) metrics->Busy(reason);
    };
    o.max_body_bytes = options_.max_body_bytes;
    o.max_total_body_bytes = options_.max_total_body_bytes;
    o.body_padding = BodyPadding();
    o.request_timeout = options_.io_timeout;
    o.write_timeout = options_.io_timeout;
    o.max_connections = options_.max_connections;
    o.server_header = "kdm-extender";
    // kube-scheduler reads an extender's errors from {"Error": ...}.
    // A busy server says 503 (with Retry-After); every other refusal is 400.
    o.refusal = [metrics](int status, const std::string& message) {
      const int code = status == 503 ? 503 : 400;
      if (metrics) metrics->Request("other", code, 0);
      http::Response r;
      r.status = code;
      r.content_type = "application/json";
      r.body = EncodeError(message);
      return r;
    };
    KDM_ASSIGN_OR_RETURN(server_, http::Server::Start(std::move(o), [this](http::Request& request) {
                           return AnswerExtenderRequest(options_, request);
                         }));
    return OkStatus();
  }

  uint16_t port() const override { return server_->port(); }

  void Stop() override {
    if (server_) server_->Stop();
  }

 private:
  const Options options_;
  std::unique_ptr<http::Server> server_;
};

}  // namespace

void KeepLargeAllocationsMapped() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

StatusOr<std::unique_ptr<ExtenderServer>> ExtenderServer::Start(Options options) {
  auto server = std::make_unique<ExtenderServerImpl>(std::move(options));
  KDM_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<ExtenderServer>(std::move(server));
}

}  // namespace kdm::scheduler
