#include "kdm/base/env.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "kdm/base/env_internal.h"
#include "kdm/base/file_system.h"

namespace kdm {

Status ErrnoToStatus(int err, std::string_view what) {
  std::string message = std::string(what) + ": " + std::strerror(err);
  switch (err) {
    case ENOENT:
      return NotFoundError(std::move(message));
    case EACCES:
    case EPERM:
    case EROFS:
      return PermissionDeniedError(std::move(message));
    case ENOSPC:
    case EDQUOT:
    case EMFILE:
    case ENFILE:
      return ResourceExhaustedError(std::move(message));
    case EEXIST:
      return AlreadyExistsError(std::move(message));
    case ENOTDIR:
    case EISDIR:
    case ENOTEMPTY:
      return FailedPreconditionError(std::move(message));
    case ENAMETOOLONG:
    case EINVAL:
    case ELOOP:
      return InvalidArgumentError(std::move(message));
    default:
      return UnavailableError(std::move(message));
  }
}

std::string ModeText(unsigned mode) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

StatusOr<std::string> ReadBootIdFile(Env& env, const std::string& path) {
  // A boot id is 36 bytes; a page is plenty.
  StatusOr<std::string> text = env.ReadFile(path, 4096);
  if (!text.ok()) return text.status().WithPrefix("cannot read boot id from " + path);
  std::string line = text->substr(0, text->find('\n'));
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t')) {
    line.pop_back();
  }
  if (line.empty()) return InternalError("boot id file " + path + " is empty");
  return line;
}

StatusOr<std::vector<std::string>> RemoveSocketsExcept(Env& env, const std::string& dir,
                                                       std::string_view keep) {
  KDM_ASSIGN_OR_RETURN(std::vector<std::string> names, env.ListDirectory(dir));
  std::vector<std::string> removed;
  for (const std::string& name : names) {
    if (name == keep) continue;
    const std::string path = JoinPath(dir, name);
    StatusOr<FileInfo> info = env.Stat(path);
    if (!info.ok() || info->type != FileType::kSocket) continue;
    if (Status s = env.RemoveFile(path); !s.ok() && s.code() != StatusCode::kNotFound) {
      return s.WithPrefix("cannot remove stale socket");
    }
    removed.push_back(name);
  }
  return removed;
}

namespace env_internal {

Status CheckPath(std::string_view path, std::string_view what) {
  if (path.empty()) return InvalidArgumentError(std::string(what) + " path is empty");
  if (path.find('\0') != std::string_view::npos) {
    std::string shown(path.substr(0, path.find('\0')));
    return InvalidArgumentError(std::string(what) + " path \"" + shown +
                                "\" holds a NUL byte at offset " + std::to_string(shown.size()));
  }
  return OkStatus();
}

std::string DirName(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  size_t slash = trimmed.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return trimmed.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

Status TooBig(const std::string& path, uint64_t size, uint64_t max_bytes) {
  return OutOfRangeError(path + ": " + std::to_string(size) + " bytes is larger than the " +
                         std::to_string(max_bytes) + "-byte limit");
}

bool IsHiddenRandomTempFile(std::string_view name) {
  constexpr std::string_view kInfix = ".tmp-";
  constexpr size_t kRandom = 6;  // mkostemp's XXXXXX
  if (name.size() < 1 + 1 + kInfix.size() + kRandom || name.front() != '.') return false;
  std::string_view random = name.substr(name.size() - kRandom);
  std::string_view before = name.substr(0, name.size() - kRandom);
  return before.ends_with(kInfix) && std::all_of(random.begin(), random.end(), [](char c) {
           return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
         });
}

std::optional<int64_t> WriterPidTempFile(std::string_view name, std::string_view target) {
  const std::string prefix = std::string(target) + ".tmp-";
  if (target.empty() || !name.starts_with(prefix)) return std::nullopt;
  std::string_view digits = name.substr(prefix.size());
  if (digits.empty() || digits.size() > 9 || digits.front() == '0' ||
      digits.find_first_not_of("0123456789") != std::string_view::npos) {
    return std::nullopt;
  }
  return std::stoll(std::string(digits));
}

}  // namespace env_internal
}  // namespace kdm
