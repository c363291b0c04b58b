// The server's connections: one Session per connection, on a strand of the
// shared io_context, reading with one deadline per request (Beast's
// tcp_stream timer) and writing with another. The bound on connections is
// kept by the accept handler (one accept is outstanding at a time) over a
// list of weak pointers; eviction is posted to the victim's strand, where
// it closes the connection only if it still waits for a request.
#include "kdm/http/server.h"

#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cerrno>
#include <deque>
#include <filesystem>
#include <list>
#include <optional>
#include <thread>
#include <type_traits>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/sync.h"
#include "kdm/http/asio_names.h"
#include "kdm/http/listen_address.h"

namespace kdm::http {
namespace {

using namespace asio_names;  // NOLINT(build/namespaces): http/'s own short names
using PlainStream = beast::tcp_stream;
using TlsStream = ssl::stream<beast::tcp_stream>;

// The bytes of request bodies in flight, against max_total_body_bytes.
class BodyBudget {
 public:
  explicit BodyBudget(uint64_t max) : max_(max) {}
  // False (nothing taken) when `n` more would pass the budget.
  bool Take(uint64_t n) {
    if (max_ == 0) return true;
    uint64_t used = used_.load();
    do {
      if (n > max_ || used > max_ - n) return false;
    } while (!used_.compare_exchange_weak(used, used + n));
    return true;
  }
  void Give(uint64_t n) {
    if (max_ != 0 && n != 0) used_.fetch_sub(n);
  }
  uint64_t max() const { return max_; }

 private:
  const uint64_t max_;
  std::atomic<uint64_t> used_{0};
};

// Bytes of the budget held by one request; given back when destroyed.
class BodyReservation {
 public:
  BodyReservation() = default;
  explicit BodyReservation(BodyBudget* budget) : budget_(budget) {}
  BodyReservation(BodyReservation&& o) noexcept : budget_(o.budget_), bytes_(o.bytes_) {
    o.bytes_ = 0;
  }
  BodyReservation& operator=(BodyReservation&& o) noexcept {
    Reset();
    budget_ = o.budget_;
    bytes_ = o.bytes_;
    o.bytes_ = 0;
    return *this;
  }
  ~BodyReservation() { Reset(); }
  // Holds at least `n` bytes; false when the budget cannot give them.
  bool GrowTo(uint64_t n) {
    if (n <= bytes_) return true;
    if (!budget_->Take(n - bytes_)) return false;
    bytes_ = n;
    return true;
  }
  void Reset() {
    if (budget_) budget_->Give(bytes_);
    bytes_ = 0;
  }

 private:
  BodyBudget* budget_ = nullptr;
  uint64_t bytes_ = 0;
};

// Threads running offloaded handlers; at most `max_queued` jobs wait.
class WorkerPool {
 public:
  WorkerPool(int threads, size_t max_queued) : max_queued_(max_queued) {
    for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Run(); });
  }
  ~WorkerPool() { Stop(); }
  // False when the queue is full or the pool stopped.
  bool Submit(std::function<void()> job) {
    MutexLock lock(&mu_);
    if (stopped_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(job));
    return true;
  }
  // Drops the jobs not started and joins the threads (each after its job).
  void Stop() {
    std::deque<std::function<void()>> dropped;
    {
      MutexLock lock(&mu_);
      stopped_ = true;
      dropped.swap(queue_);
    }
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopped_ || !queue_.empty(); }
  void Run() {
    for (;;) {
      std::function<void()> job;
      {
        MutexLock lock(&mu_);
        mu_.Await(Condition(this, &WorkerPool::Ready));
        if (stopped_) return;
        job = std::move(queue_.front());
        queue_.pop_front();
      }
      job();
    }
  }

