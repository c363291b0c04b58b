#include "kdm/scheduler/http_server.h"

#include <malloc.h>
#include <spdlog/spdlog.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
#include <thread>
#include <vector>

#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/scheduler/extender_json.h"

namespace kdm::scheduler {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

struct Shared {
  Extender* extender;
  ExtenderMetrics* metrics;
  uint64_t max_body_bytes;
  std::chrono::milliseconds io_timeout;
};

HttpAnswer Route(const Shared& s, http::request<http::string_body>& req, std::string* verb) {
  const std::string_view target(req.target().data(), req.target().size());
  const std::string_view path = target.substr(0, target.find('?'));
  const bool post = req.method() == http::verb::post;
  const bool get = req.method() == http::verb::get;
  if (path == "/filter" || path == "/prioritize") {
    *verb = std::string(path.substr(1));
    if (!post) return {405, EncodeError(std::string(path) + " takes POST")};
    std::string& body = req.body();
    PadBody(&body);
    return path == "/filter" ? s.extender->Filter(body) : s.extender->Prioritize(body);
  }
  if (path == "/healthz") {
    *verb = "healthz";
    if (!get) return {405, EncodeError("/healthz takes GET")};
    return {200, "ok"};
  }
  if (path == "/metrics") {
    *verb = "metrics";
    if (!get) return {405, EncodeError("/metrics takes GET")};
    return {200, s.metrics ? s.metrics->Text() : ""};
  }
  *verb = "other";
  return {404, EncodeError("no such path: " + std::string(path.substr(0, 200)) +
                           " (POST /filter, POST /prioritize, GET /healthz, GET /metrics)")};
}

template <typename Stream>
class Session : public std::enable_shared_from_this<Session<Stream>> {
 public:
  Session(Stream stream, const Shared& shared) : stream_(std::move(stream)), shared_(shared) {}

