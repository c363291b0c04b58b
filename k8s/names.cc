#include "kdm/k8s/names.h"

namespace kdm::k8s {
namespace {

bool IsLowerAlnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool IsAlnum(char c) { return IsLowerAlnum(c) || (c >= 'A' && c <= 'Z'); }

// [a-z0-9]([-a-z0-9]*[a-z0-9])?, any length.
bool IsDns1123LabelChars(std::string_view s) {
  if (s.empty() || !IsLowerAlnum(s.front()) || !IsLowerAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsLowerAlnum(c) && c != '-') return false;
  }
  return true;
}

}  // namespace

bool IsDns1123Label(std::string_view s) {
  return s.size() <= kMaxDns1123LabelLength && IsDns1123LabelChars(s);
}

bool IsDns1123Subdomain(std::string_view s) {
  if (s.empty() || s.size() > kMaxDns1123SubdomainLength) return false;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    std::string_view part = s.substr(start, dot == std::string_view::npos ? s.npos : dot - start);
    if (!IsDns1123LabelChars(part)) return false;
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

bool IsQualifiedNamePart(std::string_view s) {
  if (s.empty() || s.size() > kMaxQualifiedNamePartLength) return false;
  if (!IsAlnum(s.front()) || !IsAlnum(s.back())) return false;
  for (char c : s) {
    if (!IsAlnum(c) && c != '-' && c != '_' && c != '.') return false;
  }
  return true;
}

bool IsExtendedResourceName(std::string_view name) {
  size_t slash = name.find('/');
  if (slash == std::string_view::npos) return false;                        // native
  if (name.find("kubernetes.io/") != std::string_view::npos) return false;  // native
  if (name.starts_with("requests.")) return false;
  if (name.find('/', slash + 1) != std::string_view::npos) return false;
  return IsDns1123Subdomain(name.substr(0, slash)) && IsQualifiedNamePart(name.substr(slash + 1));
}

}  // namespace kdm::k8s
