// kdm_soak: random pod churn against a real `kdm kubelet` and three real
// `kdm plugin` processes while faults are injected, with the device
// manager's invariants checked continuously (`./run soak [SECONDS]`).
//
// Faults: pod manifests written (sometimes asking for more than exists) and
// deleted, device health flipped through the plugins' health files, plugins
// SIGKILLed and restarted after a short random delay, `kdm kubelet`
// SIGKILLed (or SIGTERMed) and restarted on the same root, and one plugin
// (example.com/nic) started with `--fault pref-not-subset`, so that every
// GetPreferredAllocation answer it gives is garbage. Two hostile plugins
// (kdm_hostile_plugin) join them: example.com/flappy flips one device's
// health every millisecond for 5 s after every (re)connect, and
// example.com/hung hangs in Allocate until the kubelet's deadline (a few
// pods ask for it). A duplicate-uid action writes a second manifest with
// the uid of an admitted pod: it must be rejected (DuplicatePod), and
// removing it must free nothing. Beside the node, a real `kdm extender
// --kubeconfig` runs against an in-process hostile API server with a hostile
// node in its cache (soak_extender.h lists those attacks and the
// extender-* invariants checked after each step and at every settle).
//
// Invariants, read through the pod-resources API (List,
// GetAllocatableResources), the SQLite checkpoint (read-only use of the
// store), the status files and /proc:
//   no-double-device   no device id in two containers (List, checkpoint);
//   allocation-kept    a pod whose manifest exists and whose status says
//                      Admitted holds exactly the devices it was first given
//                      (status file, List, checkpoint), across restarts;
//   gone-pod-freed     no device held by a pod whose manifest is gone;
//   capacity           allocatable ids and node capacity equal what the
//                      plugins report (their device lists and health files);
//   fds-threads        the kubelet's open fds and threads do not grow past
//                      the first settled sample after its start plus a slack.
// Checks that need the agent to settle poll with a bound; running out of it
// is a violation. Every violation is printed on stderr as it is found; the
// exit code is 0 only when there was none.
//
// Usage: kdm_soak --seconds N [--seed S] [--kdm PATH] [--hostile-plugin PATH]
//                 [--root DIR] [--keep] [--nic-fault NAME]
// Exit codes: 0 no violation, 1 violations (or interrupted, or the setup
// failed), 2 bad usage.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/paths.h"
#include "kdm/fakes/status_file.h"
#include "kdm/pluginapi/unix_target.h"
#include "kdm/test/soak/child_process.h"
#include "kdm/test/soak/soak.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::soak {

volatile sig_atomic_t g_stop_signal = 0;

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

extern "C" void OnStopSignal(int sig) { g_stop_signal = sig; }

