#include "kdm/kube/client.h"

#include <algorithm>
#include <charconv>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <thread>
#include <utility>

#include "kdm/base/json_depth.h"
#include "kdm/base/sync.h"
#include "kdm/http/client.h"
#include "kdm/kube/exec_credential.h"

namespace kdm::kube {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr size_t kMaxServerMessageBytes = 512;
// A Status object is 3 levels deep (details.causes[]).
constexpr int kMaxStatusDepth = 16;

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

// The message of a Status object, parsed only from a whole body (not a
// truncated prefix) nested no deeper than a Status is; else the body's
// start, quoted.
std::string ServerMessage(const std::string& body, bool truncated) {
  if (truncated || FindJsonDepthViolation(body, kMaxStatusDepth)) return OneLine(body);
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

// 409 is retried for a PATCH (a conflicting write may go through next
// time), never for a create: the object exists, and posting it again would
// only meet the same answer (or, for a binding, bind twice).
bool RetryableStatus(int status, bool retry_conflict) {
  return (status == 409 && retry_conflict) || status == 429 || status >= 500;
}

std::optional<milliseconds> ParseRetryAfter(std::string_view v) {
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  int64_t seconds = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), seconds);
  if (ec != std::errc() || end != v.data() + v.size() || seconds < 0) return std::nullopt;
  if (seconds > 24 * 3600) seconds = 24 * 3600;
  return milliseconds(seconds * 1000);
}

Client::Response ToResponse(http::ClientResponse r) {
  return {r.status, std::move(r.body), r.body_truncated};
}

class ClientImpl final : public Client {
 public:
  ClientImpl(Options options, std::unique_ptr<http::HttpsClient> transport)
      : options_(std::move(options)),
        transport_(std::move(transport)),
        clock_(options_.clock ? options_.clock : NewRealClock()),
        rng_(options_.jitter_seed != 0 ? options_.jitter_seed : std::random_device()()) {
    if (options_.config.exec) {
      ExecCredentialProvider::Options exec;
      exec.config = *options_.config.exec;
      exec.clock = clock_;
      exec_ = ExecCredentialProvider::Create(std::move(exec));
    }
  }

  StatusOr<std::string> Get(std::string_view path, milliseconds timeout,
                            Cancellation* cancel) override {
    return BodyOf("GET", path, Send("GET", path, "", timeout, cancel));
  }

  Status MergePatch(std::string_view path, std::string_view json, milliseconds timeout,
                    Cancellation* cancel) override {
    // The patched object is not used: its body is not read.
    StatusOr<http::RoundTripResult> r =
        WithRetries("PATCH", path, json, timeout, cancel, nullptr, {}, /*discard_body=*/true);
    if (!r.ok()) return r.status();
    return StatusForResponse("PATCH", path, ToResponse(std::move(*r->response)));
  }

  Status Post(std::string_view path, std::string_view json, milliseconds timeout,
              Cancellation* cancel) override {
    StatusOr<http::RoundTripResult> r =
        WithRetries("POST", path, json, timeout, cancel, nullptr, {}, /*discard_body=*/true,
                    /*retry_conflict=*/false);
    if (!r.ok()) return r.status();
    return StatusForResponse("POST", path, ToResponse(std::move(*r->response)));
  }

  StatusOr<Response> Send(std::string_view method, std::string_view path,
                          std::string_view json_body, milliseconds timeout,
                          Cancellation* cancel) override {
    StatusOr<http::RoundTripResult> r =
        WithRetries(method, path, json_body, timeout, cancel, nullptr, {}, false);
    if (!r.ok()) return r.status();
    return ToResponse(std::move(*r->response));
  }

  Status Stream(std::string_view path, milliseconds connect_timeout, milliseconds idle_timeout,
                const std::function<bool(std::string_view)>& on_line,
                Cancellation* cancel) override {
    StatusOr<http::RoundTripResult> r =
        WithRetries("GET", path, "", connect_timeout, cancel, &on_line, idle_timeout, false);
    if (!r.ok()) return r.status();
    if (r->streamed) return r->error.WithPrefix("GET " + std::string(path));
    return StatusForResponse("GET", path, ToResponse(std::move(*r->response)));
  }

 private:
  static StatusOr<std::string> BodyOf(std::string_view method, std::string_view path,
                                      StatusOr<Response> r) {
    if (!r.ok()) return r.status();
    if (r->status / 100 != 2) return StatusForResponse(method, path, *r);
    return std::move(r->body);
  }

