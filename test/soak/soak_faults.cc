// kdm_soak's faults: what each one does to the node, and the schedule that
// picks the next one (soak.h).
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

#include "kdm/base/env.h"
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

namespace {

std::string ManifestJson(const PodRecord& pod) {
  json init = json::array(), apps = json::array();
  for (const auto& c : pod.containers) {
    json limits = json::object();
    for (const auto& [r, n] : c.limits) limits[r] = n;
    json container = {{"name", c.name}, {"image", "soak"}, {"resources", {{"limits", limits}}}};
    (c.init ? init : apps).push_back(container);
  }
  json spec = {{"containers", apps}};
  if (!init.empty()) spec["initContainers"] = init;
  json j = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", pod.name}, {"uid", pod.uid}}},
            {"spec", spec}};
  return j.dump(2);
}

// Writes beside (a hidden temporary file, which the agent ignores) and
// renames in, so the agent never reads half a file.
bool WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& text) {
  return Env::Default()->WriteFileAtomically(dir + "/" + name, text).ok();
}

}  // namespace

void Soak::CreatePod() {
  PodRecord pod;
  pod.name = "pod-" + std::to_string(next_pod_++);
  pod.uid = "soak-" + std::to_string(flags_.seed) + "-" + pod.name;
  auto chance = [&](int percent) {
    return std::uniform_int_distribution<int>(0, 99)(rng_) < percent;
  };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); };
  auto random_limits = [&] {
    std::map<std::string, int> limits;
    if (chance(55)) limits["nvidia.com/gpu"] = chance(5) ? 9 : pick(1, 4);
    if (chance(35)) limits["example.com/fpga"] = chance(5) ? 5 : pick(1, 2);
    if (chance(45)) limits["example.com/nic"] = chance(5) ? 9 : pick(1, 3);
    if (chance(8)) limits["example.com/flappy"] = pick(1, 2);
    if (chance(3)) limits["example.com/hung"] = 1;
    if (limits.empty()) limits["example.com/nic"] = pick(1, 2);
    return limits;
  };
  if (chance(20)) {
    ContainerSpec init{"init", true, {}};
    if (chance(50)) {
      init.limits["nvidia.com/gpu"] = pick(1, 2);
    } else {
      init.limits["example.com/nic"] = pick(1, 2);
    }
    pod.containers.push_back(init);
  }
  pod.containers.push_back({"main", false, random_limits()});
  if (chance(30)) pod.containers.push_back({"side", false, random_limits()});

  if (!WriteFileAtomically(flags_.root + "/manifests", pod.name + ".json", ManifestJson(pod))) {
    Violation("setup", "cannot write the manifest of " + pod.name);
    return;
  }
  Bump(faults_, "pod creates");
  std::string what;
  for (const auto& c : pod.containers) {
    what += " " + c.name + ":";
    for (const auto& [r, n] : c.limits) what += r + "=" + std::to_string(n) + ",";
  }
  Log("create " + pod.name + what);
  const std::string name = pod.name;
  pods_[name] = std::move(pod);
  // Wait for the admission result while the agent runs (a pod waiting for
  // a restarted plugin gets it once the plugin is back: bounded).
  if (kubelet_->running()) {
    PodRecord& p = pods_[name];
    bool seen =
        WaitFor([&] { return fs::exists(StatusPath(p)) || !kubelet_->running(); }, kSettleBound);
    if (!seen && !Stopping()) {
      Violation("admission",
                name + ": no status file within " + std::to_string(kSettleBound.count()) + " s");
    }
  }
}

void Soak::DeletePod() {
  std::vector<std::string> present;
  for (const auto& [name, p] : pods_) {
    if (p.manifest_present) present.push_back(name);
  }
  if (present.empty()) return;
  const std::string name =
      present[std::uniform_int_distribution<size_t>(0, present.size() - 1)(rng_)];
  PodRecord& p = pods_[name];
  std::error_code ec;
  fs::remove(flags_.root + "/manifests/" + name + ".json", ec);
  p.manifest_present = false;
  Bump(faults_, "pod deletes");
  Log("delete " + name);
  if (kubelet_->running()) {
    bool gone =
        WaitFor([&] { return !fs::exists(StatusPath(p)) || !kubelet_->running(); }, kSettleBound);
    if (!gone && !Stopping()) {
      Violation("gone-pod-freed", name + ": status file still there " +
                                      std::to_string(kSettleBound.count()) +
                                      " s after its manifest was removed");
    }
  }
}

