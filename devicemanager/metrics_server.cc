// MetricsServer: HTTP/1.1 with Boost.Beast, asynchronous on one owned thread,
// every connection served concurrently. Each connection reads at most
// kHeaderLimit bytes of header and kBodyLimit bytes of body, and must send a
// whole request within kIdleTimeout of the last response (or of connecting),
// else it is closed. At most kMaxConnections are open at once; a new
// connection beyond them closes the one that has waited longest for its
// request (never one being answered), so connections that are opened and
// held cannot lock scrapes out: they only make each other shorter-lived.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "kdm/devicemanager/metrics.h"

namespace kdm::devicemanager {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr std::size_t kHeaderLimit = 8 * 1024;
constexpr std::uint64_t kBodyLimit = 4 * 1024;
constexpr std::chrono::seconds kIdleTimeout{10};
constexpr std::size_t kMaxConnections = 64;
constexpr char kExpositionType[] = "text/plain; version=0.0.4; charset=utf-8";

struct ServerContext {
  std::shared_ptr<Metrics> metrics;
  const Manager* manager = nullptr;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, const ServerContext* context)
      : stream_(std::move(socket)), context_(context) {}

  void Run() { ReadRequest(); }

  // Server thread only: true while no request is being answered, i.e. the
  // connection waits for (the rest of) a request.
  bool waiting() const { return waiting_; }
  std::chrono::steady_clock::time_point waiting_since() const { return waiting_since_; }

  // Called on the server thread only.
  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

 private:
  void ReadRequest() {
    waiting_ = true;
    waiting_since_ = std::chrono::steady_clock::now();
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    stream_.expires_after(kIdleTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, std::size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    waiting_ = false;
    if (ec == http::error::end_of_stream || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == net::error::eof) {
      Close();
      return;
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      Reply(Error(http::status::request_header_fields_too_large,
                  "request header larger than " + std::to_string(kHeaderLimit) + " bytes\n"),
            /*close=*/true);
      return;
    }
    if (ec == http::error::body_limit) {
      Reply(Error(http::status::payload_too_large,
                  "request body larger than " + std::to_string(kBodyLimit) + " bytes\n"),
            /*close=*/true);
      return;
    }
    if (ec) {
      // Garbage, truncation, a bad header: the stream cannot be resynchronized.
      Reply(Error(http::status::bad_request, "malformed HTTP request: " + ec.message() + "\n"),
            /*close=*/true);
      return;
    }
    const http::request<http::string_body>& req = parser_->get();
    Reply(Handle(req), /*close=*/!req.keep_alive());
  }

  http::response<http::string_body> Error(http::status status, std::string body) const {
    http::response<http::string_body> res{status, 11};
    res.set(http::field::content_type, "text/plain; charset=utf-8");
    res.body() = std::move(body);
    return res;
  }

  http::response<http::string_body> Handle(const http::request<http::string_body>& req) const {
    std::string_view target(req.target().data(), req.target().size());
    target = target.substr(0, target.find('?'));
    const bool known = target == "/metrics" || target == "/healthz";
    if (!known) return Error(http::status::not_found, "not found: try /metrics or /healthz\n");
    if (req.method() != http::verb::get) {
      auto res = Error(http::status::method_not_allowed, "only GET is allowed\n");
      res.set(http::field::allow, "GET");
      return res;
    }
    http::response<http::string_body> res{http::status::ok, req.version()};
    if (target == "/healthz") {
      res.set(http::field::content_type, "text/plain; charset=utf-8");
      res.body() = "ok\n";
    } else {
      res.set(http::field::content_type, kExpositionType);
      res.body() = context_->metrics->Render(context_->manager);
    }
    return res;
  }

  void Reply(http::response<http::string_body> res, bool close) {
    res.keep_alive(!close);
    res.prepare_payload();
    response_ = std::move(res);
    stream_.expires_after(kIdleTimeout);
    http::async_write(stream_, response_,
                      [self = shared_from_this(), close](beast::error_code ec, std::size_t) {
                        if (ec || close) {
                          self->Close();
                          return;
                        }
                        self->ReadRequest();
                      });
  }

  beast::tcp_stream stream_;
  const ServerContext* const context_;
  beast::flat_buffer buffer_{kHeaderLimit + kBodyLimit};
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> response_;
  bool waiting_ = false;
  std::chrono::steady_clock::time_point waiting_since_;
};

class MetricsServerImpl final : public MetricsServer {
 public:
  MetricsServerImpl(std::shared_ptr<Metrics> metrics, const Manager* manager)
      : context_{std::move(metrics), manager}, acceptor_(ioc_) {}
  ~MetricsServerImpl() override { Stop(); }

