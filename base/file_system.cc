#include "kdm/base/file_system.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

namespace kdm {

namespace {

std::string ErrnoText(int err) { return std::string(strerror(err)); }

}  // namespace

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string out(dir);
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

Status EnsureDirectory(const std::string& dir, unsigned mode) {
  if (dir.empty()) return InvalidArgumentError("directory path is empty");
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = dir.find('/', pos + 1);
    partial = dir.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), static_cast<mode_t>(mode)) != 0 && errno != EEXIST) {
      return InternalError("cannot create directory " + partial + ": " + ErrnoText(errno));
    }
  }
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return InternalError("cannot stat " + dir + ": " + ErrnoText(errno));
  }
  if (!S_ISDIR(st.st_mode)) return FailedPreconditionError(dir + " exists and is not a directory");
  return OkStatus();
}

}  // namespace kdm
