// The POSIX Env (Linux: inotify for watches, eventfd for wake-ups).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "kdm/base/env.h"
#include "kdm/base/env_internal.h"
#include "kdm/base/file_system.h"

namespace kdm {
namespace {

using env_internal::BaseName;
using env_internal::CheckPath;
using env_internal::DirName;

Status Errno(int err, const std::string& what) { return ErrnoToStatus(err, what); }

// Closes a descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }
  // Closes now; returns close's errno, or 0.
  int Close() {
    int rc = ::close(fd_);
    fd_ = -1;
    return rc == 0 ? 0 : errno;
  }

 private:
  int fd_;
};

FileType TypeOf(mode_t mode) {
  if (S_ISREG(mode)) return FileType::kRegular;
  if (S_ISDIR(mode)) return FileType::kDirectory;
  if (S_ISSOCK(mode)) return FileType::kSocket;
  if (S_ISLNK(mode)) return FileType::kSymlink;
  return FileType::kOther;
}

constexpr uint32_t kWatchMask = IN_CREATE | IN_CLOSE_WRITE | IN_MODIFY | IN_ATTRIB | IN_DELETE |
                                IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE_SELF | IN_MOVE_SELF |
                                IN_ONLYDIR;

class PosixDirectoryWatcher final : public DirectoryWatcher {
 public:
  PosixDirectoryWatcher(int inotify_fd, int wake_fd) : inotify_fd_(inotify_fd), wake_fd_(wake_fd) {}
  ~PosixDirectoryWatcher() override {
    ::close(inotify_fd_);
    ::close(wake_fd_);
  }

  std::vector<Event> ReadEvents() override {
    std::vector<Event> out;
    alignas(struct inotify_event) char buf[16 * 1024];
    while (true) {
      ssize_t len = ::read(inotify_fd_, buf, sizeof buf);
      if (len < 0 && errno == EINTR) continue;
      if (len <= 0) break;
      for (char* p = buf; p < buf + len;) {
        struct inotify_event ev;
        std::memcpy(&ev, p, sizeof ev);
        std::string name;
        const char* raw_name = p + sizeof(struct inotify_event);
        if (ev.len > 0) name.assign(raw_name, strnlen(raw_name, ev.len));
        p += sizeof(struct inotify_event) + ev.len;
        Translate(ev.mask, std::move(name), out);
      }
    }
    return out;
  }

  std::vector<Event> Wait(std::chrono::milliseconds timeout) override {
    struct pollfd fds[2] = {{inotify_fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    int ms = static_cast<int>(std::clamp<int64_t>(timeout.count(), 0, 24 * 3600 * 1000));
    int n = ::poll(fds, 2, ms);
    if (n > 0 && (fds[1].revents & POLLIN)) {
      uint64_t count;
      (void)!::read(wake_fd_, &count, sizeof count);
    }
    return ReadEvents();
  }

  void Wake() override {
    uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof one);
  }

  int ReadyFd() const override { return inotify_fd_; }

 private:
  static void Translate(uint32_t mask, std::string name, std::vector<Event>& out) {
    if (mask & IN_Q_OVERFLOW) {
      out.push_back({EventKind::kOverflow, ""});
      return;
    }
    if (mask & (IN_DELETE_SELF | IN_MOVE_SELF)) {
      out.push_back({EventKind::kDirectoryGone, ""});
      return;
    }
    if (mask & IN_IGNORED) {  // the watch is gone (after IN_DELETE_SELF, or an unmount)
      out.push_back({EventKind::kDirectoryGone, ""});
      return;
    }
    if (name.empty()) return;  // an event about the directory itself
    EventKind kind;
    if (mask & IN_CREATE) {
      kind = EventKind::kCreated;
    } else if (mask & IN_CLOSE_WRITE) {
      kind = EventKind::kWritten;
    } else if (mask & IN_DELETE) {
      kind = EventKind::kRemoved;
    } else if (mask & IN_MOVED_TO) {
      kind = EventKind::kMovedIn;
    } else if (mask & IN_MOVED_FROM) {
      kind = EventKind::kMovedOut;
    } else {
      kind = EventKind::kChanged;
    }
    out.push_back({kind, std::move(name)});
  }

  const int inotify_fd_;
  const int wake_fd_;
};

class PosixEnv final : public Env {
 public:
  StatusOr<std::string> ReadFile(const std::string& path, uint64_t max_bytes) override {
    KDM_RETURN_IF_ERROR(CheckPath(path, "file"));
    // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused
    // below as not a regular file.
    ScopedFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
    if (fd.get() < 0) return Errno(errno, "cannot open " + path);
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) return Errno(errno, "cannot stat " + path);
    if (S_ISDIR(st.st_mode)) {
      return FailedPreconditionError(path + " is not a regular file: it is a directory");
    }
    if (!S_ISREG(st.st_mode)) return FailedPreconditionError(path + " is not a regular file");
    const uint64_t size = static_cast<uint64_t>(st.st_size);
    if (size > max_bytes) return env_internal::TooBig(path, size, max_bytes);
    std::string out;
    out.reserve(static_cast<size_t>(size));
    char buf[1 << 16];
    while (true) {
      ssize_t n = ::read(fd.get(), buf, sizeof buf);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errno(errno, "cannot read " + path);
      }
      if (n == 0) break;
      out.append(buf, static_cast<size_t>(n));
      // The file grew while being read: the cap holds all the same.
      if (out.size() > max_bytes) return env_internal::TooBig(path, out.size(), max_bytes);
    }
    return out;
  }

