// NVIDIA's GPU health rules, as kdm applies them to NVML events: which event
// makes a GPU unhealthy, and what the DP_DISABLE_HEALTHCHECKS environment
// variable turns off. Pure functions of their arguments, no NVML calls; the
// HealthMonitor (health_monitor.h) feeds them the events it waits for.
// docs/nvml.md ("Health rules") describes the rules for operators.
//
// The rules (those of NVIDIA's device plugin):
//  - a critical Xid event (type 0x8) whose Xid is an application error, 13,
//    31, 43, 45, 68 or 109, leaves the GPU healthy; so does an Xid listed in
//    DP_DISABLE_HEALTHCHECKS;
//  - any other critical Xid makes the GPU unhealthy;
//  - a double-bit ECC event (type 0x2) makes it unhealthy;
//  - a GPU that NVML reports lost (return 15) is unhealthy;
//  - any other event type is ignored.
//
// DP_DISABLE_HEALTHCHECKS: a comma-separated list of tokens, each `all`,
// `xids` (either case) or a decimal Xid; spaces around a token are allowed.
// Forms mix: "xids,48" is allowed (the numbers are then moot but still
// checked). `all` turns the health monitor off (no event set is created;
// every GPU stays healthy). `xids` ignores every Xid event but keeps
// double-bit ECC and lost GPUs (NVIDIA's plugin treats `xids` like `all`;
// kdm keeps the two checks that are not about Xids). Unset or empty: the
// default rules. Anything else (an empty token, a word, a sign, a number past
// 2^32-1) is INVALID_ARGUMENT naming the token.
//
// Thread-safety: pure functions; a HealthChecks value is immutable.
//
// Example:
//   StatusOr<HealthChecks> checks = ParseDisableHealthChecks(getenv(...) ?: "");
//   if (!checks.ok()) return checks.status();
//   HealthVerdict v = ClassifyEvent(*checks, kEventTypeXidCriticalError, 79);
//   // v.unhealthy == true, v.reason == "Xid 79"
#ifndef KDM_NVML_HEALTH_RULES_H_
#define KDM_NVML_HEALTH_RULES_H_

#include <cstdint>
#include <set>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::nvml {

// The environment variable NVIDIA's plugin reads, and kdm with it.
inline constexpr char kDisableHealthChecksEnv[] = "DP_DISABLE_HEALTHCHECKS";

// The Xids NVIDIA counts as application errors: the GPU stays healthy.
inline constexpr uint64_t kApplicationXids[] = {13, 31, 43, 45, 68, 109};

// What DP_DISABLE_HEALTHCHECKS turned off.
struct HealthChecks {
  // `all`: no health monitoring at all.
  bool disabled = false;
  // `xids`: Xid events are ignored (ECC and lost GPUs still count).
  bool xids_disabled = false;
  // Extra Xids to treat like application errors.
  std::set<uint64_t> skipped_xids;

  friend bool operator==(const HealthChecks&, const HealthChecks&) = default;
};

// Parses the value of DP_DISABLE_HEALTHCHECKS (see above). INVALID_ARGUMENT
// naming the variable and the bad token.
StatusOr<HealthChecks> ParseDisableHealthChecks(std::string_view value);

// True for the application Xids (kApplicationXids).
bool IsApplicationXid(uint64_t xid);

// The NVML event types to register (before ANDing with what a GPU supports):
// Xid critical errors and double-bit ECC, without Xids when xids_disabled;
// 0 when disabled.
unsigned long long EventMaskFor(const HealthChecks& checks);

struct HealthVerdict {
  bool unhealthy = false;
  // Why, for the log: "Xid 79", "double-bit ECC error", "Xid 43 (application
  // error)", "Xid 48 (skipped by DP_DISABLE_HEALTHCHECKS)", "event type 0x1".
  std::string reason;
};

// The verdict on one event of nvmlEventSetWait_v2 (its eventType and
// eventData).
HealthVerdict ClassifyEvent(const HealthChecks& checks, unsigned long long event_type,
                            unsigned long long event_data);

}  // namespace kdm::nvml

#endif  // KDM_NVML_HEALTH_RULES_H_
