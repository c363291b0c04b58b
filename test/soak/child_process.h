// kdm::soak::ChildProcess: one process the soak driver starts, kills,
// restarts and always reaps (kdm kubelet, kdm plugin).
//
// The child's stdout and stderr are appended to a log file; it gets
// PR_SET_PDEATHSIG=SIGKILL, so even a driver that is itself SIGKILLed leaves
// nothing running. Only fork and async-signal-safe calls run between fork
// and exec (the driver has gRPC threads).
//
// Thread-safety: not thread-safe; the driver's one thread owns every child.
//
// Example:
//   ChildProcess kubelet("kubelet", {kdm, "kubelet", "--root", root}, log);
//   if (Status s = kubelet.Start(); !s.ok()) ...;
//   int status = kubelet.Stop(SIGTERM, std::chrono::seconds(30));
#ifndef KDM_TEST_SOAK_CHILD_PROCESS_H_
#define KDM_TEST_SOAK_CHILD_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kdm/base/status.h"

namespace kdm::soak {

class ChildProcess {
 public:
  ChildProcess(std::string name, std::vector<std::string> argv, std::string log_path)
      : name_(std::move(name)), argv_(std::move(argv)), log_path_(std::move(log_path)) {}
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;
  // Kills (SIGKILL) and reaps a child that still runs.
  ~ChildProcess() { (void)Stop(SIGKILL, std::chrono::seconds(10)); }

  const std::string& name() const { return name_; }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int starts() const { return starts_; }

  // Starts the process. REQUIRES: !running(). Fails when the log cannot be
  // opened or fork fails (exec failures show as an exit with status 127).
  Status Start() {
    int log_fd = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return UnavailableError("cannot open " + log_path_ + ": " + std::strerror(errno));
    }
    std::vector<char*> argv;
    for (auto& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) {
      int err = errno;
      ::close(log_fd);
      return UnavailableError("fork for " + name_ + ": " + std::strerror(err));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);  // the driver died meanwhile
      ::setpgid(0, 0);  // a terminal's ^C reaches the driver, which stops us
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      int null_fd = ::open("/dev/null", O_RDONLY);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log_fd);
    pid_ = pid;
    ++starts_;
    return OkStatus();
  }

  // Sends `sig` and waits up to `bound` for the exit; if it has not exited
  // by then, SIGKILLs and reaps it. Returns the wait status, or -1 when it
  // was not running, or -2 when it had to be SIGKILLed after the bound.
  int Stop(int sig, std::chrono::milliseconds bound) {
    if (pid_ <= 0) return -1;
    ::kill(pid_, sig);
    auto end = std::chrono::steady_clock::now() + bound;
    int status = 0;
    while (true) {
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_ || (r < 0 && errno == ECHILD)) {
        pid_ = -1;
        return status;
      }
      if (std::chrono::steady_clock::now() > end) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return -2;
  }

  // Non-blocking: true when the process has exited on its own (reaped; its
  // wait status in *status).
  bool Reap(int* status) {
    if (pid_ <= 0) return false;
    pid_t r = ::waitpid(pid_, status, WNOHANG);
    if (r == pid_ || (r < 0 && errno == ECHILD)) {
      pid_ = -1;
      return true;
    }
    return false;
  }

 private:
  std::string name_;
  std::vector<std::string> argv_;
  std::string log_path_;
  pid_t pid_ = -1;
  int starts_ = 0;
};

// "exit 0", "signal 9", ... for a wait status.
inline std::string DescribeWaitStatus(int status) {
  if (status == -1) return "not running";
  if (status == -2) return "did not exit in time (SIGKILLed)";
  if (WIFEXITED(status)) return "exit " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return "signal " + std::to_string(WTERMSIG(status));
  return "status " + std::to_string(status);
}

}  // namespace kdm::soak

#endif  // KDM_TEST_SOAK_CHILD_PROCESS_H_