  Status WriteFileAtomically(const std::string& path, std::string_view contents,
                             const AtomicWriteOptions& options) override {
    KDM_RETURN_IF_ERROR(CheckPath(path, "file"));
    if (path.back() == '/') return InvalidArgumentError(path + " names a directory, not a file");
    const std::string dir = DirName(path);
    const std::string name = BaseName(path);
    std::string tmp;
    int raw_fd;
    if (options.naming == TempFileNaming::kHiddenRandom) {
      tmp = JoinPath(dir, "." + name + ".tmp-XXXXXX");
      raw_fd = ::mkostemp(tmp.data(), O_CLOEXEC);
    } else {
      tmp = path + ".tmp-" + std::to_string(::getpid());
      raw_fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    }
    if (raw_fd < 0) return Errno(errno, "cannot write " + path + ": create " + tmp);
    ScopedFd fd(raw_fd);
    auto fail = [&](int err, const std::string& step) {
      ::unlink(tmp.c_str());
      return Errno(err, "cannot write " + path + ": " + step);
    };
    for (std::string_view rest = contents; !rest.empty();) {
      ssize_t n = ::write(fd.get(), rest.data(), rest.size());
      if (n < 0) {
        if (errno == EINTR) continue;
        return fail(errno, "write " + tmp);
      }
      rest.remove_prefix(static_cast<size_t>(n));
    }
    if (::fchmod(fd.get(), static_cast<mode_t>(options.mode & 07777)) != 0) {
      return fail(errno, "chmod " + tmp);
    }
    if (::fsync(fd.get()) != 0) return fail(errno, "fsync " + tmp);
    if (int err = fd.Close(); err != 0) return fail(err, "close " + tmp);
    if (::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno, "rename " + tmp + " onto it");
    return SyncDirectory(dir);
  }

  StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& path_or_dir,
                                                          TempFileNaming naming) override {
    KDM_RETURN_IF_ERROR(CheckPath(path_or_dir, "path"));
    const bool by_pid = naming == TempFileNaming::kWriterPid;
    const std::string dir = by_pid ? DirName(path_or_dir) : path_or_dir;
    const std::string target = by_pid ? BaseName(path_or_dir) : "";
    KDM_ASSIGN_OR_RETURN(std::vector<std::string> names, ListDirectory(dir));
    std::vector<std::string> removed;
    for (const std::string& name : names) {
      if (by_pid) {
        std::optional<int64_t> pid = env_internal::WriterPidTempFile(name, target);
        if (!pid || ProcessExists(*pid)) continue;
      } else if (!env_internal::IsHiddenRandomTempFile(name)) {
        continue;
      }
      const std::string full = JoinPath(dir, name);
      struct stat st {};
      if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (::unlink(full.c_str()) == 0) removed.push_back(full);
    }
    return removed;
  }

  Status CreateDirectories(const std::string& dir, unsigned mode) override {
    KDM_RETURN_IF_ERROR(CheckPath(dir, "directory"));
    size_t pos = 0;
    while (pos != std::string::npos) {
      pos = dir.find('/', pos + 1);
      const std::string partial = dir.substr(0, pos);
      if (partial.empty() || partial == "/") continue;
      if (::mkdir(partial.c_str(), static_cast<mode_t>(mode & 07777)) != 0 && errno != EEXIST) {
        return Errno(errno, "cannot create directory " + partial);
      }
    }
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return Errno(errno, "cannot stat " + dir);
    if (!S_ISDIR(st.st_mode)) {
      return FailedPreconditionError(dir + " exists and is not a directory");
    }
    return OkStatus();
  }

  StatusOr<unsigned> TightenDirectoryMode(const std::string& dir, unsigned max_mode) override {
    KDM_RETURN_IF_ERROR(CheckPath(dir, "directory"));
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return Errno(errno, "cannot stat " + dir);
    if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(dir + " is not a directory");
    const unsigned mode = st.st_mode & 07777;
    if ((mode & ~max_mode) == 0) return mode;
    if (::chmod(dir.c_str(), static_cast<mode_t>(mode & max_mode)) != 0) {
      return Errno(errno, "cannot restrict " + dir + " to mode " + ModeText(mode & max_mode));
    }
    return mode;
  }

  StatusOr<FileInfo> Stat(const std::string& path) override {
    KDM_RETURN_IF_ERROR(CheckPath(path, "path"));
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0) return Errno(errno, "cannot stat " + path);
    return FileInfo{TypeOf(st.st_mode), static_cast<unsigned>(st.st_mode & 07777),
                    static_cast<uint64_t>(st.st_size)};
  }

  StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    KDM_RETURN_IF_ERROR(CheckPath(dir, "directory"));
    std::unique_ptr<DIR, int (*)(DIR*)> d(::opendir(dir.c_str()), ::closedir);
    if (!d) return Errno(errno, "cannot list " + dir);
    std::vector<std::string> names;
    while (const dirent* e = ::readdir(d.get())) {
      std::string_view name(e->d_name);
      if (name == "." || name == "..") continue;
      names.emplace_back(name);
    }
    std::sort(names.begin(), names.end());
    return names;
  }

  Status RemoveFile(const std::string& path) override {
    KDM_RETURN_IF_ERROR(CheckPath(path, "file"));
    if (::unlink(path.c_str()) != 0) return Errno(errno, "cannot remove " + path);
    return OkStatus();
  }

  Status RenameFile(const std::string& from, const std::string& to) override {
    KDM_RETURN_IF_ERROR(CheckPath(from, "path"));
    KDM_RETURN_IF_ERROR(CheckPath(to, "path"));
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return Errno(errno, "cannot rename " + from + " to " + to);
    }
    return OkStatus();
  }

  Status SyncDirectory(const std::string& dir) override {
    KDM_RETURN_IF_ERROR(CheckPath(dir, "directory"));
    ScopedFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (fd.get() < 0) return Errno(errno, "cannot open directory " + dir);
    if (::fsync(fd.get()) != 0) return Errno(errno, "cannot fsync directory " + dir);
    return OkStatus();
  }

  StatusOr<std::unique_ptr<DirectoryWatcher>> WatchDirectory(const std::string& dir) override {
    KDM_RETURN_IF_ERROR(CheckPath(dir, "directory"));
    int inotify_fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (inotify_fd < 0) return Errno(errno, "cannot watch " + dir + ": inotify_init1");
    if (::inotify_add_watch(inotify_fd, dir.c_str(), kWatchMask) < 0) {
      int err = errno;
      ::close(inotify_fd);
      if (err == ENOTDIR) {
        return FailedPreconditionError("cannot watch " + dir + ": not a directory");
      }
      return Errno(err, "cannot watch " + dir);
    }
    int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd < 0) {
      int err = errno;
      ::close(inotify_fd);
      return Errno(err, "cannot watch " + dir + ": eventfd");
    }
    return std::unique_ptr<DirectoryWatcher>(new PosixDirectoryWatcher(inotify_fd, wake_fd));
  }

  StatusOr<std::string> ReadBootId() override {
    return ReadBootIdFile(*this, std::string(kBootIdPath));
  }

  bool ProcessExists(int64_t pid) override {
    if (pid <= 0 || pid > INT32_MAX) return false;
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM
    // means it exists (another user's).
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH;
  }
};

}  // namespace

Env* Env::Default() {
  static Env* const env = new PosixEnv();  // never destroyed: usable at exit
  return env;
}

}  // namespace kdm
