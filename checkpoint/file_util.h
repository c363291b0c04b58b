// Private to kdm::checkpoint: the few POSIX file operations the stores need
// (whole-file read, atomic replace, quarantine of a bad file).
//
// Thread-safety: free functions without shared state.
//
// Example:
//   KDM_RETURN_IF_ERROR(WriteFileAtomically("/x/state/f", bytes));
//   StatusOr<std::string> moved = QuarantineFile("/x/state/f", {"-wal"});
#ifndef KDM_CHECKPOINT_FILE_UTIL_H_
#define KDM_CHECKPOINT_FILE_UTIL_H_

#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::checkpoint::internal {

// "<what> <path>: <strerror(err)>", with a code that matches errno
// (ENOENT -> NOT_FOUND, EACCES/EPERM/EROFS -> PERMISSION_DENIED, ENOSPC ->
// RESOURCE_EXHAUSTED, else UNAVAILABLE).
Status ErrnoError(int err, std::string_view what, std::string_view path);

// The current UTC time as "yyyymmddThhmmssZ".
std::string UtcTimestampForFileName();

// The whole content of a regular file. NOT_FOUND if it does not exist,
// FAILED_PRECONDITION if it is not a regular file.
StatusOr<std::string> ReadWholeFile(const std::string& path);

// Writes `contents` to a temporary file beside `path`, fsyncs it, renames it
// over `path` and fsyncs the directory: after a crash `path` holds either
// the old or the new content, whole. On error `path` is unchanged.
Status WriteFileAtomically(const std::string& path, std::string_view contents);

// Removes what a WriteFileAtomically(path, ...) killed between creating its
// temporary file and renaming it leaves behind: regular files
// "<path>.tmp-<pid>" beside `path` whose writer process <pid> is gone (a
// live pid may be a writer still at work, or a reused pid: its file is left
// alone). Nothing else is touched. Returns the paths removed; a file that
// cannot be removed is skipped. Errors only when the directory cannot be
// read (NOT_FOUND when it does not exist).
StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& path);

// mkdir -p.
Status MakeDirectories(const std::string& dir);

// Moves `path` to "<path>.corrupt-<UTC yyyymmddThhmmssZ>" (".<n>" appended
// when that exists already), and each existing "<path><suffix>" to
// "<new path><suffix>". Nothing is deleted. Returns the new path of `path`.
StatusOr<std::string> QuarantineFile(const std::string& path,
                                     const std::vector<std::string>& suffixes);

// True when `path` names an existing directory.
bool IsDirectory(const std::string& path);

// True when something exists at `path` (any type).
bool PathExists(const std::string& path);

}  // namespace kdm::checkpoint::internal

#endif  // KDM_CHECKPOINT_FILE_UTIL_H_
