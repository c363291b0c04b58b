#include "kdm/kube/exec_credential.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "kdm/base/file_system.h"
#include "kdm/base/json_depth.h"
#include "kdm/base/log_value.h"
#include "kdm/base/subprocess.h"
#include "kdm/base/sync.h"

namespace kdm::kube {
namespace {

// An ExecCredential is 3 levels deep.
constexpr int kMaxExecCredentialDepth = 16;
constexpr size_t kQuotedOutputBytes = 64;

bool IsExecutableFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

// kubectl's resolution: absolute as is; with a '/', against the
// kubeconfig's directory; a bare name through PATH.
StatusOr<std::string> ResolveCommand(const ExecConfig& c) {
  auto not_found = [&c](const std::string& what) {
    std::string m = "exec plugin of " + c.who + ": " + what;
    if (!c.install_hint.empty()) m += "; installHint: " + QuoteLogValue(c.install_hint, 1024);
    return NotFoundError(m);
  };
  if (c.command.find('/') != std::string::npos) {
    std::string path = c.command.front() == '/' ? c.command : JoinPath(c.kubeconfig_dir, c.command);
    if (!IsExecutableFile(path)) {
      return not_found("command " + QuoteLogValue(path, 512) + " is not an executable file");
    }
    return path;
  }
  const char* env_path = std::getenv("PATH");
  std::string search = env_path != nullptr ? env_path : "/usr/local/bin:/usr/bin:/bin";
  size_t begin = 0;
  while (begin <= search.size()) {
    size_t end = search.find(':', begin);
    if (end == std::string::npos) end = search.size();
    std::string dir = search.substr(begin, end - begin);
    begin = end + 1;
    std::string candidate = JoinPath(dir.empty() ? "." : dir, c.command);
    if (IsExecutableFile(candidate)) return candidate;
  }
  return not_found("command " + QuoteLogValue(c.command, 256) + " not found in PATH");
}

int64_t DaysFromCivil(int64_t y, unsigned m, unsigned d) {
  y -= m <= 2;
  const int64_t era = (y >= 0 ? y : y - 399) / 400;
  const unsigned yoe = static_cast<unsigned>(y - era * 400);
  const unsigned doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
  const unsigned doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  return era * 146097 + static_cast<int64_t>(doe) - 719468;
}

struct Output {
  std::string stdout_text;
  Status error;
};

class ProviderImpl final : public ExecCredentialProvider {
 public:
  explicit ProviderImpl(Options options)
      : options_(std::move(options)), clock_(options_.clock ? options_.clock : NewRealClock()) {}

  StatusOr<std::string> Token() override {
    MutexLock lock(&mu_);
    if (!token_.empty() &&
        (!expiry_ || std::chrono::system_clock::to_time_t(clock_->WallNow()) < *expiry_)) {
      return token_;
    }
    token_.clear();
    expiry_.reset();
    ++runs_;
    StatusOr<std::string> out = Run();
    if (!out.ok()) return out.status();
    KDM_RETURN_IF_ERROR(Decode(*out));
    const int64_t now = std::chrono::system_clock::to_time_t(clock_->WallNow());
    spdlog::info("event=exec_credential_run user={} runs={} expires_in_s={}",
                 QuoteLogValue(options_.config.who, kMaxLogValueBytes), runs_,
                 expiry_ ? std::to_string(*expiry_ - now) : std::string("never"));
    return token_;
  }

  void Invalidate(const std::string& token) override {
    MutexLock lock(&mu_);
    if (token_ == token) {
      token_.clear();
      expiry_.reset();
    }
  }

  int runs() const override {
    MutexLock lock(&mu_);
    return runs_;
  }

 private:
  Status Fail(StatusCode code, const std::string& why) const {
    return Status(code, "exec plugin of " + options_.config.who + ": " + why);
  }

