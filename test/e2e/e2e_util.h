// Helpers shared by the end-to-end tests, which drive the built kdm binary.
#ifndef KDM_TEST_E2E_E2E_UTIL_H_
#define KDM_TEST_E2E_E2E_UTIL_H_

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/test/wait_until.h"

extern char** environ;

namespace kdm::e2e {

// Upper bound of every wait in an e2e test.
inline constexpr std::chrono::seconds kWaitBound{30};

// GET PATH from 127.0.0.1:PORT over plain HTTP (Connection: close); the raw
// answer, or "" when it cannot connect.
inline std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "";
  }
  const std::string req =
      "GET " + path + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, n);
  ::close(fd);
  return out;
}

// The kdm binary under test: $KDM_BINARY_DIR/bin/kdm (set by ctest), else the
// build tree the test was compiled in (KDM_TEST_BINARY_DIR).
inline std::string KdmBinary() {
  const char* dir = std::getenv("KDM_BINARY_DIR");
  return std::string(dir && *dir ? dir : KDM_TEST_BINARY_DIR) + "/bin/kdm";
}

// The whole file, or "" if it cannot be read.
inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `text` beside `path` and renames it in, as editors do, so a watcher
// never sees half a file.
inline void WriteFileAtomically(const std::string& path, const std::string& text) {
  namespace fs = std::filesystem;
  std::string tmp =
      fs::path(path).parent_path().string() + "/." + fs::path(path).filename().string() + ".tmp";
  std::ofstream(tmp) << text;
  fs::rename(tmp, path);
}

// State owned by other processes offers no notification: the e2e tests poll
// it with the tests' one bounded poll, passing kWaitBound.
using kdm::test::WaitUntil;

// The working directory a Process starts in (default: the test's own).
struct InDir {
  std::string path;
};

// One running `kdm` process (the binary under test). Killed with SIGKILL and
// reaped if still running when destroyed.
class Process {
 public:
  // stdout and stderr both appended to `log_path` (read with Log()).
  Process(const std::vector<std::string>& args, const std::string& log_path)
      : Process(InDir{}, args, log_path) {}
  // As above, started in the working directory `cwd` (relative paths in
  // `args` are read from there; `log_path` is opened from there too, so give
  // it absolute).
  Process(const InDir& cwd, const std::vector<std::string>& args, const std::string& log_path)
      : Process(cwd, KdmBinary(), args, log_path) {}
  // The same for another program (a test helper binary) than kdm.
  Process(const std::string& binary, const std::vector<std::string>& args,
          const std::string& log_path)
      : Process(InDir{}, binary, args, log_path) {}
  Process(const InDir& cwd, const std::string& binary, const std::vector<std::string>& args,
          const std::string& log_path)
      : out_(log_path), err_(log_path) {
    Spawn(binary, args, [&](posix_spawn_file_actions_t* a) {
      if (!cwd.path.empty()) posix_spawn_file_actions_addchdir_np(a, cwd.path.c_str());
      posix_spawn_file_actions_addopen(a, STDOUT_FILENO, log_path.c_str(),
                                       O_WRONLY | O_CREAT | O_APPEND, 0644);
      posix_spawn_file_actions_adddup2(a, STDOUT_FILENO, STDERR_FILENO);
    });
  }
  // stdout to `out_path`, stderr to `err_path`, both truncated first.
  Process(const std::vector<std::string>& args, const std::string& out_path,
          const std::string& err_path)
      : Process(InDir{}, args, out_path, err_path) {}
  // As above, started in the working directory `cwd` (see the first pair).
  Process(const InDir& cwd, const std::vector<std::string>& args, const std::string& out_path,
          const std::string& err_path)
      : out_(out_path), err_(err_path) {
    Spawn(KdmBinary(), args, [&](posix_spawn_file_actions_t* a) {
      if (!cwd.path.empty()) posix_spawn_file_actions_addchdir_np(a, cwd.path.c_str());
      posix_spawn_file_actions_addopen(a, STDOUT_FILENO, out_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
      posix_spawn_file_actions_addopen(a, STDERR_FILENO, err_path.c_str(),
                                       O_WRONLY | O_CREAT | O_TRUNC, 0644);
    });
  }
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  ~Process() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  bool Running() {
    if (pid_ <= 0 || exit_code_) return false;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      return false;
    }
    return true;
  }
  // Exit code (128+signal when killed), or nullopt if it did not exit within
  // kWaitBound.
  std::optional<int> Wait() {
    if (!WaitUntil([&] { return !Running(); }, kWaitBound)) return std::nullopt;
    return exit_code_;
  }
  // The combined log (first constructor), or stdout / stderr (second).
  std::string Log() const { return ReadFile(out_); }
  std::string Out() const { return ReadFile(out_); }
  std::string Err() const { return ReadFile(err_); }

 private:
  template <typename Redirect>
  void Spawn(const std::string& binary, const std::vector<std::string>& args, Redirect redirect) {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    redirect(&actions);
    std::vector<std::string> argv_s = {binary};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }

  std::string out_, err_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

}  // namespace kdm::e2e

#endif  // KDM_TEST_E2E_E2E_UTIL_H_
