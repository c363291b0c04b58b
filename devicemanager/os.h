// The OS seam of the device manager: the few filesystem and process-identity
// operations the Manager and the RegistrationServer need, in one place.
// Private header (not installed).
//
// Boot ids reach the Manager through Options::boot_id_provider (the default
// calls ReadBootId), so tests inject any boot id they like; the filesystem
// calls work on real paths, which tests keep in a private temp directory.
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   KDM_RETURN_IF_ERROR(EnsureDirectory(dir, 0750));
//   KDM_ASSIGN_OR_RETURN(auto removed, RemoveSocketsExcept(dir, "kubelet.sock"));
#ifndef KDM_DEVICEMANAGER_OS_H_
#define KDM_DEVICEMANAGER_OS_H_

#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::devicemanager {

// Linux's boot id (one UUID per boot).
inline constexpr std::string_view kBootIdPath = "/proc/sys/kernel/random/boot_id";

// The first line of `path`, trimmed. NOT_FOUND / INTERNAL naming the path.
StatusOr<std::string> ReadBootId(const std::string& path = std::string(kBootIdPath));

// Creates `dir` and its missing parents with `mode` (an existing directory is
// left as it is). Errors name the path and errno text.
Status EnsureDirectory(const std::string& dir, unsigned mode);

// Removes every unix socket directly inside `dir` except `keep`; returns the
// file names removed. Other files (checkpoints, sub-directories) are kept.
StatusOr<std::vector<std::string>> RemoveSocketsExcept(const std::string& dir,
                                                       std::string_view keep);

// SPEC §5.4: `endpoint` must be a plain file name (no '/', no "..", not
// empty) of an existing unix socket inside `dir`; a symlink is allowed only
// when it resolves to a socket inside `dir`. Returns the socket's path
// (dir + "/" + endpoint) or INVALID_ARGUMENT / NOT_FOUND naming the endpoint.
StatusOr<std::string> CheckPluginEndpoint(const std::string& dir, const std::string& endpoint);

// Joins a directory and a file name with exactly one '/'.
std::string JoinPath(std::string_view dir, std::string_view name);

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_OS_H_
