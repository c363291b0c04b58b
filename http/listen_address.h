// kdm::http::ParseListenAddress: the one reading of a server's HOST:PORT
// (`kdm extender --listen`, `kdm kubelet --metrics-addr`).
//
//   127.0.0.1:8080   an IPv4 address
//   [::1]:8080       an IPv6 address, always in brackets ("::1:8080" is refused)
//   localhost:0      "localhost" is 127.0.0.1; another DNS name is kept and
//                    resolved when the server binds (UNAVAILABLE if it does not)
//   :8080            every IPv4 interface (0.0.0.0)
// The port is a decimal number 0..65535; 0 lets the kernel pick one.
//
// Thread-safety: a pure function.
//
// Example:
//   KDM_ASSIGN_OR_RETURN(http::ListenAddress a, http::ParseListenAddress("[::1]:0"));
//   // a.host == "::1", a.port == 0
#ifndef KDM_HTTP_LISTEN_ADDRESS_H_
#define KDM_HTTP_LISTEN_ADDRESS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::http {

struct ListenAddress {
  // An IPv4 or IPv6 address (IPv6 without brackets), or a DNS name.
  std::string host;
  uint16_t port = 0;
  // "host:port", IPv6 hosts in brackets.
  std::string ToString() const;
};

// Errors: INVALID_ARGUMENT whose message starts with `what` (the flag or
// setting, e.g. "--listen"), quotes `text` (cut at 200 bytes) and says what
// is wrong, e.g.
//   listen address "::1:80": needs brackets around an IPv6 host (want HOST:PORT, ...)
StatusOr<ListenAddress> ParseListenAddress(std::string_view text,
                                           std::string_view what = "listen address");

}  // namespace kdm::http

#endif  // KDM_HTTP_LISTEN_ADDRESS_H_
