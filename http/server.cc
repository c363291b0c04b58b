// The server's connections: one Session per connection, on a strand of the
// shared io_context, reading with one deadline per request (Beast's
// tcp_stream timer) and writing with another. The bound on connections is
// kept by the accept handler (one accept is outstanding at a time) over a
// list of weak pointers; eviction is posted to the victim's strand, where
// it closes the connection only if it still waits for a request.
#include "kdm/http/server.h"

#include <spdlog/spdlog.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <list>
#include <optional>
#include <thread>
#include <type_traits>

#include "kdm/base/sync.h"
#include "kdm/http/asio_names.h"
#include "kdm/http/listen_address.h"

namespace kdm::http {
namespace {

using namespace asio_names;  // NOLINT(build/namespaces): http/'s own short names
using PlainStream = beast::tcp_stream;
using TlsStream = ssl::stream<beast::tcp_stream>;

// What every connection of one server reads; lives as long as the server.
struct ServerPolicy {
  Server::Options options;
  Handler handler;
};

Response TextResponse(int status, std::string body) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

int64_t SteadyTicks() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// A connection as the bound on connections sees it.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual void Begin() = 0;
  // Any thread: closes the connection if, on its strand, it still waits
  // for a request.
  virtual void Evict() = 0;
  // Closes the connection; only while no thread runs the loop.
  virtual void CloseNow() = 0;
  // Any thread: whether it waits for (the rest of) a request, and since when.
  bool waiting() const { return waiting_.load(); }
  int64_t waiting_since() const { return waiting_since_.load(); }

 protected:
  void MarkWaiting() {
    waiting_since_ = SteadyTicks();
    waiting_ = true;
  }
  std::atomic<bool> waiting_{false};
  std::atomic<int64_t> waiting_since_{0};
};

template <typename Stream>
class Session final : public Connection, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = std::is_same_v<Stream, TlsStream>;

  Session(Stream stream, const ServerPolicy& policy)
      : stream_(std::move(stream)),
        policy_(policy),
        buffer_(policy.options.max_header_bytes + policy.options.max_body_bytes) {}

  void Begin() override {
    MarkWaiting();
    Lowest().expires_after(policy_.options.request_timeout);
    if constexpr (kTls) {
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                if (ec) return self->Close();
                                self->ReadRequest(/*new_deadline=*/false);
                              });
    } else {
      ReadRequest(/*new_deadline=*/false);
    }
  }

  void CloseNow() override { Close(); }

  void Evict() override {
    net::post(stream_.get_executor(), [self = this->shared_from_this()] {
      if (self->waiting_) self->Close();
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void ReadRequest(bool new_deadline) {
    if (new_deadline) {
      MarkWaiting();
      // The whole request, idle time included, within one deadline.
      Lowest().expires_after(policy_.options.request_timeout);
    }
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(policy_.options.max_header_bytes));
    parser_->body_limit(policy_.options.max_body_bytes);
    bhttp::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRead(ec); });
  }

  void OnRead(beast::error_code ec) {
    waiting_ = false;
    const Server::Options& o = policy_.options;
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == ssl::error::stream_truncated) {
      return Close();
    }
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
      return Refuse(431, "request header is larger than the limit of " +
                             std::to_string(o.max_header_bytes) + " bytes");
    }
    if (ec == bhttp::error::body_limit) {
      return Refuse(413, "request body is larger than the limit of " +
                             std::to_string(o.max_body_bytes) + " bytes");
    }
    if (ec) {
      // Garbage, truncation, a bad header: the stream cannot be resynchronized.
      return Refuse(400, "malformed HTTP request: " + ec.message());
    }
    bhttp::request<bhttp::string_body>& parsed = parser_->get();
    const bool keep_alive = parsed.keep_alive();
    Request request{std::string(parsed.method_string()), std::string(parsed.target()),
                    std::move(parsed.body())};
    Response response;
    try {
      response = policy_.handler(request);
    } catch (const std::exception& e) {
      spdlog::error("event=http_handler_error error=\"{}\"", e.what());
      response = TextResponse(500, "internal error\n");
    }
    Write(std::move(response), /*close=*/!keep_alive);
  }

  void Refuse(int status, const std::string& message) {
    const RefusalHandler& refusal = policy_.options.refusal;
    Write(refusal ? refusal(status, message) : TextResponse(status, message + "\n"),
          /*close=*/true);
  }

  void Write(Response r, bool close) {
    auto res = std::make_shared<bhttp::response<bhttp::string_body>>(
        static_cast<bhttp::status>(r.status), 11);
    if (!policy_.options.server_header.empty()) {
      res->set(bhttp::field::server, policy_.options.server_header);
    }
    res->set(bhttp::field::content_type, r.content_type);
    for (const auto& [name, value] : r.headers) res->set(name, value);
    res->keep_alive(!close);
    res->body() = std::move(r.body);
    res->prepare_payload();
    Lowest().expires_after(policy_.options.write_timeout);
    bhttp::async_write(stream_, *res,
                       [self = this->shared_from_this(), res, close](beast::error_code ec, size_t) {
                         if (ec || close) return self->Close();
                         self->ReadRequest(/*new_deadline=*/true);
                       });
  }

  void Close() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().socket().close(ignored);
  }

  Stream stream_;
  const ServerPolicy& policy_;
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
};

class ServerImpl final : public Server {
 public:
  ServerImpl(Options options, Handler handler)
      : policy_{std::move(options), std::move(handler)},
        ssl_(ssl::context::tls_server),
        acceptor_(ioc_) {}

  ~ServerImpl() override { Stop(); }

