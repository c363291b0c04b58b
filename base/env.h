// kdm::Env: the seam between kdm and the operating system's files, directory
// watches and process identity (the boot id, live pids). Time has its own
// seam, kdm::Clock (clock.h).
//
// Who goes through it: the Manager (plugin directory, stale sockets, boot id:
// Manager::Options::env), the kubelet JSON checkpoint store (every file
// operation), the SQLite store's checks and quarantine around the file
// (SQLite does its own I/O), the plugin SDK's directory watch, kubeconfig and
// token reads, the NVML plugin's device-node lookups, and the fakes' health
// files, manifest watch and status files. Each takes an Env* in its options
// or as a last argument, defaulting to Env::Default(); besides those
// defaults only the CLI's commands call Env::Default(). Still direct POSIX, each mapped with
// ErrnoToStatus: the SQLite header check, manifest reads (O_NOFOLLOW), the sockets' chmod and
// unlink beside a gRPC bind, and std::filesystem listings in the fakes.
//
// Env::Default() is the POSIX implementation, a process-wide object that is
// never destroyed. NewMemoryEnv() makes an in-memory one for tests: one map
// of paths under one lock; paths are plain strings (repeated and trailing
// slashes are folded; no symlinks, no "." or ".." resolution); modes are
// kept and tightened but never enforced; sockets exist only through
// AddSocketForTest; ProcessExists sees only SetLivePidsForTest's pids (the
// caller's by default); its watchers see exactly the changes made through
// that Env and have a real eventfd as ReadyFd().
//
// Errors follow one errno policy (ErrnoToStatus below): the message names
// the operation and the path, then the errno text. The in-memory Env uses
// the same codes and message shapes.
//
// Thread-safety: every Env method may be called from any thread at the same
// time. A DirectoryWatcher is used by one thread at a time, except Wake(),
// which any thread may call.
//
// Example:
//   kdm::Env* env = options.env;  // Env::Default() unless a test gave another
//   KDM_RETURN_IF_ERROR(env->CreateDirectories(dir, 0750));
//   KDM_RETURN_IF_ERROR(env->WriteFileAtomically(JoinPath(dir, "f.json"), text));
//   KDM_ASSIGN_OR_RETURN(std::string back, env->ReadFile(JoinPath(dir, "f.json"), 1 << 20));
//   KDM_ASSIGN_OR_RETURN(auto watcher, env->WatchDirectory(dir));
//   for (const auto& e : watcher->Wait(std::chrono::milliseconds(100))) Handle(e);
#ifndef KDM_BASE_ENV_H_
#define KDM_BASE_ENV_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"

namespace kdm {

// The errno policy of every kdm module: a Status whose message is
// "<what>: <strerror(err)>" and whose code is
//   ENOENT                         -> NOT_FOUND
//   EACCES, EPERM, EROFS           -> PERMISSION_DENIED
//   ENOSPC, EDQUOT, EMFILE, ENFILE -> RESOURCE_EXHAUSTED
//   EEXIST                         -> ALREADY_EXISTS
//   ENOTDIR, EISDIR, ENOTEMPTY     -> FAILED_PRECONDITION (the path is of the wrong kind)
//   ENAMETOOLONG, EINVAL, ELOOP    -> INVALID_ARGUMENT (the path itself is bad)
//   anything else (EIO, EINTR, …)  -> UNAVAILABLE (may work when retried)
// REQUIRES: err != 0.
Status ErrnoToStatus(int err, std::string_view what);

// A permission mode as four octal digits, e.g. "0750".
std::string ModeText(unsigned mode);

// How WriteFileAtomically names its temporary file beside the target, and
// so which files RemoveStaleTempFiles may remove.
enum class TempFileNaming {
  // ".<name>.tmp-XXXXXX" (six random letters or digits): hidden, so a reader
  // listing "*.json" never sees it. Stale ones can only be told apart from a
  // live writer's by the caller: clean up before anything writes.
  kHiddenRandom,
  // "<name>.tmp-<pid>" (the writer's pid, decimal): a stale one is one whose
  // process is gone, so cleanup is safe while other processes write.
  kWriterPid,
};

struct AtomicWriteOptions {
  unsigned mode = 0644;  // permission bits of the written file
  TempFileNaming naming = TempFileNaming::kHiddenRandom;
};

enum class FileType { kRegular, kDirectory, kSocket, kSymlink, kOther };

struct FileInfo {
  FileType type = FileType::kOther;
  unsigned mode = 0;  // permission bits (07777)
  uint64_t size = 0;
};

// Changes inside one watched directory, named by the entry's file name.
class DirectoryWatcher {
 public:
  enum class EventKind {
    kCreated,        // a new entry (file, socket, directory)
    kWritten,        // a file opened for writing was closed
    kChanged,        // content or attributes changed (not closed yet)
    kRemoved,        // deleted
    kMovedIn,        // renamed into the directory (or within it, new name)
    kMovedOut,       // renamed away (or within it, old name)
    kOverflow,       // events were lost: rescan the directory (name empty)
    kDirectoryGone,  // the watched directory was removed or moved (name empty)
  };
  struct Event {
    EventKind kind;
    std::string name;
  };

  virtual ~DirectoryWatcher() = default;

  // The events since the last call, in order, without waiting (empty when
  // none).
  virtual std::vector<Event> ReadEvents() = 0;

  // Waits at most `timeout` for events or a Wake(), then returns what
  // ReadEvents() returns. Returns early (possibly empty) after Wake().
  virtual std::vector<Event> Wait(std::chrono::milliseconds timeout) = 0;

