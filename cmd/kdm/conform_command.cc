// `kdm conform`: acts as the kubelet toward one device plugin and checks it
// against the device plugin API contract (kdm::conformance). See
// docs/conformance.md.
//
// Exit codes: 0 no check failed; 1 at least one check failed; 2 bad usage
// (missing --resource, neither or both of --root and --plugin-socket, a
// malformed --timeout, an unknown --only id, an empty or oversized
// --health-trigger, an unknown argument, a --root
// whose agent is alive: its lock .kdm-kubelet.lock is held, so
// --plugin-socket is the way); 3 the
// plugin could not be checked at all (no plugin registered within
// --timeout, the socket cannot be dialed, the directory cannot be used) or
// the --junit file cannot be written (the text report is still printed), or
// <root>/device-plugins/kubelet.sock.lock is held by another process (another
// `kdm conform --root`). With --root, that lock is held while the checks run;
// 130/143 stopped by SIGINT/SIGTERM (the socket it served is removed, no
// report).
// Path flags may be relative (made absolute at once); a socket path too
// long for a unix socket or a directory that cannot be made is exit 3 with a
// message naming the flag.
// The report goes to stdout, logs to stderr.
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/file_lock.h"
#include "kdm/base/file_system.h"
#include "kdm/conformance/report.h"
#include "kdm/conformance/runner.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::cli {
namespace {

constexpr int kChecksFailed = 1;
constexpr int kCannotCheck = 3;

struct ConformFlags {
  std::string root;
  std::string plugin_socket;
  std::string resource;
  std::string timeout = "10s";
  std::string junit;
  std::string only;
  std::string health_trigger;
  bool health_trigger_given = false;
  int verbosity = 0;
};

int ConformFail(int code, const std::string& message) {
  std::cerr << "kdm conform: " << message << "\n";
  if (code == kUsageError) std::cerr << "Run 'kdm conform --help' for usage.\n";
  return code;
}

// A check run has nothing to finish cleanly: on SIGINT or SIGTERM a watcher
// thread removes `socket` (the kubelet.sock we serve under --root; "" for
// none; only a socket is removed), writes one line and exits at once with
// 128 + signal (130, 143), the report left unprinted. Blocks both signals in
// the caller first, so every later thread inherits the mask.
void ExitOnStopSignal(std::string socket) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::thread([signals, socket = std::move(socket)] {
    int sig = 0;
    while (sigwait(&signals, &sig) != 0) {
    }
    struct stat st;
    bool removed = false;
    if (!socket.empty() && ::lstat(socket.c_str(), &st) == 0 && S_ISSOCK(st.st_mode)) {
      removed = ::unlink(socket.c_str()) == 0;
    }
    std::string line = "kdm conform: event=stopped signal=" + StopSignalName(sig) +
                       (removed ? " removed=" + socket : "") +
                       " exit_code=" + std::to_string(128 + sig) + "\n";
    (void)!::write(STDERR_FILENO, line.data(), line.size());
    ::_exit(128 + sig);
  }).detach();
}

std::vector<std::string> SplitIds(const std::string& text) {
  std::vector<std::string> ids;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string id = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (!id.empty()) ids.push_back(id);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ids;
}

