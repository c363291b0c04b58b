#include "kdm/http/listen_address.h"

#include <arpa/inet.h>

#include <algorithm>
#include <charconv>

namespace kdm::http {
namespace {

bool IsIpv4(const std::string& host) {
  in_addr a;
  return inet_pton(AF_INET, host.c_str(), &a) == 1;
}

bool IsIpv6(const std::string& host) {
  in6_addr a;
  return inet_pton(AF_INET6, host.c_str(), &a) == 1;
}

// RFC 1123 host name: dot-separated labels of letters, digits and '-', none
// empty, none starting or ending with '-', at most 63 bytes each, 253 in all.
bool IsDnsName(std::string_view name) {
  if (name.empty() || name.size() > 253) return false;
  if (name.back() == '.') name.remove_suffix(1);
  size_t start = 0;
  while (start <= name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string_view::npos) dot = name.size();
    std::string_view label = name.substr(start, dot - start);
    if (label.empty() || label.size() > 63 || label.front() == '-' || label.back() == '-') {
      return false;
    }
    for (char c : label) {
      const bool ok =
          (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
      if (!ok) return false;
    }
    start = dot + 1;
  }
  return true;
}

}  // namespace

std::string ListenAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

StatusOr<ListenAddress> ParseListenAddress(std::string_view text, std::string_view what) {
  auto bad = [&](const std::string& why) {
    std::string shown(text.substr(0, 200));
    if (text.size() > 200) shown += "...";
    return InvalidArgumentError(std::string(what) + " \"" + shown + "\": " + why +
                                " (want HOST:PORT, e.g. 127.0.0.1:8080, [::1]:8080 or :8080)");
  };
  if (text.empty()) return bad("is empty");
  std::string host;
  std::string_view port;
  bool bracketed = false;
  if (text.front() == '[') {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("has no closing ']'");
    if (close + 1 >= text.size() || text[close + 1] != ':') return bad("has no port");
    host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
    bracketed = true;
  } else {
    const size_t colon = text.rfind(':');
    if (colon == std::string_view::npos) return bad("has no port");
    host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
    if (host.find(':') != std::string::npos) return bad("needs brackets around an IPv6 host");
  }
  if (port.empty()) return bad("has no port");
  unsigned value = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc() || end != port.data() + port.size() || value > 65535 ||
      !std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return bad("has an invalid port (want a number 0..65535)");
  }
  if (bracketed) {
    if (host.empty()) return bad("has an empty IPv6 address in brackets");
    if (!IsIpv6(host)) return bad("has brackets around something that is not an IPv6 address");
  } else if (host.empty()) {
    host = "0.0.0.0";
  } else if (host == "localhost") {
    host = "127.0.0.1";
  } else if (!IsIpv4(host) && !IsDnsName(host)) {
    return bad("has a host that is neither an IP address nor a DNS name");
  }
  return ListenAddress{std::move(host), static_cast<uint16_t>(value)};
}

}  // namespace kdm::http
