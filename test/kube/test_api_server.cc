#include "kdm/test/kube/test_api_server.h"

#include <fcntl.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <thread>

namespace kdm::kube::test {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

class ServerImpl;

// One accepted connection: handshake, one request, one reply, close.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerImpl& server, tcp::socket socket, ssl::context& ctx)
      : server_(server), stream_(std::move(socket), ctx), timer_(stream_.get_executor()) {}
  ~Connection() {
    if (feed_) feed_->AttachForServer(nullptr);
  }

  void Start();
  void Close() {
    beast::error_code ignored;
    beast::get_lowest_layer(stream_).socket().shutdown(tcp::socket::shutdown_both, ignored);
    beast::get_lowest_layer(stream_).socket().close(ignored);
  }

 private:
  void OnRequest();
  void Answer(Reply reply);
  void StartFeed();
  void Pump();
  void OnClientData(beast::error_code ec);

  ServerImpl& server_;
  ssl::stream<beast::tcp_stream> stream_;
  net::steady_timer timer_;
  beast::flat_buffer buffer_;
  http::request<http::string_body> request_;
  std::shared_ptr<http::response<http::string_body>> response_;
  // Streaming.
  std::shared_ptr<WatchFeed> feed_;
  std::shared_ptr<http::response<http::empty_body>> stream_header_;
  std::shared_ptr<http::response_serializer<http::empty_body>> serializer_;
  std::deque<std::string> to_write_;
  std::string writing_;
  bool write_in_flight_ = false;
  bool end_after_writes_ = false;
  char drain_[512];
};

class ServerImpl final : public TestApiServer {
 public:
  explicit ServerImpl(Options options)
      : options_(std::move(options)), ctx_(ssl::context::tls_server), acceptor_(ioc_) {}
  ~ServerImpl() override { Stop(); }

  Status Init() {
    beast::error_code ec;
    ctx_.use_certificate_chain(net::buffer(options_.cert_pem), ec);
    if (ec) return InvalidArgumentError("test server: certificate: " + ec.message());
    ctx_.use_private_key(net::buffer(options_.key_pem), ssl::context::pem, ec);
    if (ec) return InvalidArgumentError("test server: key: " + ec.message());
    if (!options_.client_ca_pem.empty()) {
      ctx_.add_certificate_authority(net::buffer(options_.client_ca_pem), ec);
      if (ec) return InvalidArgumentError("test server: client CA: " + ec.message());
      ctx_.set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
    }
    tcp::endpoint endpoint(net::ip::make_address("127.0.0.1"), options_.port);
    acceptor_.open(endpoint.protocol(), ec);
    // Asio does not set close-on-exec: without it every process a test
    // spawns (a `kdm publish`) inherits the listening socket, keeps it open
    // after Stop() and makes a restart on the same port fail.
    if (!ec) ::fcntl(acceptor_.native_handle(), F_SETFD, FD_CLOEXEC);
    // A restart on the port of a stopped server must not wait for TIME_WAIT.
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) return UnavailableError("test server: listen: " + ec.message());
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { ioc_.run(); });
    return OkStatus();
  }

  void Stop() override {
    if (!thread_.joinable()) return;
    net::post(ioc_, [this] {
      beast::error_code ignored;
      acceptor_.close(ignored);
      for (auto& weak : connections_) {
        if (auto c = weak.lock()) c->Close();
      }
      ioc_.stop();
    });
    thread_.join();
  }

  uint16_t port() const override { return port_; }

  void Enqueue(Reply reply) override {
    MutexLock lock(&mu_);
    queue_.push_back(std::move(reply));
  }
  void SetHandler(Handler handler) override {
    MutexLock lock(&mu_);
    handler_ = std::move(handler);
  }
  std::vector<RecordedRequest> Requests() const override {
    MutexLock lock(&mu_);
    return requests_;
  }
  size_t RequestCount() const override {
    MutexLock lock(&mu_);
    return requests_.size();
  }
  size_t FailedHandshakes() const override {
    MutexLock lock(&mu_);
    return failed_handshakes_;
  }

  // On the server's thread.
  Reply Record(RecordedRequest request) {
    Handler handler;
    {
      MutexLock lock(&mu_);
      requests_.push_back(request);
      if (!queue_.empty()) {
        Reply r = std::move(queue_.front());
        queue_.pop_front();
        return r;
      }
      handler = handler_;
    }
    if (handler) return handler(request);
    return Reply{.status = 404,
                 .body = R"({"kind":"Status","message":"the test server has no reply"})"};
  }
  void HandshakeFailed() {
    MutexLock lock(&mu_);
    ++failed_handshakes_;
  }
  net::io_context& ioc() { return ioc_; }

 private:
  void Accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      if (ec) return;  // closed by Stop()
      ::fcntl(socket.native_handle(), F_SETFD, FD_CLOEXEC);
      auto c = std::make_shared<Connection>(*this, std::move(socket), ctx_);
      connections_.push_back(c);
      std::erase_if(connections_, [](const auto& w) { return w.expired(); });
      c->Start();
      Accept();
    });
  }

  Options options_;
  net::io_context ioc_;
  ssl::context ctx_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::thread thread_;
  // Server thread only.
  std::vector<std::weak_ptr<Connection>> connections_;

  mutable Mutex mu_;
  std::deque<Reply> queue_ ABSL_GUARDED_BY(mu_);
  Handler handler_ ABSL_GUARDED_BY(mu_);
  std::vector<RecordedRequest> requests_ ABSL_GUARDED_BY(mu_);
  size_t failed_handshakes_ ABSL_GUARDED_BY(mu_) = 0;
};

