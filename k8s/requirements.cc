#include "kdm/k8s/requirements.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <string>
#include <string_view>

namespace kdm::k8s {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool IsNameChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
}

Status CheckVersionSyntax(std::string_view v) {
  if (v.empty()) return InvalidArgumentError("an empty version");
  if (v.size() > kMaxVersionBytes) {
    return InvalidArgumentError("a version longer than " + std::to_string(kMaxVersionBytes) +
                                " bytes");
  }
  bool part_empty = true;
  for (char c : v) {
    if (c == '.') {
      if (part_empty) return InvalidArgumentError("an empty version part in " + ShowValue(v));
      part_empty = true;
    } else if (c >= '0' && c <= '9') {
      part_empty = false;
    } else {
      return InvalidArgumentError("not a version: " + ShowValue(v));
    }
  }
  if (part_empty) return InvalidArgumentError("an empty version part in " + ShowValue(v));
  return OkStatus();
}

// Compares two decimal numbers written without a sign, of any length.
int CompareNumbers(std::string_view a, std::string_view b) {
  auto strip = [](std::string_view s) {
    size_t i = s.find_first_not_of('0');
    return i == std::string_view::npos ? std::string_view() : s.substr(i);
  };
  a = strip(a);
  b = strip(b);
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  int c = a.compare(b);
  return c < 0 ? -1 : (c > 0 ? 1 : 0);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

bool Holds(RequirementOp op, int cmp) {
  switch (op) {
    case RequirementOp::kEq:
      return cmp == 0;
    case RequirementOp::kNe:
      return cmp != 0;
    case RequirementOp::kLt:
      return cmp < 0;
    case RequirementOp::kLe:
      return cmp <= 0;
    case RequirementOp::kGt:
      return cmp > 0;
    case RequirementOp::kGe:
      return cmp >= 0;
  }
  return false;
}

StatusOr<Constraint> ParseConstraint(std::string_view text) {
  size_t key_end = 0;
  while (key_end < text.size() && std::isalpha(static_cast<unsigned char>(text[key_end]))) {
    ++key_end;
  }
  std::string_view key = text.substr(0, key_end);
  if (key.empty()) return InvalidArgumentError("no key in " + ShowValue(text));
  if (!IsVersionAttribute(key) && key != kAttrBrand) {
    return InvalidArgumentError("unknown key " + ShowValue(key) + " in " + ShowValue(text) +
                                " (keys: cuda, driver, arch, brand)");
  }
  std::string_view rest = text.substr(key_end);
  // Longest operator first, so "<=" is not read as "<" followed by "=...".
  static constexpr std::array<std::pair<std::string_view, RequirementOp>, 7> kOps = {{
      {"==", RequirementOp::kEq},
      {"!=", RequirementOp::kNe},
      {"<=", RequirementOp::kLe},
      {">=", RequirementOp::kGe},
      {"=", RequirementOp::kEq},
      {"<", RequirementOp::kLt},
      {">", RequirementOp::kGt},
  }};
  Constraint c;
  c.key = std::string(key);
  c.text = std::string(text);
  size_t op_len = 0;
  for (const auto& [name, op] : kOps) {
    if (rest.substr(0, name.size()) == name) {
      c.op = op;
      op_len = name.size();
      break;
    }
  }
  if (op_len == 0) {
    return InvalidArgumentError("no operator (=, ==, !=, <, <=, >, >=) after " + ShowValue(key) +
                                " in " + ShowValue(text));
  }
  std::string_view value = rest.substr(op_len);
  if (key == kAttrBrand) {
    if (c.op != RequirementOp::kEq && c.op != RequirementOp::kNe) {
      return InvalidArgumentError("brand takes only =, == or != in " + ShowValue(text));
    }
    if (value.empty() || value.size() > kMaxVersionBytes ||
        !std::all_of(value.begin(), value.end(), IsNameChar)) {
      return InvalidArgumentError("bad brand name " + ShowValue(value) + " in " + ShowValue(text));
    }
  } else if (Status s = CheckVersionSyntax(value); !s.ok()) {
    return InvalidArgumentError(s.message() + " in " + ShowValue(text));
  }
  c.value = std::string(value);
  return c;
}

}  // namespace

std::string_view RequirementOpName(RequirementOp op) {
  switch (op) {
    case RequirementOp::kEq:
      return "==";
    case RequirementOp::kNe:
      return "!=";
    case RequirementOp::kLt:
      return "<";
    case RequirementOp::kLe:
      return "<=";
    case RequirementOp::kGt:
      return ">";
    case RequirementOp::kGe:
      return ">=";
  }
  return "?";
}

StatusOr<int> CompareVersions(std::string_view a, std::string_view b) {
  KDM_RETURN_IF_ERROR(CheckVersionSyntax(a));
  KDM_RETURN_IF_ERROR(CheckVersionSyntax(b));
  while (!a.empty() || !b.empty()) {
    size_t da = a.find('.');
    size_t db = b.find('.');
    std::string_view pa = a.substr(0, da);
    std::string_view pb = b.substr(0, db);
    if (int c = CompareNumbers(pa, pb); c != 0) return c;
    a = da == std::string_view::npos ? std::string_view() : a.substr(da + 1);
    b = db == std::string_view::npos ? std::string_view() : b.substr(db + 1);
  }
  return 0;
}

