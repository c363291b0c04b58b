// Private to kdm::base: what the POSIX and the in-memory Env share, so that
// both check paths and name temporary files the same way.
//
// Thread-safety: pure functions.
#ifndef KDM_BASE_ENV_INTERNAL_H_
#define KDM_BASE_ENV_INTERNAL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::env_internal {

// INVALID_ARGUMENT for an empty path or one holding a NUL byte; `what` is
// "file", "directory" or "path".
Status CheckPath(std::string_view path, std::string_view what);

// "/a/b" -> "/a", "b" -> ".", "/b" -> "/".
std::string DirName(const std::string& path);
// "/a/b" -> "b".
std::string BaseName(const std::string& path);

// OUT_OF_RANGE naming the path, its size and the cap.
Status TooBig(const std::string& path, uint64_t size, uint64_t max_bytes);

// ".<name>.tmp-XXXXXX", X a letter or digit.
bool IsHiddenRandomTempFile(std::string_view name);

// The pid of "<target>.tmp-<pid>" (decimal, no leading zero, at most 9
// digits), or nothing for any other name.
std::optional<int64_t> WriterPidTempFile(std::string_view name, std::string_view target);

}  // namespace kdm::env_internal

#endif  // KDM_BASE_ENV_INTERNAL_H_
