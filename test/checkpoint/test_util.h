// Helpers shared by the checkpoint tests: a private temporary directory per
// test and access to the in-repo test vectors.
#ifndef KDM_TEST_CHECKPOINT_TEST_UTIL_H_
#define KDM_TEST_CHECKPOINT_TEST_UTIL_H_

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kdm/checkpoint/store.h"

namespace kdm::checkpoint::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with its content.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/kdm-ckpt-XXXXXX";
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    if (mkdtemp(buf.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = buf.data();
  }
  ~TempDir() { RemoveAll(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  static void RemoveAll(const std::string& path) {
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
      if (DIR* d = opendir(path.c_str())) {
        while (dirent* e = readdir(d)) {
          std::string name = e->d_name;
          if (name == "." || name == "..") continue;
          RemoveAll(path + "/" + name);
        }
        closedir(d);
      }
      rmdir(path.c_str());
    } else {
      unlink(path.c_str());
    }
  }
  std::string path_;
};

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void WriteFile(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error("cannot write " + path);
  out << content;
}

inline bool Exists(const std::string& path) {
  struct stat st {};
  return lstat(path.c_str(), &st) == 0;
}

// Names in `dir` that start with `prefix`.
inline std::vector<std::string> ListWithPrefix(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name.rfind(prefix, 0) == 0) out.push_back(name);
    }
    closedir(d);
  }
  return out;
}

// The kubelet checkpoint test vectors (test/checkpoint/testdata: files in a
// real kubelet's format and their checksums; see its README.md).
inline std::string TestdataDir() {
  return std::string(KDM_TEST_SOURCE_DIR) + "/test/checkpoint/testdata";
}

// The base names of every "<name>.json" test vector, sorted.
inline std::vector<std::string> TestdataCheckpoints() {
  std::vector<std::string> out;
  for (const std::string& name : ListWithPrefix(TestdataDir(), "")) {
    if (name.size() > 5 && name.substr(name.size() - 5) == ".json") {
      out.push_back(name.substr(0, name.size() - 5));
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

inline PodDevicesEntry Entry(std::string uid, std::string container, std::string resource,
                             DevicesPerNuma ids, std::string resp = "") {
  return PodDevicesEntry{std::move(uid), std::move(container), std::move(resource), std::move(ids),
                         std::move(resp)};
}

}  // namespace kdm::checkpoint::testing

#endif  // KDM_TEST_CHECKPOINT_TEST_UTIL_H_
