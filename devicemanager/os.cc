#include "kdm/devicemanager/os.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <memory>

#include "kdm/base/file_system.h"

namespace kdm::devicemanager {

namespace {

std::string ErrnoText(int err) { return std::string(strerror(err)); }

}  // namespace

StatusOr<std::string> ReadBootId(const std::string& path) {
  std::ifstream in(path);
  if (!in) return NotFoundError("cannot read boot id from " + path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r')) {
    line.pop_back();
  }
  if (line.empty()) return InternalError("boot id file " + path + " is empty");
  return line;
}

StatusOr<std::vector<std::string>> RemoveSocketsExcept(const std::string& dir,
                                                       std::string_view keep) {
  std::unique_ptr<DIR, int (*)(DIR*)> d(opendir(dir.c_str()), closedir);
  if (!d) return InternalError("cannot list " + dir + ": " + ErrnoText(errno));
  std::vector<std::string> removed;
  while (struct dirent* e = readdir(d.get())) {
    std::string name = e->d_name;
    if (name == "." || name == ".." || name == keep) continue;
    std::string path = JoinPath(dir, name);
    struct stat st;
    if (lstat(path.c_str(), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return InternalError("cannot remove stale socket " + path + ": " + ErrnoText(errno));
    }
    removed.push_back(name);
  }
  return removed;
}

StatusOr<unsigned> TightenDirectoryMode(const std::string& dir, unsigned max_mode) {
  struct stat st;
  if (stat(dir.c_str(), &st) != 0) {
    return InternalError("cannot stat " + dir + ": " + ErrnoText(errno));
  }
  if (!S_ISDIR(st.st_mode)) return InternalError(dir + " is not a directory");
  const unsigned mode = st.st_mode & 07777;
  if ((mode & ~max_mode) == 0) return mode;
  if (chmod(dir.c_str(), static_cast<mode_t>(mode & max_mode)) != 0) {
    return InternalError("cannot restrict " + dir + " to mode " + ModeText(mode & max_mode) +
                         ": " + ErrnoText(errno));
  }
  return mode;
}

std::string ModeText(unsigned mode) {
  char buf[8];
  snprintf(buf, sizeof(buf), "%04o", mode & 07777);
  return buf;
}

}  // namespace kdm::devicemanager
