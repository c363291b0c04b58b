#include "cli_common.h"

#include <grpc/support/log.h>
#include <poll.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <thread>

#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::cli {
namespace {

void GrpcLogToSpdlog(gpr_log_func_args* args) {
  spdlog::debug("event=grpc_core_log severity={} file={}:{} message={}",
                gpr_log_severity_string(args->severity), args->file, args->line,
                QuoteLogValue(args->message ? args->message : ""));
}

}  // namespace

void SetUpStderrLogging(const std::string& name, spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_logger_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %L %v", spdlog::pattern_time_type::utc);
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

void RaiseFdLimit() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("event=fd_limit_unchanged error=\"{}\"", std::strerror(errno));
    return;
  }
  auto text = [](rlim_t v) {
    return v == RLIM_INFINITY ? std::string("unlimited") : std::to_string(v);
  };
  if (limit.rlim_cur == limit.rlim_max) {
    spdlog::info("event=fd_limit_unchanged limit={} reason=at_hard_limit", text(limit.rlim_cur));
    return;
  }
  const rlim_t from = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    spdlog::warn("event=fd_limit_unchanged limit={} hard={} error=\"{}\"", text(from),
                 text(limit.rlim_max), std::strerror(errno));
    return;
  }
  spdlog::info("event=fd_limit_raised from={} to={}", text(from), text(limit.rlim_cur));
}

StatusOr<std::string> AbsolutePathFlag(std::string_view flag, const std::string& value) {
  if (value.empty()) return std::string();
  std::error_code ec;
  std::filesystem::path abs = std::filesystem::absolute(value, ec);
  if (ec) {
    return InvalidArgumentError(std::string(flag) + ": cannot make " + value +
                                " absolute: " + ec.message());
  }
  return abs.lexically_normal().string();
}

Status CheckSocketPathFlag(std::string_view flag, const std::string& socket) {
  StatusOr<std::string> abs = pluginapi::AbsoluteSocketPath(socket);
  if (!abs.ok()) return abs.status().WithPrefix(flag);
  return OkStatus();
}

StatusOr<http::ListenAddress> ParseListenFlag(std::string_view flag, const std::string& value) {
  if (!value.empty() && value.size() <= 5 &&
      value.find_first_not_of("0123456789") == std::string::npos) {
    return InvalidArgumentError(std::string(flag) + " \"" + value +
                                "\": a bare port; did you mean ':" + value +
                                "'? (HOST:PORT, e.g. 127.0.0.1:" + value + ", [::1]:" + value +
                                " or :" + value + " for every address)");
  }
  return http::ParseListenAddress(value, flag);
}

Status MakeDirectoryFlag(std::string_view flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return UnavailableError(std::string(flag) + ": cannot create directory " + dir + ": " +
                            ec.message());
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return FailedPreconditionError(std::string(flag) + ": " + dir + " is not a directory");
  }
  return OkStatus();
}

void RouteGrpcLogsToDebug() { gpr_set_log_function(GrpcLogToSpdlog); }

StatusOr<std::map<std::string, k8s::DeviceAttributes>> ParseResourceAttributes(
    const std::vector<std::string>& values) {
  std::map<std::string, k8s::DeviceAttributes> out;
  for (const std::string& value : values) {
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("--attributes " + QuoteLogValue(value, kMaxLogValueBytes) + ": " +
                                  why +
                                  " (expected RESOURCE=KEY=VALUE[,KEY=VALUE...], e.g. "
                                  "nvidia.com/gpu=cuda=12.4,driver=550.54.15)");
    };
    size_t eq = value.find('=');
    if (eq == std::string::npos) return bad("no '='");
    std::string resource = value.substr(0, eq);
    if (!k8s::IsExtendedResourceName(resource)) {
      return bad(QuoteLogValue(resource, kMaxLogValueBytes) +
                 " is not an extended resource name (domain/name)");
    }
    if (out.count(resource)) return bad("resource " + resource + " given twice");
    StatusOr<k8s::DeviceAttributes> attrs = k8s::ParseAttributes(value.substr(eq + 1));
    if (!attrs.ok()) return bad(attrs.status().message());
    out[resource] = *std::move(attrs);
  }
  return out;
}

struct StopSignals::State {
  kdm::Mutex mu;
  int first ABSL_GUARDED_BY(mu) = 0;
  bool HasFirst() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return first != 0; }
};

std::string StopSignalName(int sig) {
  if (sig == SIGINT) return "SIGINT";
  if (sig == SIGTERM) return "SIGTERM";
  return "signal " + std::to_string(sig);
}

namespace {

// The second stop signal: out at once. No spdlog (its lock may be held by a
// thread blocked on a full stderr); one write, only if it cannot block.
[[noreturn]] void ExitOnSecondSignal(const std::string& command, int sig) {
  const int code = 128 + sig;
  const std::string line = command + ": event=stop_forced signal=" + StopSignalName(sig) +
                           " exit_code=" + std::to_string(code) + "\n";
  pollfd out{STDERR_FILENO, POLLOUT, 0};
  if (::poll(&out, 1, 0) == 1 && (out.revents & POLLOUT) != 0) {
    // At most PIPE_BUF bytes: a pipe that polls writable takes it whole.
    (void)!::write(STDERR_FILENO, line.data(), std::min<size_t>(line.size(), PIPE_BUF));
  }
  // The exit_group system call itself, not _exit(): a sanitizer's _exit
  // flushes stdio first, and stderr's lock is held by the thread blocked on
  // the full pipe (the TSAN build hung here).
  ::syscall(SYS_exit_group, code);
  ::_exit(code);  // not reached
}

}  // namespace

StopSignals::StopSignals(std::string command) : state_(std::make_shared<State>()) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([state = state_, signals, command = std::move(command)] {
    while (true) {
      int sig = 0;
      if (sigwait(&signals, &sig) != 0) continue;
      {
        kdm::MutexLock lock(&state->mu);
        if (state->first == 0) {
          state->first = sig;
          continue;
        }
      }
      ExitOnSecondSignal(command, sig);
    }
  }).detach();
}

int StopSignals::Wait() {
  kdm::MutexLock lock(&state_->mu, kdm::Condition(state_.get(), &State::HasFirst));
  return state_->first;
}

int StopSignals::WaitFor(std::chrono::milliseconds timeout) {
  kdm::MutexLock lock(&state_->mu);
  state_->mu.AwaitWithTimeout(kdm::Condition(state_.get(), &State::HasFirst),
                              absl::FromChrono(timeout));
  return state_->first;
}

int StopSignals::received() const {
  kdm::MutexLock lock(&state_->mu);
  return state_->first;
}

}  // namespace kdm::cli
