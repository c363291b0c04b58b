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

#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/unix_target.h"

namespace kdm::devicemanager {

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

StatusOr<std::string> CheckPluginEndpoint(const std::string& dir, const std::string& endpoint) {
  // The name as shown in messages: NUL bytes visible, long names truncated.
  std::string shown;
  for (char c : endpoint.substr(0, 64)) shown += c == '\0' ? std::string("\\0") : std::string(1, c);
  if (endpoint.size() > 64) shown += "...";
  auto invalid = [&](std::string_view why) {
    return InvalidArgumentError("invalid endpoint \"" + shown + "\": " + std::string(why));
  };
  if (endpoint.empty()) return invalid("the socket file name is empty");
  if (endpoint.find('\0') != std::string::npos) return invalid("contains a NUL byte");
  if (endpoint.find('/') != std::string::npos) {
    return invalid("must be a plain file name inside the plugin directory, without '/'");
  }
  if (endpoint == ".") return invalid("must name a file, not the directory");
  if (endpoint.find("..") != std::string::npos) return invalid("must not contain \"..\"");
  if (endpoint.size() > kMaxEndpointNameLength) {
    return invalid("the file name is " + std::to_string(endpoint.size()) +
                   " bytes, longer than " + std::to_string(kMaxEndpointNameLength));
  }
  // Absolute: a relative plugin directory is read against the working
  // directory now, and the length that counts is the absolute one.
  StatusOr<std::string> abs = pluginapi::AbsoluteSocketPath(JoinPath(dir, endpoint));
  if (!abs.ok()) return invalid(abs.status().message());
  const std::string& path = *abs;
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return NotFoundError("invalid endpoint \"" + shown + "\": no such file in " + dir);
    }
    return invalid("cannot stat " + path + ": " + ErrnoText(errno));
  }
  if (S_ISSOCK(st.st_mode)) return path;
  if (S_ISLNK(st.st_mode)) {
    return invalid("is a symlink; the plugin's socket itself must be in the plugin directory");
  }
  if (S_ISDIR(st.st_mode)) return invalid("not a unix socket but a directory");
  if (S_ISREG(st.st_mode)) return invalid("not a unix socket but a regular file");
  if (S_ISFIFO(st.st_mode)) return invalid("not a unix socket but a FIFO");
  return invalid("not a unix socket");
}

}  // namespace kdm::devicemanager
