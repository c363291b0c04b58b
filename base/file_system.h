// Private to kdm (not installed): the two filesystem helpers that modules on
// different branches of the module graph share (the device manager, the
// wire layer's endpoint rule and `kdm conform`'s stand-in kubelet), so that
// none of them has to include another module's private OS header.
//
// Thread-safety: free functions without shared state; safe from any thread.
//
// Example:
//   KDM_RETURN_IF_ERROR(kdm::EnsureDirectory(dir, 0750));
//   std::string socket = kdm::JoinPath(dir, "kubelet.sock");
#ifndef KDM_BASE_FILE_SYSTEM_H_
#define KDM_BASE_FILE_SYSTEM_H_

#include <string>
#include <string_view>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm {

// Joins a directory and a file name with exactly one '/' ("/a//" + "b" ->
// "/a/b", "/" + "b" -> "/b").
std::string JoinPath(std::string_view dir, std::string_view name);

// env->CreateDirectories(dir, mode) (see env.h): creates `dir`
// and its missing parents with `mode` (an existing directory is left as it
// is). Errors name the path: INVALID_ARGUMENT for an empty path,
// FAILED_PRECONDITION when `dir` exists and is not a directory, a failed
// mkdir by the errno policy (ErrnoToStatus).
Status EnsureDirectory(const std::string& dir, unsigned mode, Env* env = Env::Default());

}  // namespace kdm

#endif  // KDM_BASE_FILE_SYSTEM_H_
