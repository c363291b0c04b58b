// HttpsClient: one connection per round trip, driven synchronously over
// Asio's asynchronous operations so that one timer (the deadline, or the
// idle bound of a stream) and one Cancellation can end any step of it.
#include "kdm/http/client.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <limits>

#include "kdm/http/asio_names.h"
#include "kdm/http/response_reader.h"

namespace kdm::http {
namespace {

using namespace asio_names;  // NOLINT(build/namespaces): http/'s own short names
using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

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

std::string FormatDuration(milliseconds d) {
  if (d.count() % 1000 == 0) return std::to_string(d.count() / 1000) + "s";
  return std::to_string(d.count()) + "ms";
}

class HttpsClientImpl;

class Attempt {
 public:
  Attempt(const HttpsClientImpl& client, SteadyClock::time_point deadline, Cancellation* cancel);
  ~Attempt();

  RoundTripResult Run(const ClientRequest& request,
                      const std::function<bool(std::string_view)>* on_line,
                      milliseconds idle_timeout);

 private:
  // Runs the operation started by `initiate` to completion (or until the
  // timer or a cancel closes the connection) and returns its error.
  template <typename Initiate>
  beast::error_code Await(Initiate&& initiate) {
    // A deadline or Cancel() that ran between two steps closed nothing the
    // next step uses (a resolve already answered, a socket not yet open):
    // no step starts after either.
    if (cancelled_ || timed_out_) return net::error::operation_aborted;
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

  void ArmTimer(SteadyClock::time_point at);
  void Close();
  // CONNECT host:port through the proxy the socket is connected to; an
  // error result unless the proxy answered 2xx.
  RoundTripResult OpenTunnel();
  // The same through a SOCKS5 proxy (RFC 1928, no authentication; a host
  // name is sent as a name, resolved by the proxy).
  RoundTripResult OpenSocks5Tunnel();
  RoundTripResult Failure(const std::string& step, const beast::error_code& ec);
  RoundTripResult ReadAnswer(bool discard_body,
                             const std::function<bool(std::string_view)>* on_line,
                             milliseconds idle_timeout);

  const HttpsClientImpl& client_;
  SteadyClock::time_point deadline_;
  Cancellation* cancel_;
  net::io_context ioc_;
  tcp::resolver resolver_{ioc_};
  ssl::stream<beast::tcp_stream> stream_;
  net::steady_timer timer_{ioc_};
  uint64_t timer_generation_ = 0;
  bool timed_out_ = false;
  bool cancelled_ = false;
  bool registered_ = false;
};

class HttpsClientImpl final : public HttpsClient {
 public:
  HttpsClientImpl(Options options, std::unique_ptr<ssl::context> tls)
      : options_(std::move(options)), tls_(std::move(tls)) {}

  RoundTripResult RoundTrip(const ClientRequest& request, SteadyClock::time_point deadline,
                            Cancellation* cancel,
                            const std::function<bool(std::string_view)>* on_line,
                            milliseconds idle_timeout) override {
    return Attempt(*this, deadline, cancel).Run(request, on_line, idle_timeout);
  }

  const Options& options() const { return options_; }
  ssl::context& tls() const { return *tls_; }