constexpr char kUsage[] =
    "usage: kdm_soak --seconds N [--seed S] [--kdm PATH] [--hostile-plugin PATH] [--root DIR] "
    "[--keep] [--nic-fault NAME|none]\n"
    "  --seconds N      how long to churn (1..86400; default 60)\n"
    "  --seed S         the random seed (default: from the clock; always printed)\n"
    "  --kdm PATH       the kdm binary (default: kdm beside kdm_soak)\n"
    "  --hostile-plugin PATH  kdm_hostile_plugin (default: beside kdm_soak)\n"
    "  --root DIR       the kubelet's root (must not exist or be empty; default:\n"
    "                   a fresh temporary directory, removed at the end)\n"
    "  --keep           keep the root (logs, checkpoint) at the end\n"
    "  --nic-fault NAME the example.com/nic plugin's --fault (default\n"
    "                   pref-not-subset; none: a healthy plugin)\n";

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  size_t pos = 0;
  try {
    long long v = std::stoll(text, &pos, 10);
    if (pos != text.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool ParseUint(const std::string& text, uint64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  size_t pos = 0;
  try {
    unsigned long long v = std::stoull(text, &pos, 10);
    if (pos != text.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

// The directory holding this executable ("" if unknown).
std::string SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "" : self.parent_path().string();
}

// OK, or INVALID_ARGUMENT naming what was wrong.
Status ParseFlags(int argc, char** argv, Flags* flags, bool* help) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto take = [&](std::string* out) -> Status {
      if (has_value) {
        *out = value;
        return OkStatus();
      }
      if (i + 1 >= argc) return InvalidArgumentError(arg + " needs a value");
      *out = argv[++i];
      return OkStatus();
    };
    std::string v;
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return OkStatus();
    } else if (arg == "--keep") {
      if (has_value) return InvalidArgumentError("--keep takes no value");
      flags->keep = true;
    } else if (arg == "--seconds") {
      KDM_RETURN_IF_ERROR(take(&v));
      if (!ParseInt(v, &flags->seconds) || flags->seconds < 1 || flags->seconds > 86400) {
        return InvalidArgumentError("--seconds must be a whole number from 1 to 86400, got \"" + v +
                                    "\"");
      }
    } else if (arg == "--seed") {
      KDM_RETURN_IF_ERROR(take(&v));
      if (!ParseUint(v, &flags->seed)) {
        return InvalidArgumentError("--seed must be a non-negative whole number, got \"" + v +
                                    "\"");
      }
      flags->seed_given = true;
    } else if (arg == "--kdm") {
      KDM_RETURN_IF_ERROR(take(&flags->kdm));
    } else if (arg == "--hostile-plugin") {
      KDM_RETURN_IF_ERROR(take(&flags->hostile_plugin));
    } else if (arg == "--root") {
      KDM_RETURN_IF_ERROR(take(&flags->root));
      if (flags->root.empty()) return InvalidArgumentError("--root must not be empty");
    } else if (arg == "--nic-fault") {
      KDM_RETURN_IF_ERROR(take(&flags->nic_fault));
      if (flags->nic_fault.empty()) return InvalidArgumentError("--nic-fault must not be empty");
    } else {
      return InvalidArgumentError("unknown argument \"" + arg + "\"");
    }
  }
  if (flags->kdm.empty()) {
    std::string dir = SelfDir();
    flags->kdm = (dir.empty() ? std::string(".") : dir) + "/kdm";
  }
  struct stat st;
  if (::stat(flags->kdm.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(flags->kdm.c_str(), X_OK) != 0) {
    return InvalidArgumentError("--kdm: " + flags->kdm + " is not an executable file");
  }
  flags->kdm = fs::absolute(flags->kdm).lexically_normal().string();
  if (flags->hostile_plugin.empty()) {
    std::string dir = SelfDir();
    flags->hostile_plugin = (dir.empty() ? std::string(".") : dir) + "/kdm_hostile_plugin";
  }
  if (::stat(flags->hostile_plugin.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(flags->hostile_plugin.c_str(), X_OK) != 0) {
    return InvalidArgumentError("--hostile-plugin: " + flags->hostile_plugin +
                                " is not an executable file");
  }
  flags->hostile_plugin = fs::absolute(flags->hostile_plugin).lexically_normal().string();
  if (!flags->root.empty()) {
    std::error_code ec;
    if (fs::exists(flags->root, ec)) {
      if (!fs::is_directory(flags->root, ec)) {
        return InvalidArgumentError("--root: " + flags->root + " is not a directory");
      }
      if (!fs::is_empty(flags->root, ec)) {
        return InvalidArgumentError("--root: " + flags->root +
                                    " is not empty (the soak needs a fresh node)");
      }
    }
    flags->root = fs::absolute(flags->root).lexically_normal().string();
    // The plugin sockets live under DIR/device-plugins: keep them short.
    if (flags->root.size() > 60) {
      return InvalidArgumentError("--root: " + flags->root +
                                  " is too long for unix socket paths below it (60 bytes at most)");
    }
  }
  return OkStatus();
}

}  // namespace

void Soak::PrintReport(bool interrupted) {
  // Garbage preferred answers, as the kubelet logged its fallbacks.
  int64_t garbage = 0, fallbacks = 0;
  {
    std::ifstream in(flags_.root + "/logs/kubelet.log");
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("event=preferred_allocation_fallback") == std::string::npos) continue;
      ++fallbacks;
      if (line.find("reason=invalid_answer") != std::string::npos) ++garbage;
    }
  }
  faults_["garbage preferred answers (kubelet fell back)"] = garbage;
  faults_["preferred fallbacks, all reasons"] = fallbacks;
  faults_["kubelet starts"] = kubelet_->starts();
  int64_t plugin_starts = 0;
  for (const auto& p : plugins_) plugin_starts += p.child->starts();
  faults_["plugin starts"] = plugin_starts;
  for (const auto& [k, v] : extender_->Report()) outcomes_[k] = v;

  auto row = [](const std::string& k, int64_t v) {
    std::printf("  %-48s %10lld\n", k.c_str(), static_cast<long long>(v));
  };
  std::printf("\nkdm_soak: %.1f s, seed %llu%s\n", Elapsed(),
              static_cast<unsigned long long>(flags_.seed), interrupted ? " (interrupted)" : "");
  std::printf("faults injected\n");
  for (const auto& [k, v] : faults_) row(k, v);
  std::printf("outcomes\n");
  for (const auto& [k, v] : outcomes_) row(k, v);
  std::printf("invariants checked\n");
  int64_t total = 0;
  for (const auto& [k, v] : checks_) {
    row(k, v);
    total += v;
  }
  row("total", total);
  std::printf(
      "kubelet fds %d..%d, threads %d..%d (slack %d / %d over each start's first "
      "settled sample)\n",
      max_fds_ ? min_fds_ : 0, max_fds_, max_threads_ ? min_threads_ : 0, max_threads_, kFdSlack,
      kThreadSlack);
  std::printf("violations: %lld\n", static_cast<long long>(violations_));
  if (violations_ > 0 || flags_.keep || !own_root_) {
    std::printf("root kept: %s (logs in logs/)\n", flags_.root.c_str());
  }
  std::fflush(stdout);
}

