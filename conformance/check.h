// kdm::conformance: the catalogue of checks `kdm conform` runs against one
// device plugin, and the shape of one check's result.
//
// Every check has a stable id ("<group>.<name>", e.g. "alloc.permissions"),
// a one-line description and the section of docs/ that states the rule it enforces. The catalogue's
// order is the order the checks run in (reg.restart last: it disturbs the
// plugin). docs/conformance.md lists the same table, with the `kdm plugin
// --fault` mode that breaks each check.
//
// Thread-safety: Catalogue() returns an immutable table; safe from any thread.
//
// Example:
//   for (const CheckInfo& c : Catalogue()) std::cout << c.id << "\n";
//   const CheckInfo* info = FindCheck("lw.health");  // nullptr if unknown
#ifndef KDM_CONFORMANCE_CHECK_H_
#define KDM_CONFORMANCE_CHECK_H_

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

namespace kdm::conformance {

struct CheckInfo {
  std::string id;           // e.g. "reg.version"
  std::string description;  // one line: what a passing plugin does
  std::string spec_clause;  // e.g. "docs/kubelet-rules.md#registration"
};

// Every check, in the order they run.
const std::vector<CheckInfo>& Catalogue();

// The catalogue entry with this id, or nullptr.
const CheckInfo* FindCheck(std::string_view id);

// "reg" for "reg.version": the id's group (JUnit classname).
std::string_view CheckGroup(std::string_view id);

enum class Verdict { kPass, kFail, kSkip };

// "PASS", "FAIL" or "SKIP".
std::string_view VerdictName(Verdict verdict);

struct CheckResult {
  CheckInfo info;
  Verdict verdict = Verdict::kSkip;
  // Why: what was observed (PASS), what was wrong (FAIL), or which
  // prerequisite was missing (SKIP). One line.
  std::string reason;
  std::chrono::milliseconds duration{0};
};

}  // namespace kdm::conformance

#endif  // KDM_CONFORMANCE_CHECK_H_