  // `token` is what was sent (for Invalidate after a 401).
  StatusOr<http::ClientRequest> BuildRequest(std::string_view method, std::string_view path,
                                             std::string_view body, std::string* sent_token) const {
    const ClientConfig& c = options_.config;
    http::ClientRequest req;
    req.method = std::string(method);
    req.target = c.base_path + std::string(path);
    req.headers = {{"User-Agent", options_.user_agent},
                   {"Accept", "application/json"},
                   {"Connection", "close"}};
    std::string token = c.token;
    if (!c.token_file.empty()) {
      // Read before every request: the kubelet rotates projected tokens.
      StatusOr<std::string> fresh = ReadTokenFile(c.token_file);
      if (!fresh.ok())
        return fresh.status().WithPrefix(std::string(method) + " " + std::string(path));
      token = std::move(*fresh);
    }
    if (exec_ != nullptr) {
      StatusOr<std::string> fresh = exec_->Token();
      if (!fresh.ok())
        return fresh.status().WithPrefix(std::string(method) + " " + std::string(path));
      token = std::move(*fresh);
    }
    *sent_token = token;
    if (!token.empty()) req.headers.emplace_back("Authorization", "Bearer " + token);
    if (method == "PATCH") {
      req.headers.emplace_back("Content-Type", "application/merge-patch+json");
      req.body = std::string(body);
    } else if (!body.empty()) {
      req.headers.emplace_back("Content-Type", "application/json");
      req.body = std::string(body);
    }
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

  StatusOr<http::RoundTripResult> WithRetries(std::string_view method, std::string_view path,
                                              std::string_view body, milliseconds timeout,
                                              Cancellation* cancel,
                                              const std::function<bool(std::string_view)>* on_line,
                                              milliseconds idle_timeout, bool discard_body,
                                              bool retry_conflict = true) {
    const std::string what = std::string(method) + " " + std::string(path);
    // The deadline on the injected clock; each attempt gets what is left of
    // it as a real deadline for its I/O.
    const kdm::Clock::TimePoint deadline = clock_->Now() + timeout;
    Status last;
    bool exec_refreshed = false;
    for (int attempt = 1;; ++attempt) {
      if (cancel != nullptr && cancel->cancelled()) return CancelledError(what + ": cancelled");
      std::string token;
      KDM_ASSIGN_OR_RETURN(auto request, BuildRequest(method, path, body, &token));
      request.discard_body = discard_body;
      const Clock::time_point io_deadline = Clock::now() + (deadline - clock_->Now());
      http::RoundTripResult r =
          transport_->RoundTrip(request, io_deadline, cancel, on_line, idle_timeout);
      std::optional<milliseconds> retry_after;
      if (r.streamed) return r;
      if (r.response && r.response->status == 401 && exec_ != nullptr && !exec_refreshed) {
        // The plugin's token was refused: run it once more, as client-go
        // does, and try again at once.
        exec_refreshed = true;
        exec_->Invalidate(token);
        --attempt;
        continue;
      }
      if (r.response) {
        if (!RetryableStatus(r.response->status, retry_conflict)) {
          if (r.response->status == 409 && attempt > 1) {
            // The 409 may be this call's own earlier attempt, applied
            // without its answer reaching us: the caller must know.
            Status conflict = StatusForResponse(method, path, ToResponse(*r.response));
            return Status(conflict.code(), conflict.message() + " (attempt " +
                                               std::to_string(attempt) +
                                               ": an earlier attempt may have been applied)");
          }
          return r;
        }
        last = StatusForResponse(method, path, ToResponse(*r.response));
        if (!r.response->retry_after.empty())
          retry_after = ParseRetryAfter(r.response->retry_after);
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
  const std::unique_ptr<http::HttpsClient> transport_;
  const std::shared_ptr<kdm::Clock> clock_;
  Mutex rng_mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(rng_mu_);
  std::unique_ptr<ExecCredentialProvider> exec_;
};

}  // namespace

Status Client::StatusForResponse(std::string_view method, std::string_view path,
                                 const Response& response) {
  const int s = response.status;
  if (s / 100 == 2) return OkStatus();
  const std::string reason = http::ReasonPhrase(s);
  std::string message = std::string(method) + " " + std::string(path) + ": " + std::to_string(s) +
                        (reason.empty() ? "" : " " + reason);
  std::string said = ServerMessage(response.body, response.body_truncated);
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
  StatusOr<std::unique_ptr<http::HttpsClient>> transport = http::HttpsClient::Create({
      .host = c.host,
      .port = c.port,
      .server_name = c.ServerUrl(),
      .tls_server_name = c.tls_server_name,
      .proxy_host = c.proxy.host,
      .proxy_port = c.proxy.port,
      .proxy_url = c.proxy.url,
      .ca = {c.ca.text, c.ca.origin},
      .insecure_skip_tls_verify = c.insecure_skip_tls_verify,
      .client_certificate = {c.client_certificate.text, c.client_certificate.origin},
      .client_key = {c.client_key.text, c.client_key.origin},
      .max_body_bytes = options.max_body_bytes,
      .max_line_bytes = options.max_line_bytes,
      .max_error_body_bytes = options.max_error_body_bytes,
  });
  if (!transport.ok()) {
    // The transport names its host; the kube client's messages name itself.
    std::string m(transport.status().message());
    if (m.rfind("https client: ", 0) == 0) m = "kube client: " + m.substr(14);
    return Status(transport.status().code(), m);
  }
  if (options.retry.max_attempts < 1) options.retry.max_attempts = 1;
  return std::unique_ptr<Client>(new ClientImpl(std::move(options), std::move(*transport)));
}

}  // namespace kdm::kube