void Connection::Start() {
  auto self = shared_from_this();
  stream_.async_handshake(ssl::stream_base::server, [self](beast::error_code ec) {
    if (ec) {
      self->server_.HandshakeFailed();
      return;
    }
    http::async_read(self->stream_, self->buffer_, self->request_,
                     [self](beast::error_code e, size_t) {
                       if (!e) self->OnRequest();
                     });
  });
}

void Connection::OnRequest() {
  RecordedRequest r;
  r.method = std::string(request_.method_string());
  r.target = std::string(request_.target());
  size_t q = r.target.find('?');
  r.path = r.target.substr(0, q);
  r.query = q == std::string::npos ? "" : r.target.substr(q + 1);
  for (const auto& field : request_) {
    r.headers[Lower(std::string(field.name_string()))] = std::string(field.value());
  }
  r.body = request_.body();
  if (const char* sni = SSL_get_servername(stream_.native_handle(), TLSEXT_NAMETYPE_host_name)) {
    r.sni = sni;
  }
  if (X509* peer = SSL_get_peer_certificate(stream_.native_handle())) {
    char cn[256] = {};
    X509_NAME_get_text_by_NID(X509_get_subject_name(peer), NID_commonName, cn, sizeof cn);
    r.client_cn = cn;
    X509_free(peer);
  }
  Reply reply = server_.Record(std::move(r));
  if (reply.delay.count() > 0) {
    timer_.expires_after(reply.delay);
    auto self = shared_from_this();
    timer_.async_wait([self, reply = std::move(reply)](beast::error_code ec) mutable {
      if (!ec) self->Answer(std::move(reply));
    });
    return;
  }
  Answer(std::move(reply));
}

