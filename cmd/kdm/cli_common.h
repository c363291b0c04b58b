// Small pieces every kdm subcommand shares: the stderr log format and the
// text of an unknown-arguments usage error.
#ifndef KDM_CMD_KDM_CLI_COMMON_H_
#define KDM_CMD_KDM_CLI_COMMON_H_

#include <string>
#include <vector>

#include <spdlog/spdlog.h>

namespace kdm::cli {

// Makes a stderr logger named `name` (UTC timestamps, one event per line,
// flushed at once) the default logger, at `level`.
void SetUpStderrLogging(const std::string& name, spdlog::level::level_enum level);

// "unknown argument 'x'" or "unknown arguments 'x', 'y'".
std::string UnknownArgumentsMessage(const std::vector<std::string>& extras);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_CLI_COMMON_H_
