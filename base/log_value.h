// kdm::QuoteLogValue: makes an outside string safe to put in one key=value log
// line. kdm logs one event per line (`event=... key=value ...`); values that
// come from outside (a plugin's endpoint name, a resource name, a device id)
// may hold quotes, newlines, control bytes or megabytes of text, and must not
// be able to forge a second log line or flood the log.
//
// It is the one quoting helper for log values: callers pass kMaxLogValueBytes
// (or their own cap) for a value from outside rather than wrap it in a local
// helper of another name, so every log line reads the same.
//
// Thread-safety: a pure function.
//
// Example:
//   spdlog::warn("event=register_rejected endpoint={}",
//                kdm::QuoteLogValue(request.endpoint(), kdm::kMaxLogValueBytes));
//   // endpoint="evil\nevent=fake" stays on one line as "evil\\nevent=fake"
#ifndef KDM_BASE_LOG_VALUE_H_
#define KDM_BASE_LOG_VALUE_H_

#include <cstddef>
#include <limits>
#include <string>
#include <string_view>

namespace kdm {

// The default cap for one outside value in a log line (a device id, a
// plugin's error text, a manifest's name): enough to recognise it, too
// little to flood the log.
inline constexpr std::size_t kMaxLogValueBytes = 256;

// `text` in double quotes: '"' and '\' are backslash-escaped, \n \r \t are
// written as such, every other byte below 0x20 and 0x7f as \xNN. Bytes of
// 0x80 and above are kept (UTF-8 text stays readable). When `text` is longer
// than `max_bytes`, only its first `max_bytes` bytes are quoted, followed by
// `...(+N bytes)` outside the quotes.
std::string QuoteLogValue(std::string_view text,
                          std::size_t max_bytes = std::numeric_limits<std::size_t>::max());

}  // namespace kdm

#endif  // KDM_BASE_LOG_VALUE_H_
