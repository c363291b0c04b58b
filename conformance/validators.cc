#include "kdm/conformance/validators.h"

#include <set>

#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::conformance {

namespace {

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsAlnum(char c) { return IsAlpha(c) || IsDigit(c); }

std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[(c >> 4) & 0xf];
      out += kHex[c & 0xf];
    } else {
      out += c;
    }
  }
  return out + "\"";
}

Status Invalid(std::string message) { return InvalidArgumentError(std::move(message)); }

// Dot-separated labels of [A-Za-z0-9-], each non-empty and starting and
// ending with a letter or digit.
bool IsDnsLikeName(std::string_view s) {
  if (s.empty() || s.size() > 253) return false;
  size_t start = 0;
  while (true) {
    size_t dot = s.find('.', start);
    std::string_view label =
        s.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (label.empty() || label.size() > 63) return false;
    if (!IsAlnum(label.front()) || !IsAlnum(label.back())) return false;
    for (char c : label) {
      if (!IsAlnum(c) && c != '-') return false;
    }
    if (dot == std::string_view::npos) return true;
    start = dot + 1;
  }
}

}  // namespace

Status CheckDeviceIds(const std::vector<std::string>& ids) {
  std::set<std::string_view> seen;
  for (const std::string& id : ids) {
    if (id.empty()) return Invalid("a device has an empty id");
    if (id.size() > pluginapi::kMaxDeviceIdLength) {
      return Invalid("device id " + Quote(id) + " is " + std::to_string(id.size()) +
                     " characters long (at most " + std::to_string(pluginapi::kMaxDeviceIdLength) +
                     ")");
    }
    if (!seen.insert(id).second) return Invalid("device id " + Quote(id) + " is listed twice");
  }
  return OkStatus();
}

Status CheckHealth(std::string_view health) {
  if (health == pluginapi::kHealthy || health == pluginapi::kUnhealthy) return OkStatus();
  return Invalid("health " + Quote(health) + " is neither \"Healthy\" nor \"Unhealthy\"");
}

Status CheckNumaNode(int64_t node) {
  if (node >= 0) return OkStatus();
  return Invalid("NUMA node " + std::to_string(node) + " is negative");
}

Status CheckAbsolutePath(std::string_view path, std::string_view what) {
  if (path.empty() || path.front() != '/') {
    return Invalid(std::string(what) + " " + Quote(path) + " is not absolute");
  }
  size_t start = 0;
  while (start <= path.size()) {
    size_t slash = path.find('/', start);
    std::string_view part = path.substr(
        start, slash == std::string_view::npos ? std::string_view::npos : slash - start);
    if (part == "..") {
      return Invalid(std::string(what) + " " + Quote(path) + " has a \"..\" component");
    }
    if (slash == std::string_view::npos) break;
    start = slash + 1;
  }
  return OkStatus();
}

Status CheckPermissions(std::string_view permissions) {
  if (permissions.empty()) return Invalid("device permissions are empty");
  std::string seen;
  for (char c : permissions) {
    if (c != 'r' && c != 'w' && c != 'm') {
      return Invalid("device permissions " + Quote(permissions) + " hold " +
                     Quote(std::string(1, c)) + " (allowed: r, w, m)");
    }
    if (seen.find(c) != std::string::npos) {
      return Invalid("device permissions " + Quote(permissions) + " repeat " +
                     Quote(std::string(1, c)));
    }
    seen += c;
  }
  return OkStatus();
}

Status CheckEnvName(std::string_view name) {
  auto bad = [&] {
    return Invalid("env name " + Quote(name) + " does not match [-._a-zA-Z][-._a-zA-Z0-9]*");
  };
  if (name.empty()) return bad();
  auto ok_first = [](char c) { return IsAlpha(c) || c == '-' || c == '.' || c == '_'; };
  if (!ok_first(name.front())) return bad();
  for (char c : name) {
    if (!ok_first(c) && !IsDigit(c)) return bad();
  }
  return OkStatus();
}

Status CheckCdiName(std::string_view name) {
  auto bad = [&](std::string_view why) {
    return Invalid("CDI device name " + Quote(name) +
                   " is not vendor/class=name: " + std::string(why));
  };
  size_t slash = name.find('/');
  if (slash == std::string_view::npos) return bad("no '/'");
  size_t eq = name.find('=', slash);
  if (eq == std::string_view::npos) return bad("no '=' after the class");
  std::string_view vendor = name.substr(0, slash);
  std::string_view cls = name.substr(slash + 1, eq - slash - 1);
  std::string_view dev = name.substr(eq + 1);
  if (!IsDnsLikeName(vendor)) return bad("bad vendor " + Quote(vendor));
  if (cls.empty() || !IsAlnum(cls.front())) return bad("bad class " + Quote(cls));
  for (char c : cls) {
    if (!IsAlnum(c) && c != '_' && c != '.' && c != '-') return bad("bad class " + Quote(cls));
  }
  if (dev.empty()) return bad("empty device name");
  for (char c : dev) {
    if (!IsAlnum(c) && c != '_' && c != '.' && c != ':' && c != '-') {
      return bad("bad device name " + Quote(dev));
    }
  }
  return OkStatus();
}

}  // namespace kdm::conformance
