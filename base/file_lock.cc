#include "kdm/base/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include "kdm/base/env_internal.h"
#include "kdm/base/file_system.h"

namespace kdm {
namespace {

// The most of a lock file ever read: a pid and a newline fit many times.
constexpr size_t kMaxLockFileRead = 32;

// Closes a lock file descriptor when it goes out of scope, unless taken.
class LockFd {
 public:
  explicit LockFd(int fd) : fd_(fd) {}
  ~LockFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  LockFd(const LockFd&) = delete;
  LockFd& operator=(const LockFd&) = delete;
  int get() const { return fd_; }
  int Take() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

// Opens `path` for a lock: never follows a final symlink, never blocks on a
// FIFO, closed on exec; then checks that it is a regular file.
StatusOr<int> OpenLockFile(const std::string& path, int flags) {
  KDM_RETURN_IF_ERROR(env_internal::CheckPath(path, "lock file"));
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) {
    const int err = errno;
    if (err == ELOOP) {
      return InvalidArgumentError("lock file " + path + " is a symlink; refusing to follow it");
    }
    return ErrnoToStatus(err, "cannot open lock file " + path);
  }
  LockFd closer(fd);
  struct stat st {};
  if (::fstat(fd, &st) != 0) return ErrnoToStatus(errno, "cannot stat lock file " + path);
  if (!S_ISREG(st.st_mode)) {
    return FailedPreconditionError("lock file " + path + " is not a regular file");
  }
  return closer.Take();
}

// flock(LOCK_EX | LOCK_NB): true when taken, false when another open file
// description holds it.
StatusOr<bool> TryLock(int fd, const std::string& path) {
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc == 0) return true;
  if (errno == EWOULDBLOCK) return false;
  return ErrnoToStatus(errno, "cannot lock " + path);
}

std::optional<int64_t> ParsePid(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.empty() || text.size() > 10 || text.front() == '0' ||
      text.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  const int64_t pid = std::stoll(std::string(text));
  if (pid > INT32_MAX) return std::nullopt;
  return pid;
}

std::optional<int64_t> ReadPid(int fd) {
  char buf[kMaxLockFileRead];
  ssize_t n;
  do {
    n = ::pread(fd, buf, sizeof buf, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0 || static_cast<size_t>(n) == sizeof buf) return std::nullopt;
  return ParsePid(std::string_view(buf, static_cast<size_t>(n)));
}

Status HeldError(const std::string& path, std::optional<int64_t> pid) {
  if (!pid) return FailedPreconditionError(path + " is held by another process (it names no pid)");
  return FailedPreconditionError(path + " is held by pid " + std::to_string(*pid));
}

}  // namespace

StatusOr<FileLock> FileLock::Acquire(const std::string& path) {
  KDM_ASSIGN_OR_RETURN(int raw, OpenLockFile(path, O_RDWR | O_CREAT));
  LockFd fd(raw);
  KDM_ASSIGN_OR_RETURN(bool taken, TryLock(fd.get(), path));
  if (!taken) return HeldError(path, ReadPid(fd.get()));
  const std::string text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd.get(), 0) != 0) return ErrnoToStatus(errno, "cannot write lock file " + path);
  ssize_t n;
  do {
    n = ::pwrite(fd.get(), text.data(), text.size(), 0);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return ErrnoToStatus(errno, "cannot write lock file " + path);
  if (static_cast<size_t>(n) != text.size()) {
    return UnavailableError("cannot write lock file " + path + ": short write");
  }
  return FileLock(path, fd.Take());
}

FileLock::FileLock(FileLock&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    Release();
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FileLock::~FileLock() { Release(); }

void FileLock::Release() {
  // Closing the only descriptor of the open file description drops the lock.
  if (fd_ >= 0) ::close(std::exchange(fd_, -1));
}

bool IsLockHeldError(const Status& s) {
  return s.code() == StatusCode::kFailedPrecondition &&
         s.message().find(" is held by ") != std::string::npos;
}

StatusOr<bool> IsFileLockHeld(const std::string& path) {
  StatusOr<int> raw = OpenLockFile(path, O_RDONLY);
  if (!raw.ok()) {
    if (raw.status().code() == StatusCode::kNotFound) return false;
    return raw.status();
  }
  LockFd fd(*raw);
  KDM_ASSIGN_OR_RETURN(bool taken, TryLock(fd.get(), path));
  return !taken;  // taken: nobody held it (closing fd drops ours)
}

std::optional<int64_t> LockHolderPid(const std::string& path) {
  StatusOr<int> raw = OpenLockFile(path, O_RDONLY);
  if (!raw.ok()) return std::nullopt;
  LockFd fd(*raw);
  return ReadPid(fd.get());
}

std::string SocketLockPath(std::string_view socket_path) {
  return std::string(socket_path) + ".lock";
}

StatusOr<SocketSweep> RemoveUnlockedSockets(Env& env, const std::string& dir,
                                            std::string_view keep) {
  KDM_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDirectory(dir));
  SocketSweep sweep;
  for (const std::string& name : names) {
    if (name == keep) continue;
    const std::string path = JoinPath(dir, name);
    StatusOr<FileInfo> info = env.Stat(path);
    if (!info.ok() || info->type != FileType::kSocket) continue;
    // Hold the socket's lock (when it has a lock file) while removing it.
    const std::string lock_path = SocketLockPath(path);
    std::optional<LockFd> held;
    if (StatusOr<int> raw = OpenLockFile(lock_path, O_RDONLY); raw.ok()) {
      held.emplace(*raw);
      StatusOr<bool> taken = TryLock(held->get(), lock_path);
      if (taken.ok() && !*taken) {
        sweep.kept.emplace_back(name, ReadPid(held->get()).value_or(0));
        continue;
      }
    }
    if (Status s = env.RemoveFile(path); !s.ok() && s.code() != StatusCode::kNotFound) {
      return s.WithPrefix("cannot remove stale socket");
    }
    sweep.removed.push_back(name);
  }
  return sweep;
}

}  // namespace kdm
