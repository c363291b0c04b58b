// Private to kdm::checkpoint: moving a corrupt checkpoint aside. Every file
// operation goes through kdm::Env (base/env.h), which also holds the errno
// policy the stores follow.
//
// Thread-safety: free functions without shared state.
//
// Example:
//   StatusOr<std::string> moved =
//       QuarantineFile(*Env::Default(), "/x/state/f", {"-wal"});
#ifndef KDM_CHECKPOINT_QUARANTINE_H_
#define KDM_CHECKPOINT_QUARANTINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm::checkpoint::internal {

// The largest checkpoint file read whole (a kubelet JSON checkpoint): far
// above what 10,000 pods write, small enough to never exhaust memory.
inline constexpr uint64_t kMaxCheckpointFileBytes = uint64_t{256} << 20;

// The current UTC time as "yyyymmddThhmmssZ".
std::string UtcTimestampForFileName();

// Moves `path` to "<path>.corrupt-<UTC yyyymmddThhmmssZ>" (".<n>" appended
// when that exists already), and each existing "<path><suffix>" to
// "<new path><suffix>", then syncs the directory. Nothing is deleted.
// Returns the new path of `path`.
StatusOr<std::string> QuarantineFile(Env& env, const std::string& path,
                                     const std::vector<std::string>& suffixes);

// True when something exists at `path` (any type).
bool PathExists(Env& env, const std::string& path);

// True when `path` names an existing directory (a final symlink is not
// followed).
bool IsDirectory(Env& env, const std::string& path);

}  // namespace kdm::checkpoint::internal

#endif  // KDM_CHECKPOINT_QUARANTINE_H_