void Connection::Answer(Reply reply) {
  if (reply.drop) {
    Close();
    return;
  }
  auto self = shared_from_this();
  if (reply.feed) {
    feed_ = std::move(reply.feed);
    stream_header_ = std::make_shared<http::response<http::empty_body>>(
        static_cast<http::status>(reply.status), 11);
    stream_header_->set(http::field::content_type, "application/json");
    for (const auto& [k, v] : reply.headers) stream_header_->set(k, v);
    stream_header_->chunked(true);
    serializer_ = std::make_shared<http::response_serializer<http::empty_body>>(*stream_header_);
    http::async_write_header(stream_, *serializer_, [self](beast::error_code ec, size_t) {
      if (ec) return;
      self->StartFeed();
    });
    return;
  }
  response_ = std::make_shared<http::response<http::string_body>>(
      static_cast<http::status>(reply.status), 11);
  response_->set(http::field::content_type, "application/json");
  response_->set(http::field::connection, "close");
  for (const auto& [k, v] : reply.headers) response_->set(k, v);
  response_->body() = std::move(reply.body);
  response_->prepare_payload();
  http::async_write(stream_, *response_, [self](beast::error_code, size_t) { self->Close(); });
}

void Connection::StartFeed() {
  // A read that only ends when the client goes away (or Stop closes the
  // socket) keeps the connection alive while it streams.
  auto self = shared_from_this();
  stream_.async_read_some(net::buffer(drain_),
                          [self](beast::error_code ec, size_t) { self->OnClientData(ec); });
  std::weak_ptr<Connection> weak = weak_from_this();
  net::io_context& ioc = server_.ioc();
  feed_->AttachForServer([weak, &ioc] {
    net::post(ioc, [weak] {
      if (auto c = weak.lock()) c->Pump();
    });
  });
}

void Connection::OnClientData(beast::error_code ec) {
  if (ec) {
    Close();
    return;
  }
  auto self = shared_from_this();
  stream_.async_read_some(net::buffer(drain_),
                          [self](beast::error_code e, size_t) { self->OnClientData(e); });
}

void Connection::Pump() {
  if (write_in_flight_) return;
  WatchFeed::Next next = feed_->TakeForServer();
  for (auto& chunk : next.chunks) to_write_.push_back(std::move(chunk));
  if (next.drop) {
    Close();
    return;
  }
  if (next.end) end_after_writes_ = true;
  auto self = shared_from_this();
  if (!to_write_.empty()) {
    writing_ = std::move(to_write_.front());
    to_write_.pop_front();
    write_in_flight_ = true;
    net::async_write(stream_, http::make_chunk(net::buffer(writing_)),
                     [self](beast::error_code ec, size_t) {
                       self->write_in_flight_ = false;
                       if (ec) return;
                       self->Pump();
                     });
    return;
  }
  if (end_after_writes_) {
    write_in_flight_ = true;
    net::async_write(stream_, http::make_chunk_last(), [self](beast::error_code, size_t) {
      self->write_in_flight_ = false;
      self->Close();
    });
  }
}

}  // namespace

void WatchFeed::Send(std::string text) {
  MutexLock lock(&mu_);
  pending_.push_back(std::move(text));
  Wake();
}

void WatchFeed::End() {
  MutexLock lock(&mu_);
  end_ = true;
  Wake();
}

void WatchFeed::Drop() {
  MutexLock lock(&mu_);
  drop_ = true;
  Wake();
}

bool WatchFeed::attached() const {
  MutexLock lock(&mu_);
  return static_cast<bool>(wake_);
}

WatchFeed::Next WatchFeed::TakeForServer() {
  MutexLock lock(&mu_);
  Next next;
  next.chunks.swap(pending_);
  next.end = end_;
  next.drop = drop_;
  return next;
}

bool WatchFeed::detached() const {
  MutexLock lock(&mu_);
  return detached_;
}

void WatchFeed::AttachForServer(std::function<void()> wake) {
  MutexLock lock(&mu_);
  if (!wake && wake_) detached_ = true;
  wake_ = std::move(wake);
  Wake();
}

void WatchFeed::Wake() {
  if (wake_) wake_();
}

StatusOr<std::unique_ptr<TestApiServer>> TestApiServer::Start(Options options) {
  auto server = std::make_unique<ServerImpl>(std::move(options));
  KDM_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<TestApiServer>(std::move(server));
}

}  // namespace kdm::kube::test
