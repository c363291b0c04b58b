// The OS seam of the device manager: the few filesystem and process-identity
// operations the Manager needs, in one place. Private header (not
// installed). The helpers other modules share live elsewhere: JoinPath and
// EnsureDirectory in base/file_system.h, the plugin endpoint check in
// pluginapi/api_rules.h.
//
// Boot ids reach the Manager through Options::boot_id_provider (the default
// calls ReadBootId), so tests inject any boot id they like; the filesystem
// calls work on real paths, which tests keep in a private temp directory.
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   KDM_RETURN_IF_ERROR(TightenDirectoryMode(dir, 0750).status());
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

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_OS_H_