  void Begin() {
    if constexpr (std::is_same_v<Stream, beast::tcp_stream>) {
      Read();
    } else {
      beast::get_lowest_layer(stream_).expires_after(shared_.io_timeout);
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (!ec) self->Read();
                              });
    }
  }

 private:
  void Read() {
    parser_.emplace();
    parser_->body_limit(shared_.max_body_bytes);
    parser_->header_limit(64 * 1024);
    beast::get_lowest_layer(stream_).expires_after(shared_.io_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    if (ec == http::error::end_of_stream || ec == net::error::eof) return Close();
    if (ec == http::error::body_limit) {
      return Answer({400, EncodeError("body is larger than the limit of " +
                                      std::to_string(shared_.max_body_bytes) + " bytes")},
                    "other", /*keep_alive=*/false, std::chrono::steady_clock::now());
    }
    if (ec) {
      if (ec != beast::error::timeout && ec != net::error::operation_aborted &&
          ec != net::error::connection_reset) {
        // A request that is not HTTP: answer and close.
        return Answer({400, EncodeError("bad HTTP request: " + ec.message())}, "other", false,
                      std::chrono::steady_clock::now());
      }
      return Close();
    }
    const auto start = std::chrono::steady_clock::now();
    http::request<http::string_body> req = parser_->release();
    std::string verb;
    HttpAnswer a = Route(shared_, req, &verb);
    Answer(std::move(a), verb, req.keep_alive(), start);
  }

  void Answer(HttpAnswer a, const std::string& verb, bool keep_alive,
              std::chrono::steady_clock::time_point start) {
    auto res = std::make_shared<http::response<http::string_body>>(
        static_cast<http::status>(a.status), 11);
    res->set(http::field::server, "kdm-extender");
    const bool json = !(verb == "healthz" || verb == "metrics") || a.status != 200;
    res->set(http::field::content_type,
             json ? "application/json"
                  : (verb == "metrics" ? "text/plain; version=0.0.4" : "text/plain"));
    res->keep_alive(keep_alive);
    res->body() = std::move(a.body);
    res->prepare_payload();
    if (shared_.metrics && (verb == "filter" || verb == "prioritize")) {
      shared_.metrics->Request(
          verb, a.status,
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    } else if (shared_.metrics && a.status >= 400) {
      shared_.metrics->Request(verb, a.status, 0);
    }
    beast::get_lowest_layer(stream_).expires_after(shared_.io_timeout);
    http::async_write(
        stream_, *res,
        [self = this->shared_from_this(), res, keep_alive](beast::error_code ec, size_t) {
          if (ec || !keep_alive) return self->Close();
          self->Read();
        });
  }

  void Close() {
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
  }

  Stream stream_;
  const Shared& shared_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
};

class ServerImpl final : public ExtenderServer {
 public:
  explicit ServerImpl(Options options)
      : options_(std::move(options)),
        shared_{options_.extender, options_.metrics, options_.max_body_bytes, options_.io_timeout},
        ssl_(ssl::context::tls_server),
        acceptor_(ioc_) {}

  ~ServerImpl() override { Stop(); }

  Status Init() {
    if (options_.extender == nullptr) return InvalidArgumentError("no extender");
    if (options_.threads < 1 || options_.threads > 256) {
      return InvalidArgumentError("threads must be 1..256");
    }
    std::string host;
    uint16_t port = 0;
    KDM_RETURN_IF_ERROR(ParseListenAddress(options_.listen, &host, &port));
    tls_ = !options_.tls_cert_pem.empty() || !options_.tls_key_pem.empty();
    if (tls_) {
      if (options_.tls_cert_pem.empty() || options_.tls_key_pem.empty()) {
        return InvalidArgumentError("TLS needs both a certificate and a key");
      }
      beast::error_code ec;
      ssl_.use_certificate_chain(net::buffer(options_.tls_cert_pem), ec);
      if (ec) return InvalidArgumentError("TLS certificate: " + ec.message());
      ssl_.use_private_key(net::buffer(options_.tls_key_pem), ssl::context::pem, ec);
      if (ec) return InvalidArgumentError("TLS key: " + ec.message());
      ssl_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    }
    beast::error_code ec;
    net::ip::address address = net::ip::make_address(host, ec);
    if (ec) return InvalidArgumentError("--listen " + options_.listen + ": bad address " + host);
    tcp::endpoint endpoint(address, port);
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return UnavailableError("cannot listen on " + options_.listen + ": " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < options_.threads; ++i) threads_.emplace_back([this] { ioc_.run(); });
    return OkStatus();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    {
      MutexLock lock(&stop_mu_);
      if (stopped_) return;
      stopped_ = true;
    }
    net::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
    });
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_), [this](beast::error_code ec,
                                                          tcp::socket socket) {
      if (ec) {
        if (ec == net::error::operation_aborted) return;
      } else if (tls_) {
        std::make_shared<Session<ssl::stream<beast::tcp_stream>>>(
            ssl::stream<beast::tcp_stream>(beast::tcp_stream(std::move(socket)), ssl_), shared_)
            ->Begin();
      } else {
        std::make_shared<Session<beast::tcp_stream>>(beast::tcp_stream(std::move(socket)), shared_)
            ->Begin();
      }
      if (acceptor_.is_open()) Accept();
    });
  }

  const Options options_;
  const Shared shared_;
  net::io_context ioc_;
  ssl::context ssl_;
  tcp::acceptor acceptor_;
  bool tls_ = false;
  uint16_t port_ = 0;
  std::vector<std::thread> threads_;
  Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace

void KeepLargeAllocationsMapped() {
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
}

Status ParseListenAddress(const std::string& text, std::string* host, uint16_t* port) {
  const size_t colon = text.rfind(':');
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("--listen '" + text.substr(0, 200) + "': " + why +
                                " (expected HOST:PORT, [V6]:PORT or :PORT)");
  };
  if (colon == std::string::npos) return bad("no port");
  std::string h = text.substr(0, colon);
  const std::string p = text.substr(colon + 1);
  unsigned value = 0;
  auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), value);
  if (p.empty() || ec != std::errc() || end != p.data() + p.size() || value > 65535) {
    return bad("port is not a number 0..65535");
  }
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  if (h.empty()) h = "0.0.0.0";
  if (h == "localhost") h = "127.0.0.1";
  beast::error_code aec;
  net::ip::make_address(h, aec);
  if (aec) return bad("host is not an IP address");
  *host = h;
  *port = static_cast<uint16_t>(value);
  return OkStatus();
}

StatusOr<std::unique_ptr<ExtenderServer>> ExtenderServer::Start(Options options) {
  auto server = std::make_unique<ServerImpl>(std::move(options));
  KDM_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<ExtenderServer>(std::move(server));
}

}  // namespace kdm::scheduler
