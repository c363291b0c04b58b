#include "kdm/kube/client.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <charconv>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <utility>

namespace kdm::kube {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxServerMessageBytes = 512;

std::string OpenSslError() {
  unsigned long code = ERR_get_error();  // NOLINT(runtime/int): OpenSSL's type
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char buf[256];
  ERR_error_string_n(code, buf, sizeof buf);
  return buf;
}

bool IsIpAddress(const std::string& host) {
  beast::error_code ec;
  net::ip::make_address(host, ec);
  return !ec;
}

// One line, printable, capped: what a server said, fit for an error message.
std::string OneLine(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (out.size() >= kMaxServerMessageBytes) {
      out += "...";
      break;
    }
    unsigned char u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7f ? ' ' : c);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  return out;
}

std::string ServerMessage(const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object()) {
    auto it = j.find("message");
    if (it != j.end() && it->is_string()) return OneLine(it->get<std::string>());
  }
  return OneLine(body);
}

std::string FormatMs(milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

bool RetryableStatus(int status) { return status == 409 || status == 429 || status >= 500; }

// What one connection attempt ended with.
struct AttemptResult {
  // Set when an HTTP answer arrived (its body too, unless streamed).
  std::optional<Client::Response> response;
  std::optional<milliseconds> retry_after;
  // Otherwise the failure, and whether trying again could help.
  Status error;
  bool retryable = false;
  // The stream was consumed to its end (Stream only): the call is over.
  bool streamed = false;
};

std::optional<milliseconds> ParseRetryAfter(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  int64_t seconds = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
  if (ec != std::errc() || end != v.data() + v.size() || seconds < 0) return std::nullopt;
  if (seconds > 24 * 3600) seconds = 24 * 3600;
  return milliseconds(seconds * 1000);
}

class ClientImpl;

// One connection, one request, driven synchronously over Asio's async
// operations so that one timer (the deadline, or the idle bound of a
// stream) and one Cancellation can end any step of it.
class Attempt {
 public:
  Attempt(const ClientImpl& client, Clock::time_point deadline, Cancellation* cancel);
  ~Attempt();

  AttemptResult Run(const http::request<http::string_body>& request,
                    const std::function<bool(std::string_view)>* on_line,
                    milliseconds idle_timeout);

 private:
  // Runs the operation started by `initiate` to completion (or until the
  // timer or a cancel closes the connection) and returns its error.
  template <typename Initiate>
  beast::error_code Await(Initiate&& initiate) {
    bool done = false;
    beast::error_code result;
    initiate([&done, &result](beast::error_code ec, auto&&...) {
      result = ec;
      done = true;
    });
    while (!done) {
      if (ioc_.run_one() == 0) {
        ioc_.restart();
        if (!done) return net::error::operation_aborted;
      }
    }
    return result;
  }

  void ArmTimer(Clock::time_point at);
  void Close();
  AttemptResult Failure(const std::string& step, const beast::error_code& ec);
  AttemptResult ReadBody(http::response_parser<http::buffer_body>& parser,
                         const std::function<bool(std::string_view)>* on_line,
                         milliseconds idle_timeout);

  const ClientImpl& client_;
  Clock::time_point deadline_;
  Cancellation* cancel_;
  net::io_context ioc_;
  tcp::resolver resolver_{ioc_};
  ssl::stream<beast::tcp_stream> stream_;
  net::steady_timer timer_{ioc_};
  beast::flat_buffer buffer_;
  uint64_t timer_generation_ = 0;
  bool timed_out_ = false;
  bool cancelled_ = false;
  bool registered_ = false;
};

class ClientImpl final : public Client {
 public:
  ClientImpl(Options options, std::unique_ptr<ssl::context> tls)
      : options_(std::move(options)),
        tls_(std::move(tls)),
        clock_(options_.clock ? options_.clock : NewRealClock()),
        rng_(options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device()()) {}

  StatusOr<std::string> Get(std::string_view path, milliseconds timeout,
                            Cancellation* cancel) override {
    return BodyOf("GET", path, Send("GET", path, "", timeout, cancel));
  }

  StatusOr<std::string> MergePatch(std::string_view path, std::string_view json,
                                   milliseconds timeout, Cancellation* cancel) override {
    return BodyOf("PATCH", path, Send("PATCH", path, json, timeout, cancel));
  }

  StatusOr<Response> Send(std::string_view method, std::string_view path,
                          std::string_view json_body, milliseconds timeout,
                          Cancellation* cancel) override {
    StatusOr<AttemptResult> r = WithRetries(method, path, json_body, timeout, cancel, nullptr, {});
    if (!r.ok()) return r.status();
    return *r->response;
  }

  Status Stream(std::string_view path, milliseconds connect_timeout, milliseconds idle_timeout,
                const std::function<bool(std::string_view)>& on_line,
                Cancellation* cancel) override {
    StatusOr<AttemptResult> r =
        WithRetries("GET", path, "", connect_timeout, cancel, &on_line, idle_timeout);
    if (!r.ok()) return r.status();
    if (r->streamed) return r->error.WithPrefix("GET " + std::string(path));
    return StatusForResponse("GET", path, *r->response);
  }

  const Options& options() const { return options_; }
  ssl::context& tls() const { return *tls_; }

 private:
  static StatusOr<std::string> BodyOf(std::string_view method, std::string_view path,
                                      StatusOr<Response> r) {
    if (!r.ok()) return r.status();
    if (r->status / 100 != 2) return StatusForResponse(method, path, *r);
    return std::move(r->body);
  }

  StatusOr<http::request<http::string_body>> BuildRequest(std::string_view method,
                                                          std::string_view path,
                                                          std::string_view body) const {
    const ClientConfig& c = options_.config;
    http::request<http::string_body> req;
    req.method_string(std::string(method));
    req.target(c.base_path + std::string(path));
    req.version(11);
    const bool v6 = c.host.find(':') != std::string::npos;
    std::string host = v6 ? "[" + c.host + "]" : c.host;
    if (c.port != 443) host += ":" + std::to_string(c.port);
    req.set(http::field::host, host);
    req.set(http::field::user_agent, options_.user_agent);
    req.set(http::field::accept, "application/json");
    req.set(http::field::connection, "close");
    std::string token = c.token;
    if (!c.token_file.empty()) {
      // Read before every request: the kubelet rotates projected tokens.
      StatusOr<std::string> fresh = ReadTokenFile(c.token_file);
      if (!fresh.ok())
        return fresh.status().WithPrefix(std::string(method) + " " + std::string(path));
      token = std::move(*fresh);
    }
    if (!token.empty()) req.set(http::field::authorization, "Bearer " + token);
    if (method == "PATCH") {
      req.set(http::field::content_type, "application/merge-patch+json");
      req.body() = std::string(body);
    } else if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = std::string(body);
    }
    req.prepare_payload();
    return req;
  }

  milliseconds Backoff(int retry) {
    const RetryPolicy& p = options_.retry;
    int64_t base = p.initial_backoff.count();
    for (int i = 1; i < retry && base < p.max_backoff.count(); ++i) base *= 2;
    base = std::min<int64_t>(base, p.max_backoff.count());
    std::uniform_int_distribution<int64_t> jitter(0, base / 2);
    MutexLock lock(&rng_mu_);
    return milliseconds(base + jitter(rng_));
  }

  // Sleeps `d` on the clock. Returns true when the wait was cut short by
  // `cancel`: its Cancel() wakes the sleep at once.
  bool Wait(milliseconds d, Cancellation* cancel) {
    Wakeup woken;
    if (cancel != nullptr && !cancel->SetCanceller([&woken] { woken.Wake(); })) return true;
    clock_->SleepFor(d, woken);
    if (cancel == nullptr) return false;
    cancel->SetCanceller(nullptr);  // waits for a Cancel() that is running it
    return cancel->cancelled();
  }

  StatusOr<AttemptResult> WithRetries(std::string_view method, std::string_view path,
                                      std::string_view body, milliseconds timeout,
                                      Cancellation* cancel,
                                      const std::function<bool(std::string_view)>* on_line,
                                      milliseconds idle_timeout) {
    const std::string what = std::string(method) + " " + std::string(path);
    // The deadline on the injected clock; each attempt gets what is left of
    // it as a real deadline for its I/O.
    const kdm::Clock::TimePoint deadline = clock_->Now() + timeout;
    Status last;
    for (int attempt = 1;; ++attempt) {
      if (cancel != nullptr && cancel->cancelled()) return CancelledError(what + ": cancelled");
      KDM_ASSIGN_OR_RETURN(auto request, BuildRequest(method, path, body));
      const Clock::time_point io_deadline = Clock::now() + (deadline - clock_->Now());
      AttemptResult r = Attempt(*this, io_deadline, cancel).Run(request, on_line, idle_timeout);
      std::optional<milliseconds> retry_after;
      if (r.streamed) return r;
      if (r.response) {
        if (!RetryableStatus(r.response->status)) return r;
        last = StatusForResponse(method, path, *r.response);
        retry_after = r.retry_after;
      } else {
        last = r.error.WithPrefix(what);
        if (!r.retryable) return last;
      }
      if (attempt >= options_.retry.max_attempts) {
        return Status(last.code(),
                      last.message() + " (gave up after " + std::to_string(attempt) + " attempts)");
      }
      milliseconds wait =
          retry_after ? std::min(*retry_after, options_.retry.max_retry_after) : Backoff(attempt);
      if (clock_->Now() + wait >= deadline) {
        return Status(last.code(), last.message() + " (no time left for a retry in " +
                                       FormatMs(wait) + " within the " + FormatMs(timeout) +
                                       " deadline)");
      }
      if (Wait(wait, cancel)) return CancelledError(what + ": cancelled");
    }
  }

  Options options_;
  std::unique_ptr<ssl::context> tls_;
  const std::shared_ptr<kdm::Clock> clock_;
  Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);
};

