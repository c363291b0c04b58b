#include "kdm/base/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

extern char** environ;

namespace kdm {
namespace {

using SteadyTime = std::chrono::steady_clock;

// Closes its descriptors on every way out.
struct Fds {
  int fd[4] = {-1, -1, -1, -1};
  ~Fds() {
    for (int f : fd) {
      if (f >= 0) ::close(f);
    }
  }
  void Close(int i) {
    if (fd[i] >= 0) ::close(fd[i]);
    fd[i] = -1;
  }
};

std::string LastLine(const std::string& text) {
  size_t end = text.find_last_not_of("\r\n \t");
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  std::string line = text.substr(start, end + 1 - start);
  if (line.size() > 200) line = line.substr(0, 200) + "...";
  return line;
}

// The child's environment: the parent's, with extra_env on top.
std::vector<std::string> ChildEnv(const std::map<std::string, std::string>& extra) {
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string entry = *e;
    std::string name = entry.substr(0, entry.find('='));
    if (!extra.contains(name)) env.push_back(std::move(entry));
  }
  for (const auto& [name, value] : extra) env.push_back(name + "=" + value);
  return env;
}

}  // namespace

std::string SubprocessResult::Describe() const {
  std::string out;
  if (timed_out) {
    out = "ran past its timeout and was killed";
  } else if (output_overflow) {
    out = "printed more than it may and was killed";
  } else if (term_signal != 0) {
    out = "killed by signal " + std::to_string(term_signal);
  } else {
    out = "exited " + std::to_string(exit_code);
  }
  std::string line = LastLine(stderr_text);
  if (!line.empty()) out += ": " + line;
  return out;
}

StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& options) {
  if (options.argv.empty() || options.argv[0].empty()) {
    return InvalidArgumentError("no program to run");
  }
  Fds fds;  // [0] stdout read, [1] stdout write, [2] stderr read, [3] stderr write
  for (int i : {0, 2}) {
    if (i == 2 && options.inherit_stderr) continue;
    int p[2];
    if (::pipe2(p, O_CLOEXEC) != 0) return InternalError(std::string("pipe: ") + strerror(errno));
    fds.fd[i] = p[0];
    fds.fd[i + 1] = p[1];
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, fds.fd[1], STDOUT_FILENO);
  if (!options.inherit_stderr) posix_spawn_file_actions_adddup2(&actions, fds.fd[3], STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // A group of its own (killed whole on timeout), and the default signal
  // mask and dispositions (the parent may block SIGTERM for its own use).
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<std::string> argv_s = options.argv;
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_s = ChildEnv(options.extra_env);
  std::vector<char*> envp;
  for (std::string& e : env_s) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_t pid = -1;
  int err = ::posix_spawnp(&pid, argv[0], &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err != 0) {
    // glibc reports here a program that cannot be executed.
    std::string message = options.argv[0] + ": " + strerror(err);
    if (err == ENOENT) return NotFoundError(message);
    return FailedPreconditionError(message);
  }
  fds.Close(1);
  fds.Close(3);

  SubprocessResult result;
  const SteadyTime::time_point deadline = SteadyTime::now() + options.timeout;
  std::string* texts[2] = {&result.stdout_text, &result.stderr_text};
  size_t* dropped[2] = {&result.stdout_dropped, &result.stderr_dropped};
  int open_streams = options.inherit_stderr ? 1 : 2;
  while (open_streams > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - SteadyTime::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      break;
    }
    pollfd p[2] = {{fds.fd[0], POLLIN, 0}, {fds.fd[2], POLLIN, 0}};
    int n = ::poll(p, 2, static_cast<int>(std::min<int64_t>(left.count() + 1, 1'000)));
    if (n < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (p[i].fd < 0 || (p[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buf[16384];
      ssize_t got = ::read(p[i].fd, buf, sizeof buf);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        fds.Close(i * 2);
        --open_streams;
        continue;
      }
      size_t room = options.max_output_bytes - std::min(options.max_output_bytes, texts[i]->size());
      size_t keep = std::min<size_t>(room, static_cast<size_t>(got));
      texts[i]->append(buf, keep);
      *dropped[i] += static_cast<size_t>(got) - keep;
      if (i == 0 && *dropped[i] > 0 && options.kill_past_max_output) {
        result.output_overflow = true;
        open_streams = 0;
        break;
      }
    }
  }
  // Both outputs closed: the child is ending, or went on running without
  // them. Either way its wait is bounded by the same deadline.
  int status = 0;
  while (true) {
    if (!result.timed_out && !result.output_overflow) {
      pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got == pid) break;
      if (got < 0 && errno != EINTR) break;
      if (SteadyTime::now() < deadline) {
        ::usleep(2'000);
        continue;
      }
      result.timed_out = true;
    }
    ::kill(-pid, SIGKILL);
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    break;
  }
  if (WIFSIGNALED(status)) {
    result.term_signal = WTERMSIG(status);
  } else if (WIFEXITED(status)) {
    result.exit_code = WEXITSTATUS(status);
  }
  return result;
}

}  // namespace kdm
