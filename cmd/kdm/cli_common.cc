#include "cli_common.h"

#include <spdlog/sinks/stdout_sinks.h>

namespace kdm::cli {

void SetUpStderrLogging(const std::string& name, spdlog::level::level_enum level) {
  auto logger = spdlog::stderr_logger_mt(name);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%fZ %L %v", spdlog::pattern_time_type::utc);
  logger->set_level(level);
  logger->flush_on(spdlog::level::trace);
  spdlog::set_default_logger(logger);
}

std::string UnknownArgumentsMessage(const std::vector<std::string>& extras) {
  std::string list;
  for (const std::string& e : extras) list += (list.empty() ? "'" : ", '") + e + "'";
  return std::string("unknown argument") + (extras.size() > 1 ? "s " : " ") + list;
}

}  // namespace kdm::cli