 private:
  const Options options_;
  const std::unique_ptr<ssl::context> tls_;
};

Attempt::Attempt(const HttpsClientImpl& client, SteadyClock::time_point deadline,
                 Cancellation* cancel)
    : client_(client), deadline_(deadline), cancel_(cancel), stream_(ioc_, client.tls()) {}

Attempt::~Attempt() {
  if (registered_) cancel_->SetCanceller(nullptr);
}

void Attempt::ArmTimer(SteadyClock::time_point at) {
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

RoundTripResult Attempt::Failure(const std::string& step, const beast::error_code& ec) {
  RoundTripResult r;
  if (cancelled_) {
    r.error = CancelledError("cancelled");
  } else if (timed_out_) {
    r.error = DeadlineExceededError(step + ": no answer before the deadline");
  } else {
    r.error = UnavailableError(client_.options().server_name + ": " + step + ": " + ec.message());
    r.retryable = true;
  }
  return r;
}

RoundTripResult Attempt::Run(const ClientRequest& request,
                             const std::function<bool(std::string_view)>* on_line,
                             milliseconds idle_timeout) {
  const HttpsClient::Options& options = client_.options();
  if (cancel_ != nullptr) {
    registered_ = cancel_->SetCanceller([this] {
      net::post(ioc_, [this] {
        cancelled_ = true;
        Close();
      });
    });
    if (!registered_) {
      RoundTripResult r;
      r.error = CancelledError("cancelled");
      return r;
    }
  }
  ArmTimer(deadline_);

  const bool proxied = !options.proxy_host.empty();
  const std::string& connect_host = proxied ? options.proxy_host : options.host;
  const uint16_t connect_port = proxied ? options.proxy_port : options.port;
  const std::string via = proxied ? "proxy " + options.proxy_url + ": " : "";
  tcp::resolver::results_type endpoints;
  beast::error_code ec = Await([&](auto handler) {
    resolver_.async_resolve(
        connect_host, std::to_string(connect_port),
        [&endpoints, handler](beast::error_code e, tcp::resolver::results_type results) mutable {
          endpoints = std::move(results);
          handler(e);
        });
  });
  if (ec) return Failure(via + "resolving " + connect_host, ec);
  ec = Await([&](auto handler) {
    beast::get_lowest_layer(stream_).async_connect(
        endpoints, [handler](beast::error_code e, const tcp::endpoint&) mutable { handler(e); });
  });
  if (ec) return Failure(via + "connect", ec);
  if (proxied) {
    RoundTripResult tunnel =
        options.proxy_url.rfind("socks5://", 0) == 0 ? OpenSocks5Tunnel() : OpenTunnel();
    if (!tunnel.error.ok()) return tunnel;
  }

  SSL* ssl = stream_.native_handle();
  const std::string& verify_name =
      options.tls_server_name.empty() ? options.host : options.tls_server_name;
  if (IsIpAddress(verify_name)) {
    if (!options.insecure_skip_tls_verify) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), verify_name.c_str());
    }
  } else {
    SSL_set_tlsext_host_name(ssl, verify_name.c_str());
    if (!options.insecure_skip_tls_verify) SSL_set1_host(ssl, verify_name.c_str());
  }
  ec = Await([&](auto handler) { stream_.async_handshake(ssl::stream_base::client, handler); });
  if (ec) {
    long verify = SSL_get_verify_result(ssl);  // NOLINT(runtime/int): OpenSSL's type
    ERR_clear_error();
    if (!cancelled_ && !timed_out_ && verify != X509_V_OK) {
      RoundTripResult r;
      std::string why = X509_verify_cert_error_string(verify);
      if (!options.tls_server_name.empty()) {
        why += " (verified against tls-server-name \"" + options.tls_server_name + "\")";
      }
      r.error = UnavailableError(options.server_name +
                                 ": TLS: the server's certificate was refused: " + why);
      return r;
    }
    return Failure("TLS handshake", ec);
  }

  bhttp::request<bhttp::string_body> req;
  req.method_string(request.method);
  req.target(request.target);
  req.version(11);
  std::string host =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  if (options.port != 443) host += ":" + std::to_string(options.port);
  req.set(bhttp::field::host, host);
  for (const auto& [name, value] : request.headers) req.set(name, value);
  req.body() = request.body;
  req.prepare_payload();
  ec = Await([&](auto handler) { bhttp::async_write(stream_, req, handler); });
  if (ec) return Failure("sending the request", ec);

