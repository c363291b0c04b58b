// kdm::FileLock: one owner per root and per socket. A lock is flock(2)
// (LOCK_EX | LOCK_NB) on a lock file in the directory that holds what is
// owned, with the holder's pid written into the file. The descriptor stays
// open (O_CLOEXEC) for the owner's lifetime, so the kernel drops the lock
// when the process ends, however it ends (SIGKILL included): a lock file left
// behind by a dead process is free again at once. Lock files are never
// removed (unlinking a lock file while others may have it open would let two
// processes each hold "the" lock); a second owner meets the same file.
//
// Who holds which (see docs/kubelet.md, docs/plugin.md, docs/conformance.md):
// `kdm kubelet --root R` holds R/.kdm-kubelet.lock and
// R/device-plugins/kubelet.sock.lock; `kdm plugin` holds <socket>.lock;
// `kdm conform --root R` holds R/device-plugins/kubelet.sock.lock.
//
// A kernel lock has no in-memory stand-in, so this is direct POSIX, not
// kdm::Env; errno is mapped with ErrnoToStatus. RemoveUnlockedSockets lists,
// stats and removes through the Env it is given and checks the lock files on
// the real file system (with an in-memory Env no lock file exists there, so
// every socket counts as unowned, as before locks).
//
// Thread-safety: FileLock is a movable value owned by one thread at a time;
// the free functions are safe from any thread. Two FileLocks on one path in
// one process exclude each other too (each Acquire opens its own file
// description).
//
// Example:
//   StatusOr<kdm::FileLock> lock = kdm::FileLock::Acquire(root + "/.kdm-kubelet.lock");
//   if (!lock.ok()) return Fail(lock.status());  // "... is held by pid 4242"
//   ... serve; the lock is dropped when `lock` is destroyed or the process ends.
#ifndef KDM_BASE_FILE_LOCK_H_
#define KDM_BASE_FILE_LOCK_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/status.h"

namespace kdm {

class FileLock {
 public:
  // Opens (creating it 0644 when missing) the regular file `path`, takes an
  // exclusive lock on it without waiting, and writes this process's pid
  // ("<pid>\n") into it. Errors name the path:
  //   FAILED_PRECONDITION "<path> is held by pid N" (another process, or
  //     another FileLock in this one, holds it; "held by another process"
  //     when the file names no pid yet);
  //   FAILED_PRECONDITION "lock file <path> is not a regular file";
  //   INVALID_ARGUMENT for an empty path, one holding a NUL, or a symlink;
  //   else the errno policy ("cannot open lock file <path>: ...").
  static StatusOr<FileLock> Acquire(const std::string& path);

  FileLock(FileLock&& other) noexcept;
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;
  // Releases the lock (the file stays).
  ~FileLock();

  const std::string& path() const { return path_; }
  // Releases now; idempotent.
  void Release();

 private:
  FileLock(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

// True when `s` is Acquire's refusal because the lock is held ("... is held
// by ..."), not another FAILED_PRECONDITION such as a lock path that is not a
// regular file.
bool IsLockHeldError(const Status& s);

// Whether some process (this one included) holds the lock on `path` now.
// False when there is no file at `path`. Errors: as Acquire's, except that
// nothing is created or written.
StatusOr<bool> IsFileLockHeld(const std::string& path);

// The pid written in the lock file `path`, or nullopt when it cannot be read
// or names no pid (the file is read up to 32 bytes, never more).
std::optional<int64_t> LockHolderPid(const std::string& path);

// The lock file of a socket: "<socket_path>.lock", beside it.
std::string SocketLockPath(std::string_view socket_path);

struct SocketSweep {
  std::vector<std::string> removed;  // file names of the sockets removed
  // File names of the sockets kept because their lock is held, each with the
  // holder's pid (0 when the lock file names none).
  std::vector<std::pair<std::string, int64_t>> kept;
};

// Removes every unix socket directly inside `dir` except the one named
// `keep`, unless its lock file (SocketLockPath) is held: a socket with a held
// lock has a live owner and is kept. A socket with no lock file (a plugin
// that takes no lock, e.g. another vendor's) is removed, as the kubelet
// does. The lock is held while the socket is removed, so an owner starting
// at that moment cannot lose a fresh socket. Other entries (lock files
// included) are kept. Errors: `dir` cannot be listed, a socket cannot be
// removed ("cannot remove stale socket ...").
StatusOr<SocketSweep> RemoveUnlockedSockets(Env& env, const std::string& dir,
                                            std::string_view keep);

}  // namespace kdm

#endif  // KDM_BASE_FILE_LOCK_H_
