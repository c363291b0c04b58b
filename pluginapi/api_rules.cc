#include "kdm/pluginapi/api_rules.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "kdm/base/file_system.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::pluginapi {

namespace {

// The endpoint as shown in messages: NUL bytes visible, long names cut.
std::string ShownEndpoint(std::string_view endpoint) {
  std::string shown;
  for (char c : endpoint.substr(0, 64)) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  if (endpoint.size() > 64) shown += "...";
  return shown;
}

Status InvalidEndpoint(std::string_view endpoint, std::string_view why) {
  return InvalidArgumentError("invalid endpoint \"" + ShownEndpoint(endpoint) +
                              "\": " + std::string(why));
}

}  // namespace

Status ValidateVersion(std::string_view version) {
  if (version == kVersion) return OkStatus();
  return InvalidArgumentError("requested API version \"" + std::string(version) +
                              "\" is not supported by kubelet. Supported version is \"" +
                              std::string(kVersion) + "\"");
}

Status ValidateResourceName(std::string_view name) {
  if (k8s::IsExtendedResourceName(name)) return OkStatus();
  return InvalidArgumentError("the ResourceName \"" + std::string(name) + "\" is invalid");
}

Status CheckEndpointName(std::string_view endpoint) {
  if (endpoint.empty()) return InvalidEndpoint(endpoint, "the socket file name is empty");
  if (endpoint.find('\0') != std::string_view::npos) {
    return InvalidEndpoint(endpoint, "contains a NUL byte");
  }
  if (endpoint.find('/') != std::string_view::npos) {
    return InvalidEndpoint(endpoint,
                           "must be a plain file name inside the plugin directory, without '/'");
  }
  if (endpoint == ".") return InvalidEndpoint(endpoint, "must name a file, not the directory");
  if (endpoint.find("..") != std::string_view::npos) {
    return InvalidEndpoint(endpoint, "must not contain \"..\"");
  }
  if (endpoint.size() > kMaxEndpointNameLength) {
    return InvalidEndpoint(endpoint, "the file name is " + std::to_string(endpoint.size()) +
                                         " bytes, longer than " +
                                         std::to_string(kMaxEndpointNameLength));
  }
  return OkStatus();
}

StatusOr<std::string> CheckPluginEndpoint(const std::string& dir, std::string_view endpoint) {
  KDM_RETURN_IF_ERROR(CheckEndpointName(endpoint));
  // Absolute: a relative plugin directory is read against the working
  // directory now, and the length that counts is the absolute one.
  StatusOr<std::string> abs = AbsoluteSocketPath(JoinPath(dir, endpoint));
  if (!abs.ok()) return InvalidEndpoint(endpoint, abs.status().message());
  const std::string& path = *abs;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return NotFoundError("invalid endpoint \"" + ShownEndpoint(endpoint) +
                           "\": no such file in " + dir);
    }
    return InvalidEndpoint(endpoint, "cannot stat " + path + ": " + strerror(err));
  }
  if (S_ISSOCK(st.st_mode)) return path;
  if (S_ISLNK(st.st_mode)) {
    return InvalidEndpoint(
        endpoint, "is a symlink; the plugin's socket itself must be in the plugin directory");
  }
  if (S_ISDIR(st.st_mode)) return InvalidEndpoint(endpoint, "not a unix socket but a directory");
  if (S_ISREG(st.st_mode)) {
    return InvalidEndpoint(endpoint, "not a unix socket but a regular file");
  }
  if (S_ISFIFO(st.st_mode)) return InvalidEndpoint(endpoint, "not a unix socket but a FIFO");
  return InvalidEndpoint(endpoint, "not a unix socket");
}

}  // namespace kdm::pluginapi
