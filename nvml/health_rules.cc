#include "kdm/nvml/health_rules.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <limits>

#include "kdm/base/log_value.h"
#include "kdm/nvml/nvml_api.h"

namespace kdm::nvml {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

Status BadToken(std::string_view value, std::string_view token, std::string_view why) {
  return InvalidArgumentError(std::string(kDisableHealthChecksEnv) + "=" +
                              QuoteLogValue(value, kMaxLogValueBytes) + ": token " +
                              QuoteLogValue(token, kMaxLogValueBytes) + " " + std::string(why) +
                              " (expected a comma-separated list of all, xids or Xid numbers)");
}

}  // namespace

StatusOr<HealthChecks> ParseDisableHealthChecks(std::string_view value) {
  HealthChecks checks;
  if (Trim(value).empty()) return checks;
  size_t start = 0;
  while (true) {
    size_t comma = value.find(',', start);
    std::string_view raw = value.substr(
        start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
    std::string_view token = Trim(raw);
    const std::string word = Lower(token);
    if (token.empty()) {
      return BadToken(value, token, "is empty");
    } else if (word == "all") {
      checks.disabled = true;
    } else if (word == "xids") {
      checks.xids_disabled = true;
    } else {
      uint64_t xid = 0;
      auto [ptr, ec] = std::from_chars(token.data(), token.data() + token.size(), xid);
      if (ec == std::errc::result_out_of_range ||
          (ec == std::errc() && ptr == token.data() + token.size() &&
           xid > std::numeric_limits<uint32_t>::max())) {
        return BadToken(value, token, "is too large for an Xid (at most 4294967295)");
      }
      if (ec != std::errc() || ptr != token.data() + token.size()) {
        return BadToken(value, token, "is not all, xids or a decimal Xid");
      }
      checks.skipped_xids.insert(xid);
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return checks;
}

bool IsApplicationXid(uint64_t xid) {
  return std::find(std::begin(kApplicationXids), std::end(kApplicationXids), xid) !=
         std::end(kApplicationXids);
}

unsigned long long EventMaskFor(const HealthChecks& checks) {
  if (checks.disabled) return 0;
  unsigned long long mask = kEventTypeDoubleBitEccError;
  if (!checks.xids_disabled) mask |= kEventTypeXidCriticalError;
  return mask;
}

HealthVerdict ClassifyEvent(const HealthChecks& checks, unsigned long long event_type,
                            unsigned long long event_data) {
  if (checks.disabled) return {false, "health checks disabled (all)"};
  if (event_type == kEventTypeXidCriticalError) {
    const std::string xid = "Xid " + std::to_string(event_data);
    if (checks.xids_disabled) return {false, xid + " (Xid checks disabled)"};
    if (IsApplicationXid(event_data)) return {false, xid + " (application error)"};
    if (checks.skipped_xids.count(event_data)) {
      return {false, xid + " (skipped by " + kDisableHealthChecksEnv + ")"};
    }
    return {true, xid};
  }
  if (event_type == kEventTypeDoubleBitEccError) return {true, "double-bit ECC error"};
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%llx", event_type);
  return {false, "event type " + std::string(hex) + " (not a health event)"};
}

}  // namespace kdm::nvml