  Status Init() {
    const Options& o = policy_.options;
    if (!policy_.handler) return InvalidArgumentError("http server: no handler");
    if (o.threads < 1 || o.threads > 256) return InvalidArgumentError("threads must be 1..256");
    if (o.max_connections < 1) return InvalidArgumentError("max_connections must be at least 1");
    if (o.max_header_bytes < 1 || o.max_header_bytes > (1u << 30)) {
      return InvalidArgumentError("max_header_bytes must be 1..1 GiB");
    }
    KDM_ASSIGN_OR_RETURN(ListenAddress address, ParseListenAddress(o.listen, o.listen_name));
    const std::string named = o.listen_name + " \"" + o.listen.substr(0, 200) + "\"";
    tls_ = !o.tls_cert_pem.empty() || !o.tls_key_pem.empty();
    if (tls_) {
      if (o.tls_cert_pem.empty() || o.tls_key_pem.empty()) {
        return InvalidArgumentError("TLS needs both a certificate and a key");
      }
      beast::error_code ec;
      ssl_.use_certificate_chain(net::buffer(o.tls_cert_pem), ec);
      if (ec) return InvalidArgumentError("TLS certificate: " + ec.message());
      ssl_.use_private_key(net::buffer(o.tls_key_pem), ssl::context::pem, ec);
      if (ec) return InvalidArgumentError("TLS key: " + ec.message());
      ssl_.set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                       ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
    }
    beast::error_code ec;
    tcp::endpoint endpoint;
    net::ip::address ip = net::ip::make_address(address.host, ec);
    if (!ec) {
      endpoint = tcp::endpoint(ip, address.port);
    } else {
      tcp::resolver resolver(ioc_);
      auto results =
          resolver.resolve(address.host, std::to_string(address.port), tcp::resolver::passive, ec);
      if (ec || results.empty()) {
        return UnavailableError(named + ": cannot resolve " + address.host + ": " +
                                (ec ? ec.message() : "no address"));
      }
      endpoint = results.begin()->endpoint();
    }
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return UnavailableError(named + ": cannot listen: " + ec.message());
    port_ = acceptor_.local_endpoint(ec).port();
    Accept();
    for (int i = 0; i < o.threads; ++i) threads_.emplace_back([this] { RunLoop(); });
    return OkStatus();
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    ioc_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
    // No handler runs now: close the listener and every connection here.
    beast::error_code ignored;
    acceptor_.close(ignored);
    std::list<std::weak_ptr<Connection>> open;
    {
      MutexLock connections_lock(&connections_mu_);
      open.swap(connections_);
    }
    for (auto& weak : open) {
      if (auto c = weak.lock()) c->CloseNow();
    }
    // An evicted connection that was being answered is no longer listed; it
    // is closed when ioc_ is destroyed with the handlers that hold it.
  }

 private:
  void RunLoop() {
    for (;;) {
      try {
        ioc_.run();
        return;
      } catch (const std::exception& e) {
        spdlog::error("event=http_server_error port={} error=\"{}\"", port_, e.what());
      }
    }
  }

  void Accept() {
    acceptor_.async_accept(net::make_strand(ioc_),
                           [this](beast::error_code ec, tcp::socket socket) {
                             if (ec == net::error::operation_aborted || stopping_) return;
                             if (!ec) Admit(std::move(socket));
                             Accept();
                           });
  }

  void Admit(tcp::socket socket) {
    std::shared_ptr<Connection> connection;
    {
      MutexLock lock(&connections_mu_);
      connections_.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
      if (connections_.size() >= policy_.options.max_connections && !EvictLongestWaitingLocked()) {
        beast::error_code ignored;
        socket.close(ignored);
        return;
      }
      if (tls_) {
        connection = std::make_shared<Session<TlsStream>>(
            TlsStream(beast::tcp_stream(std::move(socket)), ssl_), policy_);
      } else {
        connection =
            std::make_shared<Session<PlainStream>>(PlainStream(std::move(socket)), policy_);
      }
      connections_.push_back(connection);
    }
    connection->Begin();
  }

  // Evicts the connection that has waited longest for a request and drops
  // it from connections_; false when every connection is being answered.
  bool EvictLongestWaitingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(connections_mu_) {
    auto victim = connections_.end();
    std::shared_ptr<Connection> victim_connection;
    for (auto it = connections_.begin(); it != connections_.end(); ++it) {
      std::shared_ptr<Connection> c = it->lock();
      if (!c || !c->waiting()) continue;
      if (!victim_connection || c->waiting_since() < victim_connection->waiting_since()) {
        victim = it;
        victim_connection = std::move(c);
      }
    }
    if (!victim_connection) return false;
    victim_connection->Evict();
    connections_.erase(victim);
    if (++evicted_ == 1 || evicted_ % 1000 == 0) {
      spdlog::warn("event=http_connection_evicted port={} max_connections={} evicted_total={}",
                   port_, policy_.options.max_connections, evicted_);
    }
    return true;
  }

  const ServerPolicy policy_;
  net::io_context ioc_;
  ssl::context ssl_;
  tcp::acceptor acceptor_;
  bool tls_ = false;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> threads_;  // started by Init, joined by Stop

  Mutex connections_mu_;
  std::list<std::weak_ptr<Connection>> connections_ ABSL_GUARDED_BY(connections_mu_);
  int64_t evicted_ ABSL_GUARDED_BY(connections_mu_) = 0;

  Mutex stop_mu_;
  bool stopped_ ABSL_GUARDED_BY(stop_mu_) = false;
};

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(Options options, Handler handler) {
  auto server = std::make_unique<ServerImpl>(std::move(options), std::move(handler));
  KDM_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace kdm::http