  const size_t max_queued_;
  Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

// What every connection of one server reads; lives as long as the server.
struct ServerPolicy {
  Server::Options options;
  Handler handler;
  BodyBudget* bodies = nullptr;
  WorkerPool* workers = nullptr;  // null: every handler on the I/O threads
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
        buffer_(policy.options.max_header_bytes + policy.options.max_body_bytes),
        reservation_(policy.bodies) {}

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
  using HeaderParser = bhttp::request_parser<bhttp::empty_body>;
  using BodyParser = bhttp::request_parser<bhttp::string_body>;

  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void ReadRequest(bool new_deadline) {
    if (new_deadline) {
      MarkWaiting();
      // The whole request, idle time included, within one deadline.
      Lowest().expires_after(policy_.options.request_timeout);
    }
    // The header first: the body's bytes are reserved before it is read.
    header_parser_.emplace();
    header_parser_->header_limit(static_cast<uint32_t>(policy_.options.max_header_bytes));
    header_parser_->body_limit(policy_.options.max_body_bytes);
    bhttp::async_read_header(
        stream_, buffer_, *header_parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  // Maps a read error to its answer; true when it handled `ec`.
  bool ReadFailed(beast::error_code ec) {
    const Server::Options& o = policy_.options;
    if (ec == bhttp::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset ||
        ec == ssl::error::stream_truncated) {
      Close();
      return true;
    }
    if (ec == bhttp::error::header_limit || ec == bhttp::error::buffer_overflow) {
      Refuse(431, "request header is larger than the limit of " +
                      std::to_string(o.max_header_bytes) + " bytes");
      return true;
    }
    if (ec == bhttp::error::body_limit) {
      Refuse(413, "request body is larger than the limit of " + std::to_string(o.max_body_bytes) +
                      " bytes");
      return true;
    }
    if (ec) {
      // Garbage, truncation, a bad header: the stream cannot be resynchronized.
      Refuse(400, "malformed HTTP request: " + ec.message());
      return true;
    }
    return false;
  }

  void OnHeader(beast::error_code ec) {
    waiting_ = false;
    if (ReadFailed(ec)) return;
    const auto length = header_parser_->content_length();  // boost::optional
    const uint64_t padding = policy_.options.body_padding;
    if (length && !reservation_.GrowTo(*length + padding)) return RefuseBusy();
    parser_.emplace(std::move(*header_parser_));
    header_parser_.reset();
    parser_->body_limit(policy_.options.max_body_bytes);
    // Room for the padding now, so that the handler pads in place.
    if (length && *length > 0) parser_->get().body().reserve(*length + padding);
    ReadBody();
  }

  // Reads the body in steps, reserving a chunked body's bytes as it grows.
  void ReadBody() {
    if (parser_->is_done()) return OnRead();
    bhttp::async_read_some(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (self->ReadFailed(ec)) return;
          if (!self->reservation_.GrowTo(self->parser_->get().body().capacity())) {
            return self->RefuseBusy();
          }
          self->ReadBody();
        });
  }

  void OnRead() {
    bhttp::request<bhttp::string_body>& parsed = parser_->get();
    const bool keep_alive = parsed.keep_alive();
    auto request =
        std::make_shared<Request>(Request{std::string(parsed.method_string()),
                                          std::string(parsed.target()), std::move(parsed.body())});
    parser_.reset();
    if (policy_.workers && policy_.options.offload && policy_.options.offload(*request)) {
      auto held = std::make_shared<BodyReservation>(std::move(reservation_));
      reservation_ = BodyReservation(policy_.bodies);
      const bool queued = policy_.workers->Submit(
          [self = this->shared_from_this(), request, held, keep_alive]() mutable {
            Response response = self->Handle(*request);
            request.reset();
            held.reset();
            net::post(self->stream_.get_executor(),
                      [self, response = std::move(response), keep_alive]() mutable {
                        self->Write(std::move(response), /*close=*/!keep_alive);
                      });
          });
      if (!queued) {
        if (policy_.options.on_busy) policy_.options.on_busy("queue_full");
        Write(
            Refusal(503, "every worker is busy and " + std::to_string(policy_.options.max_queued) +
                             " requests wait already; retry later"),
            /*close=*/!keep_alive);
      }
      return;
    }
    Response response = Handle(*request);
    request.reset();
    reservation_.Reset();
    Write(std::move(response), /*close=*/!keep_alive);
  }

  Response Handle(Request& request) {
    try {
      return policy_.handler(request);
    } catch (const std::exception& e) {
      spdlog::error("event=http_handler_error error=\"{}\"", e.what());
      return TextResponse(500, "internal error\n");
    }
  }

  Response Refusal(int status, const std::string& message) {
    const RefusalHandler& refusal = policy_.options.refusal;
    Response r = refusal ? refusal(status, message) : TextResponse(status, message + "\n");
    if (status == 503) r.headers.emplace_back("Retry-After", "1");
    return r;
  }

  void Refuse(int status, const std::string& message) {
    Write(Refusal(status, message), /*close=*/true);
  }

  // The bodies in flight are at the budget: 503, then what the client still
  // sends is read and dropped (bounded by request_timeout) so that it sees
  // the answer instead of a reset.
  void RefuseBusy() {
    header_parser_.reset();
    parser_.reset();
    reservation_.Reset();
    if (policy_.options.on_busy) policy_.options.on_busy("body_budget");
    draining_ = true;
    Refuse(503, "request bodies in flight are at the budget of " +
                    std::to_string(policy_.bodies->max()) + " bytes; retry later");
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
                         if (!ec && self->draining_) return self->Drain();
                         if (ec || close) return self->Close();
                         self->ReadRequest(/*new_deadline=*/true);
                       });
  }