Attempt::Attempt(const ClientImpl& client, Clock::time_point deadline, Cancellation* cancel)
    : client_(client), deadline_(deadline), cancel_(cancel), stream_(ioc_, client.tls()) {}

Attempt::~Attempt() {
  if (registered_) cancel_->SetCanceller(nullptr);
}

void Attempt::ArmTimer(Clock::time_point at) {
  const uint64_t generation = ++timer_generation_;
  timer_.expires_at(at);
  timer_.async_wait([this, generation](beast::error_code ec) {
    if (ec || generation != timer_generation_) return;
    timed_out_ = true;
    Close();
  });
}

void Attempt::Close() {
  resolver_.cancel();
  beast::error_code ignored;
  beast::get_lowest_layer(stream_).socket().close(ignored);
}

AttemptResult Attempt::Failure(const std::string& step, const beast::error_code& ec) {
  AttemptResult r;
  if (cancelled_) {
    r.error = CancelledError("cancelled");
  } else if (timed_out_) {
    r.error = DeadlineExceededError(step + ": no answer before the deadline");
  } else {
    r.error =
        UnavailableError(client_.options().config.ServerUrl() + ": " + step + ": " + ec.message());
    r.retryable = true;
  }
  return r;
}

AttemptResult Attempt::Run(const http::request<http::string_body>& request,
                           const std::function<bool(std::string_view)>* on_line,
                           milliseconds idle_timeout) {
  const ClientConfig& config = client_.options().config;
  if (cancel_ != nullptr) {
    registered_ = cancel_->SetCanceller([this] {
      net::post(ioc_, [this] {
        cancelled_ = true;
        Close();
      });
    });
    if (!registered_) {
      AttemptResult r;
      r.error = CancelledError("cancelled");
      return r;
    }
  }
  ArmTimer(deadline_);

  tcp::resolver::results_type endpoints;
  beast::error_code ec = Await([&](auto handler) {
    resolver_.async_resolve(
        config.host, std::to_string(config.port),
        [&endpoints, handler](beast::error_code e, tcp::resolver::results_type results) mutable {
          endpoints = std::move(results);
          handler(e);
        });
  });
  if (ec) return Failure("resolving " + config.host, ec);
  ec = Await([&](auto handler) {
    beast::get_lowest_layer(stream_).async_connect(
        endpoints, [handler](beast::error_code e, const tcp::endpoint&) mutable { handler(e); });
  });
  if (ec) return Failure("connect", ec);

  SSL* ssl = stream_.native_handle();
  if (IsIpAddress(config.host)) {
    if (!config.insecure_skip_tls_verify) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), config.host.c_str());
    }
  } else {
    SSL_set_tlsext_host_name(ssl, config.host.c_str());
    if (!config.insecure_skip_tls_verify) SSL_set1_host(ssl, config.host.c_str());
  }
  ec = Await([&](auto handler) { stream_.async_handshake(ssl::stream_base::client, handler); });
  if (ec) {
    long verify = SSL_get_verify_result(ssl);  // NOLINT(runtime/int): OpenSSL's type
    ERR_clear_error();
    if (!cancelled_ && !timed_out_ && verify != X509_V_OK) {
      AttemptResult r;
      r.error =
          UnavailableError(config.ServerUrl() + ": TLS: the server's certificate was refused: " +
                           X509_verify_cert_error_string(verify));
      return r;
    }
    return Failure("TLS handshake", ec);
  }

  ec = Await([&](auto handler) { http::async_write(stream_, request, handler); });
  if (ec) return Failure("sending the request", ec);

  http::response_parser<http::buffer_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  ec = Await([&](auto handler) { http::async_read_header(stream_, buffer_, parser, handler); });
  if (ec) return Failure("reading the answer", ec);

  const int status = static_cast<int>(parser.get().result_int());
  const bool stream_body = on_line != nullptr && status / 100 == 2;
  AttemptResult r = ReadBody(parser, stream_body ? on_line : nullptr, idle_timeout);
  if (!stream_body && r.response) {
    r.response->status = status;
    auto it = parser.get().find(http::field::retry_after);
    if (it != parser.get().end()) {
      r.retry_after = ParseRetryAfter(std::string_view(it->value().data(), it->value().size()));
    }
  }
  return r;
}