  Status Listen(const std::string& host, const std::string& port, const std::string& what) {
    beast::error_code ec;
    tcp::resolver resolver(ioc_);
    auto results = resolver.resolve(host, port, tcp::resolver::passive, ec);
    if (ec || results.empty()) {
      return UnavailableError("cannot resolve metrics address " + what + ": " + ec.message());
    }
    tcp::endpoint endpoint = results.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec)
      return UnavailableError("cannot listen on metrics address " + what + ": " + ec.message());
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    thread_ = std::thread([this] { RunLoop(); });
    spdlog::info("event=metrics_serving address={} port={}", what, port_);
    return OkStatus();
  }

  int port() const override { return port_; }

  void Stop() override {
    std::lock_guard<std::mutex> lock(stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    if (!thread_.joinable()) return;
    // Closing the listener and every connection leaves the loop without
    // work, so run() returns.
    net::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      for (auto& weak : sessions_) {
        if (auto s = weak.lock()) s->Close();
      }
      sessions_.clear();
    });
    thread_.join();
  }

 private:
  void RunLoop() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("event=metrics_server_error error=\"{}\"", e.what());
      }
    }
  }

  void Accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor_.is_open()) return;
      if (!ec) {
        sessions_.remove_if([](const std::weak_ptr<Session>& w) { return w.expired(); });
        if (sessions_.size() >= kMaxConnections && !EvictLongestWaiting()) {
          beast::error_code ignored;
          socket.close(ignored);
        } else {
          auto session = std::make_shared<Session>(std::move(socket), &context_);
          sessions_.push_back(session);
          session->Run();
        }
      }
      Accept();
    });
  }

  // Closes the connection that has waited longest for a request and drops
  // it from sessions_; false when every connection is being answered.
  bool EvictLongestWaiting() {
    auto victim = sessions_.end();
    std::shared_ptr<Session> victim_session;
    for (auto it = sessions_.begin(); it != sessions_.end(); ++it) {
      std::shared_ptr<Session> s = it->lock();
      if (!s || !s->waiting()) continue;
      if (!victim_session || s->waiting_since() < victim_session->waiting_since()) {
        victim = it;
        victim_session = std::move(s);
      }
    }
    if (!victim_session) return false;
    victim_session->Close();
    sessions_.erase(victim);
    if (++evicted_ == 1 || evicted_ % 1000 == 0) {
      spdlog::warn("event=metrics_connection_evicted max_connections={} evicted_total={}",
                   kMaxConnections, evicted_);
    }
    return true;
  }

  const ServerContext context_;
  net::io_context ioc_{1};
  int64_t evicted_ = 0;  // server thread only
  tcp::acceptor acceptor_;
  std::list<std::weak_ptr<Session>> sessions_;  // server thread only
  int port_ = 0;
  std::thread thread_;
  std::mutex stop_mu_;
  bool stopped_ = false;
};

// Splits "HOST:PORT" or "[V6]:PORT"; an empty host means every interface.
Status SplitHostPort(const std::string& host_port, std::string& host, std::string& port) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("metrics address \"" + host_port + "\" " + why +
                                " (want HOST:PORT, e.g. 127.0.0.1:9400 or [::1]:0)");
  };
  std::size_t colon;
  if (!host_port.empty() && host_port[0] == '[') {
    std::size_t close = host_port.find(']');
    if (close == std::string::npos) return bad("has no closing ']'");
    if (close + 1 >= host_port.size() || host_port[close + 1] != ':') return bad("has no port");
    host = host_port.substr(1, close - 1);
    colon = close + 1;
  } else {
    colon = host_port.rfind(':');
    if (colon == std::string::npos) return bad("has no port");
    host = host_port.substr(0, colon);
    if (host.find(':') != std::string::npos) return bad("needs brackets around an IPv6 host");
  }
  port = host_port.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; }) ||
      std::stoi(port) > 65535) {
    return bad("has an invalid port");
  }
  if (host.empty()) host = "0.0.0.0";
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& host_port,
                                                              std::shared_ptr<Metrics> metrics,
                                                              const Manager* manager) {
  if (!metrics) return InvalidArgumentError("metrics must not be null");
  std::string host, port;
  KDM_RETURN_IF_ERROR(SplitHostPort(host_port, host, port));
  auto server = std::make_unique<MetricsServerImpl>(std::move(metrics), manager);
  KDM_RETURN_IF_ERROR(server->Listen(host, port, host_port));
  return std::unique_ptr<MetricsServer>(std::move(server));
}

}  // namespace kdm::devicemanager