  // Reads and drops the rest of a refused request until the client closes
  // or request_timeout passes. The connection may be evicted meanwhile.
  void Drain() {
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_send, ignored);
    MarkWaiting();
    Lowest().expires_after(policy_.options.request_timeout);
    drain_buffer_ = std::make_unique<std::array<char, 16 * 1024>>();
    DrainSome();
  }
  void DrainSome() {
    Lowest().async_read_some(net::buffer(*drain_buffer_),
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               if (ec) return self->Close();
                               self->DrainSome();
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
  std::optional<HeaderParser> header_parser_;
  std::optional<BodyParser> parser_;
  BodyReservation reservation_;
  bool draining_ = false;
  std::unique_ptr<std::array<char, 16 * 1024>> drain_buffer_;
};

class ServerImpl final : public Server {
 public:
  ServerImpl(Options options, Handler handler)
      : policy_{std::move(options), std::move(handler)},
        bodies_(policy_.options.max_total_body_bytes),
        ssl_(ssl::context::tls_server),
        acceptor_(ioc_),
        accept_timer_(ioc_) {
    policy_.bodies = &bodies_;
  }

  ~ServerImpl() override { Stop(); }

  Status Init() {
    const Options& o = policy_.options;
    if (!policy_.handler) return InvalidArgumentError("http server: no handler");
    if (o.threads < 1 || o.threads > 256) return InvalidArgumentError("threads must be 1..256");
    if (o.max_connections < 1) return InvalidArgumentError("max_connections must be at least 1");
    if (o.workers < 0 || o.workers > 256) return InvalidArgumentError("workers must be 0..256");
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
    max_connections_ = ConnectionCap();
    if (o.workers > 0 && o.offload) {
      workers_ = std::make_unique<WorkerPool>(o.workers, o.max_queued);
      policy_.workers = workers_.get();
    }
    Accept();
    for (int i = 0; i < o.threads; ++i) threads_.emplace_back([this] { RunLoop(); });
    return OkStatus();
  }

  // min(max_connections, the soft fd limit less the fds open now and
  // kFdReserve), at least 1; said in a log line.
  size_t ConnectionCap() const {
    const size_t wanted = policy_.options.max_connections;
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
      spdlog::info("event=http_connection_cap port={} max_connections={} fd_limit=unlimited", port_,
                   wanted);
      return wanted;
    }
    uint64_t open = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator("/proc/self/fd", ec);
         !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
      ++open;
    }
    const uint64_t soft = limit.rlim_cur;
    const uint64_t spare = soft > open + kFdReserve ? soft - open - kFdReserve : 1;
    const size_t cap =
        static_cast<size_t>(std::max<uint64_t>(1, std::min<uint64_t>(wanted, spare)));
    if (cap < wanted) {
      spdlog::warn(
          "event=http_connection_cap port={} max_connections={} asked={} fd_limit={} fds_open={} "
          "fd_reserve={}",
          port_, cap, wanted, soft, open, kFdReserve);
    } else {
      spdlog::info("event=http_connection_cap port={} max_connections={} fd_limit={}", port_, cap,
                   soft);
    }
    return cap;
  }

  uint16_t port() const override { return port_; }

  void Stop() override {
    MutexLock lock(&stop_mu_);
    if (stopped_) return;
    stopped_ = true;
    stopping_ = true;
    if (policy_.options.on_stop) policy_.options.on_stop();
    // Running handlers finish (told by on_stop to be quick), queued ones never run.
    if (workers_) workers_->Stop();
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

  // One accept outstanding at a time: accept_delay_ and accept_timer_ are
  // only touched by this chain.
  void Accept() {
    acceptor_.async_accept(
        net::make_strand(ioc_), [this](beast::error_code ec, tcp::socket socket) {
          if (ec == net::error::operation_aborted || stopping_) return;
          if (!ec) {
            accept_delay_ = std::chrono::milliseconds(0);
            Admit(std::move(socket));
          } else if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space ||
                     ec == net::error::no_memory || ec.value() == ENFILE) {
            return BackOff(ec);
          }
          Accept();
        });
  }

  // Out of fds or memory: the pending connection stays queued and accept
  // would fail again at once. Frees an fd and pauses accepting.
  void BackOff(beast::error_code ec) {
    bool evicted = false;
    {
      MutexLock lock(&connections_mu_);
      connections_.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
      evicted = EvictLongestWaitingLocked();
    }
    accept_delay_ = std::clamp(accept_delay_ * 2, kMinAcceptDelay, kMaxAcceptDelay);
    ++accept_failures_;
    if (auto suppressed = accept_log_.Admit("accept", std::chrono::steady_clock::now())) {
      spdlog::warn(
          "event=http_accept_backoff port={} error=\"{}\" failures_total={} delay_ms={} "
          "evicted_idle={} suppressed={}",
          port_, ec.message(), accept_failures_, accept_delay_.count(), evicted, *suppressed);
    }
    accept_timer_.expires_after(accept_delay_);
    accept_timer_.async_wait([this](beast::error_code wait_ec) {
      if (wait_ec || stopping_) return;
      Accept();
    });
  }

  void Admit(tcp::socket socket) {
    std::shared_ptr<Connection> connection;
    {
      MutexLock lock(&connections_mu_);
      connections_.remove_if([](const std::weak_ptr<Connection>& w) { return w.expired(); });
      if (connections_.size() >= max_connections_ && !EvictLongestWaitingLocked()) {
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
                   port_, max_connections_, evicted_);
    }
    return true;
  }

  static constexpr std::chrono::milliseconds kMinAcceptDelay{10};
  static constexpr std::chrono::milliseconds kMaxAcceptDelay{1000};

  ServerPolicy policy_;
  BodyBudget bodies_;
  net::io_context ioc_;
  ssl::context ssl_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_timer_;
  std::chrono::milliseconds accept_delay_{0};
  int64_t accept_failures_ = 0;
  LogRateLimiter accept_log_{1, std::chrono::seconds(10)};
  bool tls_ = false;
  uint16_t port_ = 0;
  size_t max_connections_ = 1;
  std::unique_ptr<WorkerPool> workers_;  // when some requests are offloaded
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
