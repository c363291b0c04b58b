#include "kdm/pluginapi/unix_target.h"

#include <filesystem>
#include <string>
#include <system_error>

#include "kdm/pluginapi/constants.h"

namespace kdm::pluginapi {

namespace fs = std::filesystem;

StatusOr<std::string> AbsoluteSocketPath(std::string_view path) {
  if (path.empty()) return InvalidArgumentError("the socket path is empty");
  if (path.find('\0') != std::string_view::npos) {
    return InvalidArgumentError("the socket path " + std::string(path.substr(0, path.find('\0'))) +
                                "\\0... holds a NUL byte");
  }
  const std::string given(path);
  std::error_code ec;
  fs::path abs = fs::absolute(fs::path(given), ec);
  if (ec) {
    return UnavailableError("cannot make " + given + " absolute: " + ec.message());
  }
  abs = abs.lexically_normal();
  // "x/", "x/." and "x/.." normalise to a path that ends in a separator or
  // in "..": a directory, never a socket file.
  if (!abs.has_filename() || abs.filename() == "..") {
    return InvalidArgumentError("the socket path " + given + " names a directory, not a file");
  }
  std::string out = abs.string();
  if (out.size() > kMaxUnixSocketPathLength) {
    std::string shown = out == given ? out : given + " (absolute: " + out + ")";
    return InvalidArgumentError(
        shown + " is " + std::to_string(out.size()) + " bytes, longer than the " +
        std::to_string(kMaxUnixSocketPathLength) + " bytes a unix socket path allows");
  }
  return out;
}

StatusOr<std::string> UnixSocketTarget(std::string_view path) {
  KDM_ASSIGN_OR_RETURN(std::string abs, AbsoluteSocketPath(path));
  // gRPC parses the target as a URI: '?' and '#' would end the path and '%'
  // starts an escape, on the server side and the dialling side alike.
  std::string target = "unix:";
  target.reserve(target.size() + abs.size());
  for (char c : abs) {
    switch (c) {
      case '%':
        target += "%25";
        break;
      case '?':
        target += "%3F";
        break;
      case '#':
        target += "%23";
        break;
      default:
        target += c;
    }
  }
  return target;
}

}  // namespace kdm::pluginapi
