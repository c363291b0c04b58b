#include "kdm/checkpoint/quarantine.h"

#include <ctime>

namespace kdm::checkpoint::internal {
namespace {

std::string DirName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

}  // namespace

std::string UtcTimestampForFileName() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%dT%H%M%SZ", &tm);
  return buf;
}

bool PathExists(Env& env, const std::string& path) { return env.Stat(path).ok(); }

bool IsDirectory(Env& env, const std::string& path) {
  StatusOr<FileInfo> info = env.Stat(path);
  return info.ok() && info->type == FileType::kDirectory;
}

StatusOr<std::string> QuarantineFile(Env& env, const std::string& path,
                                     const std::vector<std::string>& suffixes) {
  std::string base = path + ".corrupt-" + UtcTimestampForFileName();
  std::string target = base;
  auto taken = [&](const std::string& t) {
    if (PathExists(env, t)) return true;
    for (const std::string& s : suffixes) {
      if (PathExists(env, t + s)) return true;
    }
    return false;
  };
  for (int n = 1; taken(target); ++n) target = base + "." + std::to_string(n);
  KDM_RETURN_IF_ERROR(
      env.RenameFile(path, target).WithPrefix("move corrupt file aside to " + target));
  for (const std::string& s : suffixes) {
    std::string from = path + s;
    if (!PathExists(env, from)) continue;
    KDM_RETURN_IF_ERROR(
        env.RenameFile(from, target + s).WithPrefix("move corrupt file aside to " + target + s));
  }
  KDM_RETURN_IF_ERROR(env.SyncDirectory(DirName(path)));
  return target;
}

}  // namespace kdm::checkpoint::internal
