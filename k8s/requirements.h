// Device requirements: the `NVIDIA_REQUIRE_*` variables of CUDA images
// (e.g. NVIDIA_REQUIRE_CUDA="cuda>=12.2 brand=tesla,driver>=470,driver<471"),
// parsed and checked against a device's attributes.
//
// Grammar (docs/publish.md, "Requirement checks"):
// - a constraint is `KEY OP VERSION` (KEY one of cuda, driver, arch; OP one
//   of =, ==, !=, <, <=, >, >=) or `brand OP NAME` (OP =, == or !=);
// - constraints joined by commas form a group: every one must hold;
// - groups separated by blanks (spaces, tabs): at least one must hold;
// - several NVIDIA_REQUIRE_* variables of one container: every one must hold;
// - NVIDIA_DISABLE_REQUIRE=true (or 1) turns the check off.
// Versions are dot-separated decimal numbers compared part by part, numerically
// (12.10 > 12.9), a missing part counting as 0 (12 == 12.0). Brands compare
// without regard to case.
//
// Thread-safety: pure functions and values; safe from any thread.
//
// Example:
//   auto set = ParseRequirementEnv({{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"}});
//   if (!set.ok()) return set.status();  // names the bad token
//   kdm::Status met = CheckRequirements(*set, DeviceAttributes{.cuda = "11.8"});
//   // met: FAILED_PRECONDITION "NVIDIA_REQUIRE_CUDA: cuda 11.8 does not
//   //      satisfy cuda>=12.2"
#ifndef KDM_K8S_REQUIREMENTS_H_
#define KDM_K8S_REQUIREMENTS_H_

#include <cstddef>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/k8s/attributes.h"

namespace kdm::k8s {

// The prefix of the variables that carry requirements.
inline constexpr std::string_view kRequirePrefix = "NVIDIA_REQUIRE_";
// The variable that turns every check of a container off.
inline constexpr std::string_view kDisableRequire = "NVIDIA_DISABLE_REQUIRE";
// The longest requirement value parsed; longer ones are refused.
inline constexpr size_t kMaxRequirementBytes = 4096;
// The longest version (digits and dots) compared.
inline constexpr size_t kMaxVersionBytes = 64;

enum class RequirementOp { kEq, kNe, kLt, kLe, kGt, kGe };

// "==" for kEq ("=" parses to kEq too), "!=", "<", "<=", ">", ">=".
std::string_view RequirementOpName(RequirementOp op);

struct Constraint {
  std::string key;  // kAttrCuda, kAttrDriver, kAttrArch or kAttrBrand
  RequirementOp op = RequirementOp::kEq;
  std::string value;  // a version, or a brand name
  std::string text;   // the constraint as written, for messages
  friend bool operator==(const Constraint&, const Constraint&) = default;
};

// One variable: OR over groups, AND within a group.
struct Requirement {
  std::string variable;  // e.g. "NVIDIA_REQUIRE_CUDA"
  std::vector<std::vector<Constraint>> groups;
  friend bool operator==(const Requirement&, const Requirement&) = default;
};

// Every requirement of one container (AND), or none when disabled.
struct RequirementSet {
  bool disabled = false;
  std::vector<Requirement> requirements;
  bool empty() const { return disabled || requirements.empty(); }
};

// Parses one variable's value. A blank value gives a Requirement with no
// groups (no requirement). On error: INVALID_ARGUMENT naming the variable
// and the token ("NVIDIA_REQUIRE_CUDA: unknown key 'cdua' in 'cdua>=12'").
StatusOr<Requirement> ParseRequirement(std::string_view variable, std::string_view value);

// Picks the NVIDIA_REQUIRE_* variables (and NVIDIA_DISABLE_REQUIRE) out of a
// container's environment, in the order given, and parses each. When the
// container disables the check, its requirements are not parsed (a malformed
// one cannot reject it). Errors as ParseRequirement.
StatusOr<RequirementSet> ParseRequirementEnv(
    const std::vector<std::pair<std::string, std::string>>& env);

// Compares two versions: <0, 0 or >0. INVALID_ARGUMENT when either is not a
// version (empty, a character other than digits and dots, an empty part, or
// longer than kMaxVersionBytes).
StatusOr<int> CompareVersions(std::string_view a, std::string_view b);

// Checks one constraint against the node's attributes (cuda, driver, arch,
// brand). OK when it holds; FAILED_PRECONDITION naming
// the node's value and the constraint otherwise: "cuda 11.8 does not satisfy
// cuda>=12.2", "cuda is not known on this node, required by cuda>=12.2",
// "cuda 'x' on this node is not a version, required by cuda>=12.2".
Status CheckConstraint(const Constraint& constraint, const DeviceAttributes& attributes);

// The most alternatives (groups) a CheckRequirements message names.
inline constexpr size_t kMaxNamedAlternatives = 3;
// The longest CheckRequirements message: it is repeated per node in an
// extender answer, so it must not grow with the value (a 4 KiB value may
// hold 455 alternatives).
inline constexpr size_t kMaxRequirementMessageBytes = 512;

// OK when every requirement has a group whose constraints all hold (or the
// set is disabled or empty). Otherwise FAILED_PRECONDITION naming the first
// unmet variable and, for its first kMaxNamedAlternatives groups, each
// group's first failing constraint, joined by " or ": "NVIDIA_REQUIRE_CUDA:
// cuda 11.8 does not satisfy cuda>=12.2 or brand quadro does not satisfy
// brand=tesla"; further groups are counted (" or ... and 452 more
// alternatives"). The message is cut to kMaxRequirementMessageBytes (at a
// UTF-8 character's start, ending in "...").
Status CheckRequirements(const RequirementSet& set, const DeviceAttributes& attributes);

}  // namespace kdm::k8s

#endif  // KDM_K8S_REQUIREMENTS_H_