void Soak::DuplicateUid() {
  if (!kubelet_->running()) return;
  std::vector<std::string> admitted;
  for (const auto& [name, p] : pods_) {
    if (p.manifest_present && p.outcome == "admitted" && !p.rejected_after_admission) {
      admitted.push_back(name);
    }
  }
  if (admitted.empty()) return;
  const PodRecord& original =
      pods_[admitted[std::uniform_int_distribution<size_t>(0, admitted.size() - 1)(rng_)]];
  PodRecord dup = original;
  dup.name = "dup-" + std::to_string(next_pod_++);
  const std::string file = dup.name + ".json";
  const std::string status = flags_.root + "/status/manifest_" + file + ".json";
  if (!WriteFileAtomically(flags_.root + "/manifests", file, ManifestJson(dup))) {
    Violation("setup", "cannot write the manifest of " + dup.name);
    return;
  }
  Bump(faults_, "duplicate-uid manifests");
  Log("duplicate " + dup.name + " uid=" + dup.uid + " (of " + original.name + ")");
  std::string reason;
  bool judged = WaitFor(
      [&] {
        if (!kubelet_->running()) return true;
        StatusOr<fakes::PodStatus> judged = fakes::ReadPodStatusFile(status);
        if (!judged.ok()) return false;
        reason = judged->reason;
        return true;
      },
      kSettleBound);
  if (kubelet_->running() && !Stopping()) {
    if (!judged) {
      Violation("duplicate-uid", dup.name + ": no status file within " +
                                     std::to_string(kSettleBound.count()) + " s");
    } else if (reason != "DuplicatePod") {
      Violation("duplicate-uid", dup.name + " (uid of " + original.name +
                                     ") was not rejected as DuplicatePod: reason \"" + reason +
                                     "\"");
    }
    if (fs::exists(flags_.root + "/status/default_" + dup.name + ".json")) {
      Violation("duplicate-uid", dup.name + " got a pod status of its own (admitted?)");
    }
  }
  std::error_code ec;
  fs::remove(flags_.root + "/manifests/" + file, ec);
  if (kubelet_->running()) {
    WaitFor([&] { return !fs::exists(status) || !kubelet_->running(); }, kSettleBound);
  }
  // CheckPods (after every action) finds any device the removal freed.
}

void Soak::WriteHealthFile(Plugin& p) {
  json j = json::object();
  for (const auto& id : p.unhealthy) j[id] = "Unhealthy";
  std::string name = fs::path(p.health_file).filename().string();
  if (!WriteFileAtomically(flags_.root + "/health", name, j.dump())) {
    Violation("setup", "cannot write " + p.health_file);
  }
}

void Soak::FlipHealth() {
  std::vector<Plugin*> with_health;
  for (auto& p : plugins_) {
    if (!p.health_file.empty()) with_health.push_back(&p);
  }
  Plugin& p = *with_health[std::uniform_int_distribution<size_t>(0, with_health.size() - 1)(rng_)];
  std::string what;
  if (!p.unhealthy.empty() && std::uniform_int_distribution<int>(0, 9)(rng_) == 0) {
    p.unhealthy.clear();
    what = "all healthy";
  } else {
    const std::string& id = p.ids[std::uniform_int_distribution<size_t>(0, p.ids.size() - 1)(rng_)];
    if (p.unhealthy.erase(id)) {
      what = id + " healthy";
    } else {
      p.unhealthy.insert(id);
      what = id + " unhealthy";
    }
  }
  WriteHealthFile(p);
  Bump(faults_, "health flips");
  Log("health " + p.resource + ": " + what);
}

void Soak::KillPlugin() {
  std::vector<Plugin*> up;
  for (auto& p : plugins_) {
    if (p.child->running()) up.push_back(&p);
  }
  if (up.empty()) return;
  Plugin& p = *up[std::uniform_int_distribution<size_t>(0, up.size() - 1)(rng_)];
  (void)p.child->Stop(SIGKILL, 10s);
  auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(100, 3000)(rng_));
  p.restart_at = Clock::now() + delay;
  Bump(faults_, "plugin SIGKILLs");
  Log("SIGKILL plugin " + p.resource + ", restart in " + std::to_string(delay.count()) + " ms");
}

void Soak::KillKubelet(int sig) {
  if (!kubelet_->running()) return;
  const pid_t pid = kubelet_->pid();
  int status = kubelet_->Stop(sig, sig == SIGKILL ? 10s : 30s);
  if (sig == SIGKILL) {
    Bump(faults_, "kubelet SIGKILLs");
  } else {
    Bump(faults_, "kubelet SIGTERMs");
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      Violation("process", "kdm kubelet (pid " + std::to_string(pid) + ") after SIGTERM: " +
                               DescribeWaitStatus(status) + " (expected exit 0)");
    }
  }
  auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 1500)(rng_));
  kubelet_restart_at_ = Clock::now() + delay;
  Log(std::string(sig == SIGKILL ? "SIGKILL" : "SIGTERM") + " kubelet pid=" + std::to_string(pid) +
      " (" + DescribeWaitStatus(status) + "), restart in " + std::to_string(delay.count()) + " ms");
}
bool Soak::InjectFault() {
  int present = 0;
  for (const auto& [name, p] : pods_) present += p.manifest_present;
  int roll = Pick(100);
  // More deletes when many pods are there, so that churn goes on.
  int create = present > 8 ? 20 : 38;
  if (roll < create) {
    CreatePod();
  } else if (roll < 62) {
    DeletePod();
  } else if (roll < 75) {
    FlipHealth();
  } else if (roll < 85) {
    KillPlugin();
  } else if (roll < 90) {
    KillKubelet(SIGKILL);
  } else if (roll < 92) {
    KillKubelet(SIGTERM);
  } else if (roll < 95) {
    DuplicateUid();
  } else {
    return false;
  }
  return true;
}

}  // namespace kdm::soak