StatusOr<Requirement> ParseRequirement(std::string_view variable, std::string_view value) {
  std::string where = std::string(variable) + ": ";
  if (value.size() > kMaxRequirementBytes) {
    return InvalidArgumentError(where + "value of " + std::to_string(value.size()) +
                                " bytes, the limit is " + std::to_string(kMaxRequirementBytes));
  }
  Requirement r;
  r.variable = std::string(variable);
  size_t i = 0;
  while (i < value.size()) {
    if (IsBlank(value[i])) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < value.size() && !IsBlank(value[end])) ++end;
    std::string_view group_text = value.substr(i, end - i);
    i = end;
    std::vector<Constraint> group;
    size_t start = 0;
    while (true) {
      size_t comma = group_text.find(',', start);
      std::string_view one = group_text.substr(
          start, comma == std::string_view::npos ? std::string_view::npos : comma - start);
      if (one.empty()) {
        return InvalidArgumentError(where + "an empty constraint in " + ShowValue(group_text));
      }
      StatusOr<Constraint> c = ParseConstraint(one);
      if (!c.ok()) return InvalidArgumentError(where + c.status().message());
      group.push_back(*std::move(c));
      if (comma == std::string_view::npos) break;
      start = comma + 1;
    }
    r.groups.push_back(std::move(group));
  }
  return r;
}

StatusOr<RequirementSet> ParseRequirementEnv(
    const std::vector<std::pair<std::string, std::string>>& env) {
  RequirementSet set;
  for (const auto& [name, value] : env) {
    if (name == kDisableRequire) {
      std::string v = Lower(value);
      if (v == "true" || v == "1") set.disabled = true;
    }
  }
  if (set.disabled) return set;
  for (const auto& [name, value] : env) {
    if (name.size() <= kRequirePrefix.size() ||
        name.compare(0, kRequirePrefix.size(), kRequirePrefix) != 0) {
      continue;
    }
    StatusOr<Requirement> r = ParseRequirement(name, value);
    if (!r.ok()) return r.status();
    if (!r->groups.empty()) set.requirements.push_back(*std::move(r));
  }
  return set;
}

Status CheckConstraint(const Constraint& constraint, const DeviceAttributes& attributes) {
  const std::optional<std::string>* field = attributes.Field(constraint.key);
  if (field == nullptr || !*field || (*field)->empty()) {
    return FailedPreconditionError(constraint.key + " is not known on this node, required by " +
                                   constraint.text);
  }
  const std::string& have = **field;
  int cmp = 0;
  if (constraint.key == kAttrBrand) {
    cmp = Lower(have) == Lower(constraint.value) ? 0 : 1;
    bool plain =
        have.size() <= kMaxVersionBytes && std::all_of(have.begin(), have.end(), IsNameChar);
    if (!Holds(constraint.op, cmp)) {
      return FailedPreconditionError("brand " + (plain ? have : ShowValue(have)) +
                                     " does not satisfy " + constraint.text);
    }
    return OkStatus();
  }
  StatusOr<int> c = CompareVersions(have, constraint.value);
  if (!c.ok()) {
    return FailedPreconditionError(constraint.key + " " + ShowValue(have) +
                                   " on this node is not a version, required by " +
                                   constraint.text);
  }
  if (!Holds(constraint.op, *c)) {
    return FailedPreconditionError(constraint.key + " " + have + " does not satisfy " +
                                   constraint.text);
  }
  return OkStatus();
}

Status CheckRequirements(const RequirementSet& set, const DeviceAttributes& attributes) {
  if (set.disabled) return OkStatus();
  for (const Requirement& r : set.requirements) {
    if (r.groups.empty()) continue;
    std::string why;
    bool met = false;
    size_t failed = 0;
    for (const std::vector<Constraint>& group : r.groups) {
      Status first_failure;
      for (const Constraint& c : group) {
        first_failure = CheckConstraint(c, attributes);
        if (!first_failure.ok()) break;
      }
      if (first_failure.ok()) {
        met = true;
        break;
      }
      // Every group is still checked (a later one may hold), but only the
      // first few are named.
      if (failed++ >= kMaxNamedAlternatives) continue;
      if (!why.empty()) why += " or ";
      why += first_failure.message();
    }
    if (met) continue;
    std::string message = r.variable + ": " + why;
    if (failed > kMaxNamedAlternatives) {
      message +=
          " or ... and " + std::to_string(failed - kMaxNamedAlternatives) + " more alternatives";
    }
    if (message.size() > kMaxRequirementMessageBytes) {
      constexpr std::string_view kCut = "...";
      size_t keep = kMaxRequirementMessageBytes - kCut.size();
      // Not inside a UTF-8 character (the variable's name is outside text).
      while (keep > 0 && (static_cast<unsigned char>(message[keep]) & 0xC0) == 0x80) --keep;
      message.resize(keep);
      message += kCut;
    }
    return FailedPreconditionError(message);
  }
  return OkStatus();
}

}  // namespace kdm::k8s
