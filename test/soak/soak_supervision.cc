// kdm_soak's process supervision: starting, reaping and restarting the
// kubelet and the plugins, and the run's log and violations (soak.h).
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

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using nlohmann::json;

void Soak::Log(const std::string& line) {
  char t[32];
  std::snprintf(t, sizeof t, "%8.3f ", Elapsed());
  log_ << t << line << "\n";
  log_.flush();
}

void Soak::Violation(const std::string& kind, const std::string& detail) {
  ++violations_;
  char t[32];
  std::snprintf(t, sizeof t, "%.1f", Elapsed());
  std::cerr << "kdm_soak: VIOLATION [" << kind << "] at " << t << " s: " << detail << std::endl;
  Log("VIOLATION [" + kind + "] " + detail);
}

Status Soak::Setup() {
  if (flags_.root.empty()) {
    char tmpl[] = "/tmp/kdm-soak-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return UnavailableError("cannot create a temporary directory");
    flags_.root = tmpl;
    own_root_ = true;
  }
  std::error_code ec;
  for (const char* dir : {"", "/manifests", "/health", "/logs"}) {
    fs::create_directories(flags_.root + dir, ec);
    if (ec) return UnavailableError("cannot create " + flags_.root + dir + ": " + ec.message());
  }
  log_.open(flags_.root + "/logs/soak.log", std::ios::app);

  auto make_ids = [](const std::string& prefix, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(prefix + std::to_string(i));
    return ids;
  };
  const std::string& kdm = flags_.kdm;
  const std::string& root = flags_.root;
  struct Def {
    std::string resource, short_name;
    std::vector<std::string> ids;
    std::vector<std::string> extra;
    bool health;
  };
  std::vector<Def> defs = {
      {"nvidia.com/gpu", "gpu", make_ids("GPU", 8), {"--preset", "dgx1-v100"}, true},
      {"example.com/fpga", "fpga", make_ids("fpga-", 4), {"--count", "4"}, true},
      {"example.com/nic", "nic", make_ids("nic-", 8), {"--count", "8"}, false},
  };
  if (flags_.nic_fault != "none") {
    defs[2].extra.insert(defs[2].extra.end(), {"--fault", flags_.nic_fault});
  }
  // The hostile plugins: no health file; each serves dev-0 ... dev-3 (the
  // flapping one ends each flap with every device healthy).
  struct HostileDef {
    std::string resource, short_name;
    std::vector<std::string> extra;
  };
  const std::vector<HostileDef> hostile = {
      {"example.com/flappy", "flappy", {"--flap-ms", "1", "--flap-for", "5"}},
      {"example.com/hung", "hung", {"--hang", "allocate"}},
  };
  for (const auto& h : hostile) {
    Plugin p;
    p.resource = h.resource;
    p.ids = make_ids("dev-", 4);
    std::vector<std::string> argv = {flags_.hostile_plugin, "--plugin-dir",
                                     root + "/device-plugins", "--resource", h.resource,
                                     // Outlives the run (the soak stops it).
                                     "--lifetime", std::to_string(flags_.seconds + 600)};
    argv.insert(argv.end(), h.extra.begin(), h.extra.end());
    p.child = std::make_unique<ChildProcess>("plugin " + h.resource, argv,
                                             root + "/logs/" + h.short_name + "-plugin.log");
    plugins_.push_back(std::move(p));
  }
  for (auto& d : defs) {
    Plugin p;
    p.resource = d.resource;
    p.ids = d.ids;
    std::vector<std::string> argv = {kdm, "plugin", "--root", root, "--resource", d.resource};
    argv.insert(argv.end(), d.extra.begin(), d.extra.end());
    if (d.health) {
      p.health_file = root + "/health/" + d.short_name + ".json";
      argv.insert(argv.end(), {"--health-file", p.health_file});
    }
    p.child = std::make_unique<ChildProcess>("plugin " + d.resource, argv,
                                             root + "/logs/" + d.short_name + "-plugin.log");
    plugins_.push_back(std::move(p));
  }
  for (auto& p : plugins_) {
    if (!p.health_file.empty()) WriteHealthFile(p);
  }
  kubelet_ = std::make_unique<ChildProcess>(
      // A short deadline: pods of the hung plugin are rejected in 3 s.
      "kubelet", std::vector<std::string>{kdm, "kubelet", "--root", root, "--rpc-timeout", "3s"},
      root + "/logs/kubelet.log");
  StartKubelet();
  for (auto& p : plugins_) StartPlugin(p);
  KDM_ASSIGN_OR_RETURN(
      extender_, ExtenderUnderAttack::Start(
                     {.kdm = kdm,
                      .dir = root + "/logs",
                      .seed = flags_.seed + 2,
                      .log = [this](const std::string& line) { Log(line); },
                      .violation = [this](const std::string& kind,
                                          const std::string& detail) { Violation(kind, detail); },
                      .count = [this](const std::string& check) { Count(check); }}));
  Log("start extender");
  return OkStatus();
}

void Soak::StartKubelet() {
  kubelet_restart_at_.reset();
  kubelet_baseline_taken_ = false;
  if (Status s = kubelet_->Start(); !s.ok()) {
    Violation("setup", "cannot start the kubelet: " + s.message());
    return;
  }
  Log("start kubelet pid=" + std::to_string(kubelet_->pid()));
}

void Soak::StartPlugin(Plugin& p) {
  p.restart_at.reset();
  if (Status s = p.child->Start(); !s.ok()) {
    Violation("setup", "cannot start the " + p.resource + " plugin: " + s.message());
    return;
  }
  Log("start plugin " + p.resource + " pid=" + std::to_string(p.child->pid()));
}

void Soak::Cleanup() {
  extender_.reset();  // SIGKILLs it if still running
  for (auto& p : plugins_) {
    if (p.child) (void)p.child->Stop(SIGKILL, 10s);
  }
  if (kubelet_) (void)kubelet_->Stop(SIGKILL, 10s);
  if (own_root_ && !flags_.keep && violations_ == 0 && !flags_.root.empty()) {
    std::error_code ec;
    fs::remove_all(flags_.root, ec);
    own_root_ = false;
  }
}

void Soak::Tick() {
  int status = 0;
  if (kubelet_->Reap(&status)) {
    Violation("process", "kdm kubelet exited on its own (" + DescribeWaitStatus(status) +
                             "); see " + flags_.root + "/logs/kubelet.log");
    kubelet_restart_at_ = Clock::now();
  }
  for (auto& p : plugins_) {
    if (p.child->Reap(&status)) {
      Violation("process", "the " + p.resource + " plugin exited on its own (" +
                               DescribeWaitStatus(status) + ")");
      p.restart_at = Clock::now();
    }
  }
  auto now = Clock::now();
  if (kubelet_restart_at_ && *kubelet_restart_at_ <= now) StartKubelet();
  for (auto& p : plugins_) {
    if (p.restart_at && *p.restart_at <= now) StartPlugin(p);
  }
}

bool Soak::Pause(std::chrono::milliseconds d) {
  auto end = Clock::now() + d;
  while (Clock::now() < end) {
    if (Stopping()) return false;
    Tick();
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        20ms, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()) + 1ms));
  }
  return !Stopping();
}

bool Soak::WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds bound) {
  auto end = Clock::now() + bound;
  while (!pred()) {
    if (Stopping() || Clock::now() > end) return false;
    Tick();
    std::this_thread::sleep_for(50ms);
  }
  return true;
}
}  // namespace kdm::soak
