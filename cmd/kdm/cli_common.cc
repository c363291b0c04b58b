#include "cli_common.h"

#include <grpc/support/log.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "kdm/base/log_value.h"
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

std::string UnknownArgumentsMessage(const std::vector<std::string>& extras) {
  std::string list;
  for (const std::string& e : extras) list += (list.empty() ? "'" : ", '") + e + "'";
  return std::string("unknown argument") + (extras.size() > 1 ? "s " : " ") + list;
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

}  // namespace kdm::cli