  // Makes the current Wait(), or else the next one, return at once. Any
  // thread may call it, at any time while the watcher exists.
  virtual void Wake() = 0;

  // A descriptor, owned by the watcher, that polls readable while events
  // are pending, for event loops (e.g. Asio's async_wait). ReadEvents()
  // clears it. Never negative.
  virtual int ReadyFd() const = 0;
};

class Env {
 public:
  // The POSIX Env. Never destroyed; safe from any thread.
  static Env* Default();

  virtual ~Env() = default;

  // The whole content of the regular file `path`. Errors: INVALID_ARGUMENT
  // for an empty path or one holding a NUL; FAILED_PRECONDITION when it is
  // not a regular file; OUT_OF_RANGE when it is larger than `max_bytes`
  // (naming the path, its size and the cap); else the errno policy.
  virtual StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) = 0;

  // Writes `contents` to a temporary file beside `path` (named by
  // options.naming), syncs it, renames it over `path` and syncs the
  // directory: after a crash `path` holds the old content or the new one,
  // whole. On error `path` is unchanged and the temporary file is removed;
  // the message names the path and the failing step.
  virtual Status WriteFileAtomically(const std::string& path, std::string_view contents,
                                     const AtomicWriteOptions& options = {}) = 0;

  // Removes the temporary files that a WriteFileAtomically(path', …, naming)
  // killed before its rename left in `dir`: for kHiddenRandom every regular
  // file ".<name>.tmp-XXXXXX" in `dir`; for kWriterPid the regular files
  // "<target>.tmp-<pid>" whose process is gone, where `target` is the file
  // name of `path_or_dir` (so then it names the target file, not a
  // directory). Nothing else is touched; a file that cannot be removed is
  // skipped. Returns the full paths removed, in no set order. Errors: the
  // directory cannot be listed.
  virtual StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& path_or_dir,
                                                                  TempFileNaming naming) = 0;

  // Creates `dir` and its missing parents with `mode` (existing ones are
  // left as they are). Errors: INVALID_ARGUMENT for an empty path or one
  // holding a NUL; FAILED_PRECONDITION "<dir> exists and is not a directory";
  // a mkdir failure as "cannot create directory <part>" by the errno policy.
  virtual Status CreateDirectories(const std::string& dir, unsigned mode) = 0;

  // Removes every permission bit of the existing directory `dir` that
  // `max_mode` does not have; a directory already as strict is left alone.
  // Returns the mode found (before any change). Errors: missing (NOT_FOUND),
  // not a directory (FAILED_PRECONDITION), chmod refused.
  virtual StatusOr<unsigned> TightenDirectoryMode(const std::string& dir, unsigned max_mode) = 0;

  // What is at `path`, without following a final symlink.
  virtual StatusOr<FileInfo> Stat(const std::string& path) = 0;

  // The entry names in `dir` (not "." and ".."), sorted.
  virtual StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) = 0;

  // Removes a file (not a directory).
  virtual Status RemoveFile(const std::string& path) = 0;

  // Renames `from` to `to`, replacing a file there.
  virtual Status RenameFile(const std::string& from, const std::string& to) = 0;

  // Makes the directory's entries (creations, renames) durable.
  virtual Status SyncDirectory(const std::string& dir) = 0;

  // Starts watching the existing directory `dir`. Errors: NOT_FOUND,
  // FAILED_PRECONDITION (not a directory), or the errno policy of the watch.
  virtual StatusOr<std::unique_ptr<DirectoryWatcher>> WatchDirectory(const std::string& dir) = 0;

  // This boot's id (Linux: /proc/sys/kernel/random/boot_id), trimmed.
  virtual StatusOr<std::string> ReadBootId() = 0;

  // True when `pid` names a live process (kWriterPid's cleanup uses it).
  virtual bool ProcessExists(int64_t pid) = 0;
};

// Linux's boot id file.
inline constexpr std::string_view kBootIdPath = "/proc/sys/kernel/random/boot_id";

// The first line of the file `path` in `env`, trimmed. Errors name the path:
// "cannot read boot id from <path>" (the code from the read) and INTERNAL
// "boot id file <path> is empty".
StatusOr<std::string> ReadBootIdFile(Env& env, const std::string& path);

// Removes every unix socket directly inside `dir` except the one named
// `keep`; returns the file names removed. Other entries are kept.
StatusOr<std::vector<std::string>> RemoveSocketsExcept(Env& env, const std::string& dir,
                                                       std::string_view keep);

// The in-memory Env, for tests. Starts with "/" and "/tmp" as directories,
// the boot id "00000000-0000-4000-8000-000000000000" and only the calling
// process alive. REQUIRES: it outlives its watchers.
class MemoryEnv : public Env {
 public:
  // Test hooks, visibly named.
  virtual void SetBootIdForTest(std::string boot_id) = 0;
  virtual void SetLivePidsForTest(std::vector<int64_t> pids) = 0;
  // Places a unix socket entry at `path` (its directory must exist).
  virtual Status AddSocketForTest(const std::string& path) = 0;
  // Writes `contents` to `path` in place, as a plain write would (a watcher
  // sees kCreated if it is new, kChanged, then kWritten).
  virtual Status WriteFileInPlaceForTest(const std::string& path, std::string_view contents) = 0;
  // Makes the next `count` write operations (WriteFileAtomically's steps,
  // WriteFileInPlaceForTest) fail with `error`, as a full disk would.
  virtual void FailWritesForTest(int count, Status error) = 0;
};

std::unique_ptr<MemoryEnv> NewMemoryEnv();

}  // namespace kdm

#endif  // KDM_BASE_ENV_H_