AttemptResult Attempt::ReadBody(http::response_parser<http::buffer_body>& parser,
                                const std::function<bool(std::string_view)>* on_line,
                                milliseconds idle_timeout) {
  const uint64_t max = client_.options().max_body_bytes;
  std::string data;  // the whole body, or the current partial line
  char chunk[16 * 1024];
  if (on_line != nullptr) ArmTimer(Clock::now() + idle_timeout);
  while (!parser.is_done()) {
    parser.get().body().data = chunk;
    parser.get().body().size = sizeof chunk;
    beast::error_code ec =
        Await([&](auto handler) { http::async_read_some(stream_, buffer_, parser, handler); });
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      if (on_line != nullptr) {
        AttemptResult r = Failure("reading the watch stream", ec);
        if (timed_out_) {
          r.error = DeadlineExceededError("no data on the stream for " + FormatMs(idle_timeout));
        }
        r.streamed = true;
        return r;
      }
      return Failure("reading the answer", ec);
    }
    const size_t n = sizeof chunk - parser.get().body().size;
    if (data.size() + n > max) {
      AttemptResult r;
      r.error =
          ResourceExhaustedError("the answer is larger than " + std::to_string(max) + " bytes");
      r.streamed = on_line != nullptr;
      return r;
    }
    data.append(chunk, n);
    if (on_line == nullptr) continue;
    ArmTimer(Clock::now() + idle_timeout);
    size_t start = 0;
    for (size_t nl; (nl = data.find('\n', start)) != std::string::npos; start = nl + 1) {
      std::string_view line(data.data() + start, nl - start);
      if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
      if (line.empty()) continue;
      if (!(*on_line)(line)) {
        AttemptResult r;
        r.streamed = true;
        return r;
      }
    }
    data.erase(0, start);
  }
  AttemptResult r;
  if (on_line != nullptr) {
    if (!data.empty()) (*on_line)(data);
    r.streamed = true;
    return r;
  }
  r.response = Client::Response{0, std::move(data)};
  return r;
}

