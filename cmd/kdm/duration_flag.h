// Duration flags of the kdm subcommands ("500ms", "10s", "5m", "1h30m").
//
// Thread-safety: a pure function.
//
// Example:
//   StatusOr<std::chrono::milliseconds> d = ParseDurationFlag("1m30s");  // 90000ms
#ifndef KDM_CMD_KDM_DURATION_FLAG_H_
#define KDM_CMD_KDM_DURATION_FLAG_H_

#include <chrono>
#include <string>

#include "kdm/base/status.h"

namespace kdm::cli {

// "300ms", "10s", "5m", "1h", "1m30s" (Go's time.ParseDuration units ms,
// s, m, h, with whole numbers), and "0". Every duration flag of every kdm
// command is read here. A whole number without a unit is refused with a
// hint ("5": "a number needs a unit (did you mean 5s? ...)"), as Go does:
// no flag reads it as seconds and another as milliseconds. INVALID_ARGUMENT
// naming the text.
StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& text);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_DURATION_FLAG_H_
