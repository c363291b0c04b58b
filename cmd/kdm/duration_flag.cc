#include "duration_flag.h"

#include <cctype>
#include <cstdint>

namespace kdm::cli {

StatusOr<std::chrono::milliseconds> ParseDurationFlag(const std::string& text) {
  auto bad = [&](const std::string& why) {
    return InvalidArgumentError("invalid duration \"" + text + "\": " + why +
                                " (examples: 300ms, 10s, 5m, 1h30m)");
  };
  if (text.empty()) return bad("empty");
  // Go's time.ParseDuration takes a bare "0"; any other bare number is
  // refused, so that "5" is never read as 5 ms by one flag and 5 s by another.
  if (text == "0") return std::chrono::milliseconds(0);
  int64_t total = 0;
  size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) return bad("expected a number");
    int64_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      n = n * 10 + (text[i] - '0');
      if (n > 1'000'000'000) return bad("too large");
      ++i;
    }
    size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    std::string unit = text.substr(unit_start, i - unit_start);
    int64_t ms;
    if (unit == "ms") {
      ms = 1;
    } else if (unit == "s") {
      ms = 1000;
    } else if (unit == "m") {
      ms = 60'000;
    } else if (unit == "h") {
      ms = 3'600'000;
    } else if (unit.empty()) {
      if (unit_start == text.size() && text.find_first_not_of("0123456789") == std::string::npos) {
        return InvalidArgumentError("invalid duration \"" + text +
                                    "\": a number needs a unit (did you mean " + text +
                                    "s? units: ms, s, m, h)");
      }
      return bad("missing unit");
    } else {
      return bad("unknown unit \"" + unit + "\"");
    }
    total += n * ms;
    if (total > int64_t{1'000'000'000'000}) return bad("too large");
  }
  return std::chrono::milliseconds(total);
}

}  // namespace kdm::cli