// Loads every certificate of `pem` into the context's trust store.
Status AddTrustedCertificates(ssl::context& ctx, const Pem& pem) {
  BIO* bio = BIO_new_mem_buf(pem.text.data(), static_cast<int>(pem.text.size()));
  if (bio == nullptr) return InternalError(pem.origin + ": " + OpenSslError());
  STACK_OF(X509_INFO)* infos = PEM_X509_INFO_read_bio(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  if (infos == nullptr) {
    return InvalidArgumentError(pem.origin + ": not a PEM certificate (" + OpenSslError() + ")");
  }
  int added = 0;
  X509_STORE* store = SSL_CTX_get_cert_store(ctx.native_handle());
  for (int i = 0; i < sk_X509_INFO_num(infos); ++i) {
    X509_INFO* info = sk_X509_INFO_value(infos, i);
    if (info->x509 != nullptr && X509_STORE_add_cert(store, info->x509) == 1) ++added;
  }
  sk_X509_INFO_pop_free(infos, X509_INFO_free);
  ERR_clear_error();
  if (added == 0) return InvalidArgumentError(pem.origin + ": no PEM certificate in it");
  return OkStatus();
}

}  // namespace

void Cancellation::Cancel() {
  MutexLock lock(&mu_);
  cancelled_ = true;
  if (canceller_) canceller_();
}