  // Reads the plugin's stdout into token_ and expiry_.
  Status Decode(const std::string& out) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const StatusCode bad = StatusCode::kUnauthenticated;
    if (out.find_first_not_of(" \t\r\n") == std::string::npos) {
      return Fail(bad, "printed nothing on stdout (an ExecCredential was expected)");
    }
    nlohmann::json j;
    if (!FindJsonDepthViolation(out, kMaxExecCredentialDepth)) {
      j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
    } else {
      j = nlohmann::json::value_t::discarded;
    }
    if (j.is_discarded()) {
      return Fail(bad, "stdout is not JSON: " + QuoteLogValue(out, kQuotedOutputBytes));
    }
    if (!j.is_object()) return Fail(bad, "stdout is not an ExecCredential object");
    auto str = [&j](const char* key) -> std::optional<std::string> {
      auto it = j.find(key);
      if (it == j.end() || !it->is_string()) return std::nullopt;
      return it->get<std::string>();
    };
    const std::string& want = options_.config.api_version;
    std::optional<std::string> api_version = str("apiVersion");
    if (!api_version || *api_version != want) {
      return Fail(bad,
                  "apiVersion " +
                      (api_version ? QuoteLogValue(*api_version, 128) : std::string("missing")) +
                      ", expected " + QuoteLogValue(want));
    }
    std::optional<std::string> kind = str("kind");
    if (!kind || *kind != "ExecCredential") {
      return Fail(bad, "kind " + (kind ? QuoteLogValue(*kind, 128) : std::string("missing")) +
                           ", expected \"ExecCredential\"");
    }
    auto status = j.find("status");
    if (status == j.end() || status->is_null()) return Fail(bad, "status: missing");
    if (!status->is_object()) return Fail(bad, "status: not an object");
    for (const char* key : {"clientCertificateData", "clientKeyData"}) {
      auto it = status->find(key);
      if (it != status->end() && !it->is_null()) {
        return Fail(bad, std::string("status.") + key +
                             ": a client certificate from a plugin is not supported by kdm "
                             "(print status.token)");
      }
    }
    auto token = status->find("token");
    if (token == status->end() || token->is_null()) return Fail(bad, "status.token: missing");
    if (!token->is_string()) return Fail(bad, "status.token: not a string");
    std::string t = token->get<std::string>();
    if (t.empty()) return Fail(bad, "status.token: empty");
    for (char c : t) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
        return Fail(bad, "status.token: holds a control character");
      }
    }
    std::optional<int64_t> expiry;
    auto exp = status->find("expirationTimestamp");
    if (exp != status->end() && !exp->is_null()) {
      if (!exp->is_string()) return Fail(bad, "status.expirationTimestamp: not a string");
      expiry = ParseRfc3339(exp->get<std::string>());
      if (!expiry) {
        return Fail(bad, "status.expirationTimestamp: " +
                             QuoteLogValue(exp->get<std::string>(), 64) + " is not RFC 3339");
      }
    }
    token_ = std::move(t);
    expiry_ = expiry;
    return OkStatus();
  }

  // Runs the plugin; its stdout.
  StatusOr<std::string> Run() const {
    const ExecConfig& c = options_.config;
    KDM_ASSIGN_OR_RETURN(std::string path, ResolveCommand(c));

    // The environment: kdm's, the config's env over it, then the input.
    SubprocessOptions o;
    o.argv = {path};
    o.argv.insert(o.argv.end(), c.args.begin(), c.args.end());
    for (const auto& [n, v] : c.env) o.extra_env[n] = v;
    o.extra_env["KUBERNETES_EXEC_INFO"] = c.exec_info_json;
    o.timeout = options_.timeout;
    o.max_output_bytes = options_.max_output_bytes;
    o.kill_past_max_output = true;
    o.inherit_stderr = true;  // the plugin's own words reach the user as it writes them
    StatusOr<SubprocessResult> r = RunSubprocess(o);
    if (!r.ok()) {
      return Fail(StatusCode::kUnauthenticated,
                  "cannot run " + QuoteLogValue(path, 512) + ": " + r.status().message());
    }
    if (r->timed_out) {
      return Fail(StatusCode::kDeadlineExceeded, "no answer within " +
                                                     std::to_string(options_.timeout.count()) +
                                                     " ms; its process group was killed");
    }
    if (r->output_overflow) {
      return Fail(StatusCode::kUnauthenticated,
                  "printed more than " + std::to_string(options_.max_output_bytes) +
                      " bytes on stdout; its process group was killed");
    }
    if (r->term_signal != 0) {
      return Fail(StatusCode::kUnauthenticated,
                  "killed by signal " + std::to_string(r->term_signal));
    }
    if (r->exit_code != 0) {
      return Fail(StatusCode::kUnauthenticated,
                  "exited with status " + std::to_string(r->exit_code) + " (its stderr is above)");
    }
    return std::move(r->stdout_text);
  }

  const Options options_;
  const std::shared_ptr<kdm::Clock> clock_;
  mutable Mutex mu_;
  std::string token_ ABSL_GUARDED_BY(mu_);
  std::optional<int64_t> expiry_ ABSL_GUARDED_BY(mu_);
  int runs_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

std::optional<int64_t> ParseRfc3339(std::string_view t) {
  // YYYY-MM-DDTHH:MM:SS[.frac](Z|+HH:MM|-HH:MM)
  auto num = [&t](size_t at, size_t len) -> std::optional<int> {
    if (at + len > t.size()) return std::nullopt;
    int v = 0;
    for (size_t i = at; i < at + len; ++i) {
      if (t[i] < '0' || t[i] > '9') return std::nullopt;
      v = v * 10 + (t[i] - '0');
    }
    return v;
  };
  auto sep = [&t](size_t at, std::string_view chars) {
    return at < t.size() && chars.find(t[at]) != std::string_view::npos;
  };
  auto y = num(0, 4), mo = num(5, 2), d = num(8, 2), h = num(11, 2), mi = num(14, 2),
       s = num(17, 2);
  if (!y || !mo || !d || !h || !mi || !s || !sep(4, "-") || !sep(7, "-") || !sep(10, "Tt") ||
      !sep(13, ":") || !sep(16, ":")) {
    return std::nullopt;
  }
  if (*mo < 1 || *mo > 12 || *d < 1 || *d > 31 || *h > 23 || *mi > 59 || *s > 60) {
    return std::nullopt;
  }
  size_t at = 19;
  if (sep(at, ".")) {
    ++at;
    const size_t digits = at;
    while (at < t.size() && t[at] >= '0' && t[at] <= '9') ++at;
    if (at == digits) return std::nullopt;
  }
  int offset = 0;
  if (sep(at, "Zz")) {
    ++at;
  } else if (sep(at, "+-")) {
    auto oh = num(at + 1, 2), om = num(at + 4, 2);
    if (!oh || !om || !sep(at + 3, ":") || *oh > 23 || *om > 59) return std::nullopt;
    offset = (*oh * 60 + *om) * 60 * (t[at] == '-' ? -1 : 1);
    at += 6;
  } else {
    return std::nullopt;
  }
  if (at != t.size()) return std::nullopt;
  return DaysFromCivil(*y, static_cast<unsigned>(*mo), static_cast<unsigned>(*d)) * 86400 +
         *h * 3600 + *mi * 60 + *s - offset;
}

std::unique_ptr<ExecCredentialProvider> ExecCredentialProvider::Create(Options options) {
  return std::make_unique<ProviderImpl>(std::move(options));
}

}  // namespace kdm::kube