int RunConform(const ConformFlags& f) {
  conformance::Runner::Options options;
  std::string junit;
  // Path flags are made absolute at once (see cli_common.h).
  const std::pair<const char*, std::pair<const std::string*, std::string*>> paths[] = {
      {"--root", {&f.root, &options.root}},
      {"--plugin-socket", {&f.plugin_socket, &options.plugin_socket}},
      {"--junit", {&f.junit, &junit}}};
  for (const auto& [flag, from_to] : paths) {
    StatusOr<std::string> abs = AbsolutePathFlag(flag, *from_to.first);
    if (!abs.ok()) return ConformFail(kCannotCheck, abs.status().message());
    *from_to.second = *abs;
  }
  options.resource = f.resource;
  StatusOr<std::chrono::milliseconds> timeout = ParseDurationFlag(f.timeout);
  if (!timeout.ok()) return ConformFail(kUsageError, "--timeout: " + timeout.status().message());
  options.timeout = *timeout;
  options.only = SplitIds(f.only);
  if (f.health_trigger_given) {
    if (f.health_trigger.find_first_not_of(" \t\n") == std::string::npos) {
      return ConformFail(kUsageError, "--health-trigger: the command is empty");
    }
    options.health_trigger = f.health_trigger;
  }
  if (Status s = conformance::Runner::CheckOptions(options); !s.ok()) {
    return ConformFail(kUsageError, s.message());
  }
  if (!options.root.empty()) {
    if (Status s = CheckSocketPathFlag("--root", options.root + "/device-plugins/kubelet.sock");
        !s.ok()) {
      return ConformFail(kCannotCheck, s.message());
    }
  } else if (Status s = CheckSocketPathFlag("--plugin-socket", options.plugin_socket); !s.ok()) {
    return ConformFail(kCannotCheck, s.message());
  }
  // `kdm --dry-run conform`: every check above is pure; nothing below is.
  if (DryRun()) return kOk;
  SetUpStderrLogging("kdm-conform", LogLevelFor(f.verbosity, spdlog::level::warn));
  // A socket path that cannot work and a directory that cannot be made are
  // said here, naming their flag, before anything is served or dialled.
  // kubelet.sock.lock is held while the checks run: an agent started on the
  // same root meanwhile refuses instead of taking kubelet.sock over.
  std::optional<FileLock> kubelet_sock_lock;
  if (!options.root.empty()) {
    const std::string dir = options.root + "/device-plugins";
    if (Status s = CheckSocketPathFlag("--root", dir + "/kubelet.sock"); !s.ok()) {
      return ConformFail(kCannotCheck, s.message());
    }
    // A root with a live agent: its kubelet.sock is the agent's, and serving
    // ours there would cut its plugins off. Said before anything is touched.
    const std::string agent_lock = JoinPath(options.root, kAgentLockName);
    // A lock file that cannot be opened (no root yet, a file in the way) has
    // no holder: what is wrong with the directory is said below.
    StatusOr<bool> agent = IsFileLockHeld(agent_lock);
    if (agent.ok() && *agent) {
      const std::optional<int64_t> pid = LockHolderPid(agent_lock);
      return ConformFail(kUsageError,
                         "--root " + options.root + " has a live agent (" +
                             (pid ? "pid " + std::to_string(*pid) : std::string("a process")) +
                             " holds " + agent_lock +
                             "); to check a plugin registered with it, use --plugin-socket " + dir +
                             "/<the plugin's socket> instead");
    }
    // Mode 0750 (DIR too, when missing), as the device manager makes its
    // plugin directory: what docs/conformance.md says.
    if (Status s = EnsureDirectory(dir, 0750); !s.ok()) {
      return ConformFail(kCannotCheck, s.WithPrefix("--root").message());
    }
    StatusOr<FileLock> lock =
        FileLock::Acquire(SocketLockPath(JoinPath(dir, pluginapi::kKubeletSocketName)));
    if (!lock.ok()) {
      if (!IsLockHeldError(lock.status())) {
        return ConformFail(kCannotCheck, "--root: " + lock.status().message());
      }
      return ConformFail(kCannotCheck,
                         "--root " + options.root +
                             ": device-plugins/kubelet.sock is in use: " + lock.status().message());
    }
    kubelet_sock_lock.emplace(std::move(*lock));
  } else if (Status s = CheckSocketPathFlag("--plugin-socket", options.plugin_socket); !s.ok()) {
    return ConformFail(kCannotCheck, s.message());
  }
  // A plugin that goes away mid-check must not kill us with SIGPIPE.
  signal(SIGPIPE, SIG_IGN);
  // Before the runner's threads exist: SIGINT/SIGTERM removes the
  // registration socket we serve and ends the run at once.
  ExitOnStopSignal(options.root.empty() ? "" : options.root + "/device-plugins/kubelet.sock");

  StatusOr<conformance::Report> report = conformance::Runner::Run(options);
  if (!report.ok()) return ConformFail(kCannotCheck, report.status().message());
  std::cout << conformance::RenderText(*report) << std::flush;
  if (!junit.empty()) {
    if (Status s = conformance::WriteFileAtomically(junit, conformance::RenderJUnit(*report));
        !s.ok()) {
      return ConformFail(kCannotCheck, "--junit: " + s.message());
    }
  }
  return report->failed() > 0 ? kChecksFailed : 0;
}

}  // namespace

void AddConformCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<ConformFlags>();
  CLI::App* cmd = app.add_subcommand(
      "conform",
      "Check a device plugin against the device plugin API contract (acts as the kubelet)");
  cmd->add_option("--root", flags->root,
                  "Act as the kubelet in DIR/device-plugins: serve kubelet.sock there and wait "
                  "for the plugin to register");
  cmd->add_option("--plugin-socket", flags->plugin_socket,
                  "Dial an already running plugin's socket instead (registration checks SKIP)");
  cmd->add_option("--resource", flags->resource,
                  "The extended resource name the plugin must register (required)");
  cmd->add_option("--timeout", flags->timeout,
                  "Deadline of every RPC and bound of every wait (e.g. 500ms, 10s, 2m)")
      ->capture_default_str()
      ->type_name("DURATION");
  cmd->add_option("--junit", flags->junit, "Also write the report as JUnit XML to FILE");
  cmd->add_option("--only", flags->only, "Run only these check ids (comma-separated)");
  cmd->add_option("--health-trigger", flags->health_trigger,
                  "A shell command that makes one device unhealthy in the plugin; run with the "
                  "device id as its last argument (and in KDM_DEVICE_ID) by the health.* checks")
      ->type_name("CMD");
  AddVerbosityFlag(cmd, &flags->verbosity);
  cmd->callback([&exit_code, flags, cmd] {
    flags->health_trigger_given = cmd->get_option("--health-trigger")->count() > 0;
    exit_code = RunConform(*flags);
  });
}

}  // namespace kdm::cli
