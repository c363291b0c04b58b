#include "kdm/checkpoint/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

namespace kdm::checkpoint::internal {
namespace {

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

Status FsyncDirectory(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open directory", dir);
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  if (rc != 0) return ErrnoError(err, "fsync directory", dir);
  return OkStatus();
}

}  // namespace

Status ErrnoError(int err, std::string_view what, std::string_view path) {
  std::string message =
      std::string(what) + " " + std::string(path) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return NotFoundError(std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
      return PermissionDeniedError(std::move(message));
    case ENOSPC:
    case EDQUOT:
      return ResourceExhaustedError(std::move(message));
    case EISDIR:
    case ENOTDIR:
      return FailedPreconditionError(std::move(message));
    default:
      return UnavailableError(std::move(message));
  }
}

std::string UtcTimestampForFileName() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

bool IsDirectory(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

bool PathExists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

StatusOr<std::string> ReadWholeFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "open", path);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    return ErrnoError(err, "stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return FailedPreconditionError(path + " is not a regular file");
  }
  std::string out;
  out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      return ErrnoError(err, "read", path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) return ErrnoError(errno, "create", tmp);
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return ErrnoError(err, "write", tmp);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return ErrnoError(err, "fsync", tmp);
  }
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "close", tmp);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    return ErrnoError(err, "rename " + tmp + " to", path);
  }
  return FsyncDirectory(DirName(path));
}

StatusOr<std::vector<std::string>> RemoveStaleTempFiles(const std::string& path) {
  const std::string dir = DirName(path);
  size_t slash = path.find_last_of('/');
  const std::string prefix =
      (slash == std::string::npos ? path : path.substr(slash + 1)) + ".tmp-";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return ErrnoError(errno, "open directory", dir);
  std::vector<std::string> candidates;
  while (const dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (!name.starts_with(prefix)) continue;
    std::string_view pid_text = name.substr(prefix.size());
    // WriteFileAtomically names its file after its pid, in decimal.
    if (pid_text.empty() || pid_text.size() > 9 || pid_text.front() == '0' ||
        pid_text.find_first_not_of("0123456789") != std::string_view::npos) {
      continue;
    }
    candidates.emplace_back(name);
  }
  ::closedir(d);
  std::vector<std::string> removed;
  for (const std::string& name : candidates) {
    const pid_t pid = static_cast<pid_t>(std::stol(name.substr(prefix.size())));
    // kill(pid, 0) fails with ESRCH only when no such process exists; EPERM
    // means it exists (another user's).
    if (::kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string full = (dir == "/" ? "" : dir) + "/" + name;
    struct stat st {};
    if (::lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (::unlink(full.c_str()) == 0) removed.push_back(full);
  }
  return removed;
}

Status MakeDirectories(const std::string& dir) {
  if (dir.empty()) return InvalidArgumentError("empty directory path");
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    size_t next = dir.find('/', pos + 1);
    prefix = dir.substr(0, next);
    pos = next;
    if (prefix.empty() || prefix == "/") continue;
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError(errno, "mkdir", prefix);
    }
  }
  if (!IsDirectory(dir))
    return FailedPreconditionError(dir + " exists and is not a directory");
  return OkStatus();
}

StatusOr<std::string> QuarantineFile(const std::string& path,
                                     const std::vector<std::string>& suffixes) {
  std::string base = path + ".corrupt-" + UtcTimestampForFileName();
  std::string target = base;
  auto taken = [&](const std::string& t) {
    if (PathExists(t)) return true;
    for (const std::string& s : suffixes) {
      if (PathExists(t + s)) return true;
    }
    return false;
  };
  for (int n = 1; taken(target); ++n) target = base + "." + std::to_string(n);
  if (::rename(path.c_str(), target.c_str()) != 0) {
    return ErrnoError(
        errno, "move corrupt file aside to " + target + ": rename", path);
  }
  for (const std::string& s : suffixes) {
    std::string from = path + s;
    if (!PathExists(from)) continue;
    if (::rename(from.c_str(), (target + s).c_str()) != 0) {
      return ErrnoError(
          errno, "move corrupt file aside to " + target + s + ": rename", from);
    }
  }
  KDM_RETURN_IF_ERROR(FsyncDirectory(DirName(path)));
  return target;
}

}  // namespace kdm::checkpoint::internal