  return ReadAnswer(request.discard_body, on_line, idle_timeout);
}

RoundTripResult Attempt::OpenTunnel() {
  const HttpsClient::Options& options = client_.options();
  const std::string via = "proxy " + options.proxy_url;
  std::string authority =
      options.host.find(':') != std::string::npos ? "[" + options.host + "]" : options.host;
  authority += ":" + std::to_string(options.port);
  bhttp::request<bhttp::empty_body> connect{bhttp::verb::connect, authority, 11};
  connect.set(bhttp::field::host, authority);
  connect.set(bhttp::field::user_agent, "kdm");
  auto& socket = beast::get_lowest_layer(stream_);
  beast::error_code ec = Await([&](auto handler) { bhttp::async_write(socket, connect, handler); });
  if (ec) return Failure(via + ": sending CONNECT " + authority, ec);
  // The proxy's answer has no body; nothing follows it before our TLS
  // hello, so the buffer holds only the answer.
  beast::flat_buffer buffer(64 * 1024);
  bhttp::response_parser<bhttp::empty_body> parser;
  parser.skip(true);
  parser.header_limit(64 * 1024);
  ec = Await([&](auto handler) { bhttp::async_read_header(socket, buffer, parser, handler); });
  if (ec) return Failure(via + ": reading the answer to CONNECT " + authority, ec);
  const unsigned status = parser.get().result_int();
  RoundTripResult r;
  if (status / 100 != 2) {
    r.error = UnavailableError(via + ": CONNECT " + authority + ": " + std::to_string(status) +
                               " " + ReasonPhrase(static_cast<int>(status)));
    r.retryable = status >= 500;
    return r;
  }
  if (buffer.size() != 0) {
    r.error = UnavailableError(via + ": CONNECT " + authority +
                               ": the proxy sent bytes before the TLS handshake");
    return r;
  }
  return r;
}

RoundTripResult Attempt::OpenSocks5Tunnel() {
  const HttpsClient::Options& options = client_.options();
  const std::string via = "proxy " + options.proxy_url;
  auto& socket = beast::get_lowest_layer(stream_);
  auto write = [&](const std::string& bytes) {
    return Await([&](auto handler) {
      net::async_write(socket, net::buffer(bytes),
                       [handler](beast::error_code e, size_t) mutable { handler(e); });
    });
  };
  auto read = [&](unsigned char* out, size_t n) {
    return Await([&](auto handler) {
      net::async_read(socket, net::buffer(out, n),
                      [handler](beast::error_code e, size_t) mutable { handler(e); });
    });
  };
  auto refused = [&](const std::string& why) {
    RoundTripResult r;
    r.error = UnavailableError(via + ": " + why);
    return r;
  };
  // Greeting: version 5, one method, "no authentication".
  beast::error_code ec = write(std::string("\x05\x01\x00", 3));
  if (ec) return Failure(via + ": SOCKS5 greeting", ec);
  unsigned char choice[2];
  ec = read(choice, 2);
  if (ec) return Failure(via + ": SOCKS5 greeting", ec);
  if (choice[0] != 5) return refused("not a SOCKS5 proxy");
  if (choice[1] != 0)
    return refused("SOCKS5: the proxy wants authentication (not supported by kdm)");
  // CONNECT host:port: an address as such, a name as a name.
  std::string request("\x05\x01\x00", 3);
  beast::error_code parse_ec;
  const net::ip::address address = net::ip::make_address(options.host, parse_ec);
  if (!parse_ec && address.is_v4()) {
    auto bytes = address.to_v4().to_bytes();
    request.push_back('\x01');
    request.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } else if (!parse_ec) {
    auto bytes = address.to_v6().to_bytes();
    request.push_back('\x04');
    request.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  } else {
    if (options.host.size() > 255) return refused("SOCKS5: host name longer than 255 bytes");
    request.push_back('\x03');
    request.push_back(static_cast<char>(options.host.size()));
    request += options.host;
  }
  request.push_back(static_cast<char>(options.port >> 8));
  request.push_back(static_cast<char>(options.port & 0xff));
  ec = write(request);
  if (ec) return Failure(via + ": SOCKS5 CONNECT", ec);
  unsigned char reply[4];
  ec = read(reply, 4);
  if (ec) return Failure(via + ": SOCKS5 CONNECT", ec);
  if (reply[0] != 5) return refused("SOCKS5 CONNECT: not a SOCKS5 answer");
  if (reply[1] != 0) {
    static const char* const kReasons[] = {
        "succeeded",           "general failure",       "not allowed by the ruleset",
        "network unreachable", "host unreachable",      "connection refused",
        "TTL expired",         "command not supported", "address type not supported"};
    std::string why = reply[1] < 9 ? kReasons[reply[1]] : "code " + std::to_string(reply[1]);
    RoundTripResult r =
        refused("SOCKS5 CONNECT " + options.host + ":" + std::to_string(options.port) + ": " + why);
    r.retryable = reply[1] == 1;
    return r;
  }
  // The bound address, unused: skip it.
  size_t skip = 0;
  if (reply[3] == 1) {
    skip = 4;
  } else if (reply[3] == 4) {
    skip = 16;
  } else if (reply[3] == 3) {
    unsigned char len = 0;
    ec = read(&len, 1);
    if (ec) return Failure(via + ": SOCKS5 CONNECT", ec);
    skip = len;
  } else {
    return refused("SOCKS5 CONNECT: unknown address type in the answer");
  }
  unsigned char bound[258];
  ec = read(bound, skip + 2);
  if (ec) return Failure(via + ": SOCKS5 CONNECT", ec);
  return RoundTripResult{};
}

RoundTripResult Attempt::ReadAnswer(bool discard_body,
                                    const std::function<bool(std::string_view)>* on_line,
                                    milliseconds idle_timeout) {
  const HttpsClient::Options& options = client_.options();
  ResponseReader reader({.max_body_bytes = options.max_body_bytes,
                         .max_line_bytes = options.max_line_bytes,
                         .max_error_body_bytes = options.max_error_body_bytes,
                         .discard_body = discard_body},
                        on_line);
  char chunk[16 * 1024];
  ResponseReader::Progress progress = ResponseReader::Progress::kMore;
  while (progress == ResponseReader::Progress::kMore) {
    size_t n = 0;
    beast::error_code ec = Await([&](auto handler) {
      stream_.async_read_some(net::buffer(chunk),
                              [handler, &n](beast::error_code e, size_t k) mutable {
                                n = k;
                                handler(e);
                              });
    });
    if (ec == net::error::eof || ec == ssl::error::stream_truncated) {
      progress = reader.FeedEnd();
      break;
    }
    if (ec) {
      if (reader.streaming()) {
        RoundTripResult r = Failure("reading the watch stream", ec);
        if (timed_out_) {
          r.error =
              DeadlineExceededError("no data on the stream for " + FormatDuration(idle_timeout));
        }
        r.streamed = true;
        return r;
      }
      return Failure("reading the answer", ec);
    }
    const bool was_streaming = reader.streaming();
    progress = reader.Feed(std::string_view(chunk, n));
    // A stream is bounded by the idle time from its header on, not the
    // deadline.
    if (reader.streaming() || was_streaming) ArmTimer(SteadyClock::now() + idle_timeout);
  }
  RoundTripResult r;
  r.streamed = reader.streaming();
  if (progress == ResponseReader::Progress::kFailed) {
    const Status& e = reader.error();
    if (e.code() == StatusCode::kResourceExhausted) {
      r.error = e;
    } else {
      r.error = UnavailableError(
          options.server_name +
          (r.streamed ? ": reading the watch stream: " : ": reading the answer: ") +
          std::string(e.message()));
      r.retryable = !r.streamed;
    }
    return r;
  }
  if (r.streamed) return r;
  r.response = ClientResponse{reader.status(), reader.TakeBody(), reader.retry_after(),
                              reader.body_truncated()};
  return r;
}

// Loads every certificate of `pem` into the context's trust store.
Status AddTrustedCertificates(ssl::context& ctx, const PemSource& pem) {
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

std::string ReasonPhrase(int status) {
  if (status < 0 || status > 999) return "";
  std::string reason(bhttp::obsolete_reason(bhttp::int_to_status(static_cast<unsigned>(status))));
  return reason == "<unknown-status>" ? "" : reason;
}

StatusOr<std::unique_ptr<HttpsClient>> HttpsClient::Create(Options options) {
  if (options.host.empty()) return InvalidArgumentError("https client: no server host");
  auto ctx = std::make_unique<ssl::context>(ssl::context::tls_client);
  ctx->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                   ssl::context::no_sslv3 | ssl::context::no_tlsv1 | ssl::context::no_tlsv1_1);
  if (options.insecure_skip_tls_verify) {
    ctx->set_verify_mode(ssl::verify_none);
  } else {
    ctx->set_verify_mode(ssl::verify_peer);
    if (options.ca.text.empty()) {
      beast::error_code ec;
      ctx->set_default_verify_paths(ec);
      if (ec) return InternalError("https client: the system's CA roots: " + ec.message());
    } else {
      KDM_RETURN_IF_ERROR(AddTrustedCertificates(*ctx, options.ca));
    }
  }
  const PemSource& cert = options.client_certificate;
  const PemSource& key = options.client_key;
  if (!cert.text.empty()) {
    beast::error_code ec;
    ctx->use_certificate_chain(net::buffer(cert.text), ec);
    if (ec) {
      ERR_clear_error();
      return InvalidArgumentError(cert.origin + ": not a PEM certificate: " + ec.message());
    }
    BIO* bio = BIO_new_mem_buf(key.text.data(), static_cast<int>(key.text.size()));
    EVP_PKEY* pkey =
        bio == nullptr ? nullptr : PEM_read_bio_PrivateKey(bio, nullptr, nullptr, nullptr);
    BIO_free(bio);
    if (pkey == nullptr) {
      return InvalidArgumentError(key.origin + ": not a PEM private key (" + OpenSslError() + ")");
    }
    const int used = SSL_CTX_use_PrivateKey(ctx->native_handle(), pkey);
    EVP_PKEY_free(pkey);
    if (used != 1 || SSL_CTX_check_private_key(ctx->native_handle()) != 1) {
      return InvalidArgumentError(key.origin + ": does not match the certificate " + cert.origin +
                                  " (" + OpenSslError() + ")");
    }
  }
  return std::unique_ptr<HttpsClient>(new HttpsClientImpl(std::move(options), std::move(ctx)));
}

}  // namespace kdm::http
