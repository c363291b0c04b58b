// Fuzz target: the NVIDIA_REQUIRE_* parser and checker (kube/requirements.h).
//
// Properties of every input:
// - a refusal is INVALID_ARGUMENT, starts with the variable's name and is
//   short printable ASCII (tokens are shown cut, control bytes replaced);
// - an accepted value holds only known keys, brand only with =/!=, versions
//   that compare equal to themselves; written back (constraints joined by
//   commas, groups by spaces, and once more from key, operator and value,
//   where that stays within kMaxRequirementBytes) it parses to the same
//   constraints;
// - checking it against a few nodes is OK or FAILED_PRECONDITION naming the
//   variable;
// - CompareVersions of the input's first line and the rest is antisymmetric.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "fuzz_check.h"
#include "kdm/k8s/requirements.h"

namespace {

using kdm::k8s::Constraint;
using kdm::k8s::Requirement;
using kdm::k8s::RequirementOp;

constexpr std::string_view kVariable = "NVIDIA_REQUIRE_FUZZ";

void CheckRefusal(const kdm::Status& s) {
  FUZZ_CHECK(s.code() == kdm::StatusCode::kInvalidArgument, "refusal code: " << s);
  FUZZ_CHECK(s.message().rfind(std::string(kVariable) + ": ", 0) == 0,
             "refusal does not name the variable: " << s);
  FUZZ_CHECK(s.message().size() < 1024, "refusal of " << s.message().size() << " bytes");
  for (char c : s.message()) {
    auto u = static_cast<unsigned char>(c);
    FUZZ_CHECK(u >= 0x20 && u < 0x7f, "refusal holds byte " << int{u});
  }
}

std::string Join(const Requirement& r, bool from_parts) {
  std::string out;
  for (const auto& group : r.groups) {
    if (!out.empty()) out += ' ';
    bool first = true;
    for (const Constraint& c : group) {
      if (!first) out += ',';
      first = false;
      out += from_parts ? c.key + std::string(kdm::k8s::RequirementOpName(c.op)) + c.value : c.text;
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);

  size_t nl = text.find('\n');
  if (nl != std::string_view::npos) {
    std::string_view a = text.substr(0, nl), b = text.substr(nl + 1);
    kdm::StatusOr<int> ab = kdm::k8s::CompareVersions(a, b);
    kdm::StatusOr<int> ba = kdm::k8s::CompareVersions(b, a);
    FUZZ_CHECK(ab.ok() == ba.ok(), "CompareVersions accepts one order only");
    if (ab.ok()) {
      FUZZ_CHECK(*ab == -*ba, "CompareVersions is not antisymmetric");
      FUZZ_CHECK(*kdm::k8s::CompareVersions(a, a) == 0, "a version differs from itself");
    }
  }

  kdm::StatusOr<Requirement> r = kdm::k8s::ParseRequirement(kVariable, text);
  if (!r.ok()) {
    CheckRefusal(r.status());
    return 0;
  }
  for (const auto& group : r->groups) {
    FUZZ_CHECK(!group.empty(), "an empty group was accepted");
    for (const Constraint& c : group) {
      if (c.key == "brand") {
        FUZZ_CHECK(c.op == RequirementOp::kEq || c.op == RequirementOp::kNe,
                   "brand with an ordering: " << c.text);
      } else {
        FUZZ_CHECK(c.key == "cuda" || c.key == "driver" || c.key == "arch", "key " << c.key);
        kdm::StatusOr<int> self = kdm::k8s::CompareVersions(c.value, c.value);
        FUZZ_CHECK(self.ok() && *self == 0, "version " << c.value);
      }
    }
  }
  for (bool from_parts : {false, true}) {
    std::string again = Join(*r, from_parts);
    // Written from parts, "=" becomes "==": a value near the limit can grow
    // past it (a false alarm of the first `./run fuzz`, kept in regressions/).
    if (again.size() > kdm::k8s::kMaxRequirementBytes) {
      FUZZ_CHECK(from_parts, "written back as written, it grew: " << again.size());
      continue;
    }
    kdm::StatusOr<Requirement> back = kdm::k8s::ParseRequirement(kVariable, again);
    FUZZ_CHECK(back.ok(), "written back it does not parse: " << back.status() << "\n" << again);
    FUZZ_CHECK(back->groups.size() == r->groups.size(), "group count changed: " << again);
    for (size_t g = 0; g < r->groups.size(); ++g) {
      FUZZ_CHECK(back->groups[g].size() == r->groups[g].size(), "group size: " << again);
      for (size_t i = 0; i < r->groups[g].size(); ++i) {
        const Constraint& x = r->groups[g][i];
        const Constraint& y = back->groups[g][i];
        FUZZ_CHECK(x.key == y.key && x.op == y.op && x.value == y.value,
                   "constraint changed: " << x.text << " -> " << y.text);
      }
    }
  }

  kdm::k8s::RequirementSet set;
  set.requirements.push_back(*r);
  kdm::k8s::DeviceAttributes real, odd;
  real.driver = "550.54.15";
  real.cuda = "12.4";
  real.arch = "9.0";
  real.brand = "tesla";
  // Values no checked path would publish: the check must still answer.
  odd.driver = "1..2";
  odd.cuda = "x";
  odd.brand = "a b";
  for (const kdm::k8s::DeviceAttributes& node : {kdm::k8s::DeviceAttributes{}, real, odd}) {
    kdm::Status s = kdm::k8s::CheckRequirements(set, node);
    if (r->groups.empty()) FUZZ_CHECK(s.ok(), "no groups, yet unmet: " << s);
    if (!s.ok()) {
      FUZZ_CHECK(s.code() == kdm::StatusCode::kFailedPrecondition, "check code: " << s);
      FUZZ_CHECK(s.message().rfind(std::string(kVariable) + ": ", 0) == 0, "check: " << s);
    }
  }
  return 0;
}