bool Cancellation::cancelled() const {
  MutexLock lock(&mu_);
  return cancelled_;
}

bool Cancellation::SetCanceller(std::function<void()> canceller) {
  MutexLock lock(&mu_);
  if (cancelled_ && canceller) return false;
  canceller_ = std::move(canceller);
  return true;
}

Status Client::StatusForResponse(std::string_view method, std::string_view path,
                                 const Response& response) {
  const int s = response.status;
  if (s / 100 == 2) return OkStatus();
  std::string reason(http::obsolete_reason(http::int_to_status(static_cast<unsigned>(s))));
  std::string message = std::string(method) + " " + std::string(path) + ": " + std::to_string(s) +
                        (reason.empty() || reason == "<unknown-status>" ? "" : " " + reason);
  std::string said = ServerMessage(response.body);
  if (!said.empty()) message += ": " + said;
  switch (s) {
    case 401:
      return {StatusCode::kUnauthenticated, message};
    case 403:
      return PermissionDeniedError(message);
    case 404:
      return NotFoundError(message);
    case 409:
      return AbortedError(message);
    case 410:
      return FailedPreconditionError(message);
    case 429:
      return UnavailableError(message);
    default:
      if (s >= 500) return UnavailableError(message);
      return InvalidArgumentError(message);
  }
}

StatusOr<std::unique_ptr<Client>> Client::Create(Options options) {
  const ClientConfig& c = options.config;
  if (c.host.empty()) return InvalidArgumentError("kube client: the config names no server");
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  if (c.insecure_skip_tls_verify) {
    ctx->set_verify_mode(ssl::verify_none);
  } else {
    ctx->set_verify_mode(ssl::verify_peer);
    if (c.ca.empty()) {
      beast::error_code ec;
      ctx->set_default_verify_paths(ec);
      if (ec) return InternalError("kube client: the system's CA roots: " + ec.message());
    } else {
      KDM_RETURN_IF_ERROR(AddTrustedCertificates(*ctx, c.ca));
    }
  }
  if (!c.client_certificate.empty()) {
    beast::error_code ec;
    ctx->use_certificate_chain(net::buffer(c.client_certificate.text), ec);
    if (ec) {
      ERR_clear_error();
      return InvalidArgumentError(c.client_certificate.origin +
                                  ": not a PEM certificate: " + ec.message());
    }
    BIO* bio =
        BIO_new_mem_buf(c.client_key.text.data(), static_cast<int>(c.client_key.text.size()));
    EVP_PKEY* key =
        bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (key == nullptr) {
      return InvalidArgumentError(c.client_key.origin + ": not a PEM private key (" +
                                  OpenSslError() + ")");
    }
    const int used = SSL_CTX_use_PrivateKey(ctx->native_handle(), key);
    EVP_PKEY_free(key);
    if (used != 1 || SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
      return InvalidArgumentError(c.client_key.origin + ": does not match the certificate " +
                                  c.client_certificate.origin + " (" + OpenSslError() + ")");
    }
  }
  if (options.retry.max_attempts < 1) options.retry.max_attempts = 1;
  return std::unique_ptr<Client>(new ClientImpl(std::move(options), std::move(ctx)));
}

}  // namespace kdm::kube