int Soak::Run() {
  std::printf("kdm_soak: seed %llu, %lld s, kdm %s\n", static_cast<unsigned long long>(flags_.seed),
              static_cast<long long>(flags_.seconds), flags_.kdm.c_str());
  std::fflush(stdout);
  if (Status s = Setup(); !s.ok()) {
    std::cerr << "kdm_soak: " << s.message() << "\n";
    return 1;
  }
  std::printf("kdm_soak: root %s\n", flags_.root.c_str());
  std::fflush(stdout);
  Settle();
  const auto deadline = started_ + std::chrono::seconds(flags_.seconds);
  int since_settle = 0;
  while (Clock::now() < deadline && !Stopping()) {
    if (!InjectFault()) ++since_settle;  // quiet: a pause below
    if (Stopping()) break;
    if (extender_rng_() % 100 < 12) Bump(faults_, "extender " + extender_->Attack());
    extender_->Check();
    CheckPods();
    if (++since_settle >= 10 || Pick(100) < 8) {
      Settle();
      since_settle = 0;
    }
    if (!Pause(std::chrono::milliseconds(Pick(300)))) break;
  }
  const bool interrupted = Stopping();
  if (!interrupted) Settle();
  // A clean stop: SIGTERM must end the kubelet with exit 0.
  if (!interrupted && kubelet_->running()) {
    int status = kubelet_->Stop(SIGTERM, 30s);
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      Violation("process", "kdm kubelet at the end, after SIGTERM: " + DescribeWaitStatus(status));
    }
  }
  extender_->Stop(/*check=*/!interrupted);
  for (auto& p : plugins_) {
    if (p.child->running()) {
      int status = p.child->Stop(SIGTERM, 30s);
      if (!interrupted && !(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        Violation("process",
                  "the " + p.resource + " plugin after SIGTERM: " + DescribeWaitStatus(status));
      }
    }
  }
  PrintReport(interrupted);
  if (interrupted) std::cerr << "kdm_soak: interrupted by signal " << g_stop_signal << "\n";
  return (violations_ == 0 && !interrupted) ? 0 : 1;
}

}  // namespace kdm::soak

int main(int argc, char** argv) {
  using namespace kdm::soak;
  Flags flags;
  bool help = false;
  if (kdm::Status s = ParseFlags(argc, argv, &flags, &help); !s.ok()) {
    std::cerr << "kdm_soak: " << s.message() << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  if (!flags.seed_given) {
    flags.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  Soak soak(std::move(flags));
  return soak.Run();
}