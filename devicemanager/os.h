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

#include <cstddef>
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

// A permission mode as four octal digits, e.g. "0750".
std::string ModeText(unsigned mode);

// Removes every permission bit of the existing directory `dir` that
// `max_mode` does not have (e.g. 0777 -> 0750 for max_mode 0750); a
// directory already as strict is left alone. Returns the mode found (before
// any change). Errors (INTERNAL naming the path and errno): cannot stat, not
// a directory, chmod refused (e.g. not the owner).
StatusOr<unsigned> TightenDirectoryMode(const std::string& dir, unsigned max_mode);

// The longest plugin socket file name CheckPluginEndpoint accepts (NAME_MAX).
inline constexpr std::size_t kMaxEndpointNameLength = 255;

// docs/promises.md#endpoint-checks: `endpoint` must be a plain file name (not
// empty, no '/', no NUL, not "." or "..", no "..", at most
// kMaxEndpointNameLength bytes, and dir + "/" + endpoint must fit a unix socket
// path) naming an existing unix socket directly inside `dir`. A symlink is
// refused whatever it points to (checked with lstat), and so is a directory, a
// regular file, a FIFO or a device. Returns the socket's path (dir + "/" +
// endpoint); errors name the endpoint and the reason: NOT_FOUND when no such
// name exists in `dir`, INVALID_ARGUMENT otherwise.
StatusOr<std::string> CheckPluginEndpoint(const std::string& dir, const std::string& endpoint);

// Joins a directory and a file name with exactly one '/'.
std::string JoinPath(std::string_view dir, std::string_view name);

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_OS_H_
