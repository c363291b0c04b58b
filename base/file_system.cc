#include "kdm/base/file_system.h"

#include "kdm/base/env.h"

namespace kdm {

std::string JoinPath(std::string_view dir, std::string_view name) {
  std::string out(dir);
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out.empty() || out.back() != '/') out += '/';
  out += name;
  return out;
}

Status EnsureDirectory(const std::string& dir, unsigned mode, Env* env) {
  return env->CreateDirectories(dir, mode);
}

}  // namespace kdm
