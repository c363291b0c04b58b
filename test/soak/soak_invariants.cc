// kdm_soak's readers of the agent (pod-resources, the checkpoint, status
// files, /proc) and the invariants checked over what they read (soak.h).
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

std::optional<PodStatusView> ReadPodStatus(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  PodStatusView v;
  v.text = s.str();
  StatusOr<fakes::PodStatus> status = fakes::ParsePodStatus(v.text);
  if (!status.ok()) {
    v.phase = "<unparsable>";
    return v;
  }
  v.phase = status->phase;
  v.message = status->message;
  for (const fakes::ContainerStatus& c : status->containers) {
    Devices d;
    for (const auto& [resource, ids] : c.devices) {
      if (!ids.empty()) d[resource] = ids;  // sorted by the writer
    }
    if (!d.empty()) v.devices[c.name] = std::move(d);
  }
  return v;
}

std::string DevicesText(const ContainerDevicesMap& m) {
  std::string out = "{";
  for (const auto& [c, d] : m) {
    if (out.size() > 1) out += " ";
    out += c + ":";
    bool first = true;
    for (const auto& [r, ids] : d) {
      out += (first ? "" : ";") + r + "=";
      first = false;
      for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + ids[i];
    }
  }
  return out + "}";
}

namespace {

// A fresh client per call: after a kubelet restart an old channel would sit
// in its reconnect back-off. --root may be relative: the client reads it as
// a path.
StatusOr<std::unique_ptr<devicemanager::PodResourcesClient>> Connect(const std::string& root) {
  return devicemanager::PodResourcesClient::Connect(
      {.socket_path = root + "/pod-resources/kubelet.sock", .timeout = 5s});
}

}  // namespace

StatusOr<Soak::PodList> Soak::List() {
  KDM_ASSIGN_OR_RETURN(auto client, Connect(flags_.root));
  return client->List();
}

StatusOr<std::vector<devicemanager::ContainerDevices>> Soak::Allocatable() {
  KDM_ASSIGN_OR_RETURN(auto client, Connect(flags_.root));
  return client->GetAllocatableResources();
}

StatusOr<checkpoint::CheckpointData> Soak::ReadCheckpoint() {
  KDM_ASSIGN_OR_RETURN(
      checkpoint::OpenResult opened,
      checkpoint::OpenStoreForRoot(
          flags_.root, checkpoint::StoreKind::kSqlite,
          {.create_if_missing = false, .quarantine_corrupt = false, .synchronous_full = false}));
  return opened.store->Load();
}

bool Soak::KubeletServing() { return kubelet_->running() && List().ok(); }

// Devices of every container of every pod in `list`, by pod name.
std::map<std::string, ContainerDevicesMap> ListDevices(const Soak::PodList& list) {
  std::map<std::string, ContainerDevicesMap> out;
  for (const auto& pod : list) {
    ContainerDevicesMap& m = out[pod.name];
    for (const auto& c : pod.containers) {
      for (const auto& d : c.devices) {
        auto& ids = m[c.name][d.resource_name];
        ids.insert(ids.end(), d.device_ids.begin(), d.device_ids.end());
      }
    }
    for (auto& [c, d] : m) {
      for (auto& [r, ids] : d) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
    }
  }
  return out;
}

// Devices of every container of every pod in the checkpoint, by pod uid.
std::map<std::string, ContainerDevicesMap> CheckpointDevices(const checkpoint::CheckpointData& c) {
  std::map<std::string, ContainerDevicesMap> out;
  for (const auto& e : c.entries) {
    auto& ids = out[e.pod_uid][e.container_name][e.resource_name];
    for (const auto& [numa, v] : e.device_ids) ids.insert(ids.end(), v.begin(), v.end());
    std::sort(ids.begin(), ids.end());
  }
  return out;
}

ContainerDevicesMap AppContainersOnly(const ContainerDevicesMap& all, const PodRecord& pod) {
  ContainerDevicesMap out;
  for (const auto& c : pod.containers) {
    auto it = all.find(c.name);
    if (!c.init && it != all.end() && !it->second.empty()) out[c.name] = it->second;
  }
  return out;
}

std::vector<std::string> Soak::DoubleDevices(const PodList& list,
                                             const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  std::map<std::string, std::set<std::string>> known;
  for (const auto& p : plugins_) known[p.resource] = {p.ids.begin(), p.ids.end()};
  // pod-resources: one holder per device (it reports app containers only).
  std::map<std::string, std::string> holder;
  for (const auto& pod : list) {
    for (const auto& c : pod.containers) {
      std::set<std::string> in_container;
      for (const auto& d : c.devices) {
        for (const auto& id : d.device_ids) {
          std::string key = d.resource_name + "/" + id;
          if (!known[d.resource_name].count(id)) {
            problems.push_back("List: " + pod.name + "/" + c.name + " holds " + key +
                               ", which no plugin has");
          }
          if (!in_container.insert(key).second) continue;  // one entry per NUMA node
          std::string who = pod.name + "/" + c.name;
          auto [it, inserted] = holder.emplace(key, who);
          if (!inserted)
            problems.push_back("List: " + key + " held by " + it->second + " and " + who);
        }
      }
    }
  }
  // checkpoint: one pod per device, and within a pod one app container
  // (a finished init container's devices are handed on to app containers).
  std::map<std::string, const PodRecord*> by_uid;
  for (const auto& [name, p] : pods_) by_uid[p.uid] = &p;
  std::map<std::string, std::pair<std::string, std::string>>
      ckpt_holder;  // key -> (uid, app container)
  for (const auto& e : ckpt.entries) {
    auto pit = by_uid.find(e.pod_uid);
    bool init = false;
    if (pit != by_uid.end()) {
      for (const auto& c : pit->second->containers) {
        if (c.name == e.container_name) init = c.init;
      }
    }
    for (const auto& [numa, ids] : e.device_ids) {
      for (const auto& id : ids) {
        std::string key = e.resource_name + "/" + id;
        auto it = ckpt_holder.find(key);
        if (it == ckpt_holder.end()) {
          ckpt_holder[key] = {e.pod_uid, init ? "" : e.container_name};
          continue;
        }
        if (it->second.first != e.pod_uid) {
          problems.push_back("checkpoint: " + key + " held by pods " + it->second.first + " and " +
                             e.pod_uid);
        } else if (!init && !it->second.second.empty() && it->second.second != e.container_name) {
          problems.push_back("checkpoint: " + key + " held by containers " + it->second.second +
                             " and " + e.container_name + " of pod " + e.pod_uid);
        } else if (!init) {
          it->second.second = e.container_name;
        }
      }
    }
  }
  return problems;
}

std::vector<std::string> Soak::HeldAllocations(const PodList& list,
                                               const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  auto listed = ListDevices(list);
  auto stored = CheckpointDevices(ckpt);
  for (auto& [name, pod] : pods_) {
    if (!pod.manifest_present || !pod.first_devices) continue;
    const ContainerDevicesMap& first = *pod.first_devices;
    ContainerDevicesMap want_listed = AppContainersOnly(first, pod);
    auto lit = listed.find(name);
    ContainerDevicesMap got_listed;
    if (lit != listed.end()) got_listed = AppContainersOnly(lit->second, pod);
    if (lit == listed.end() && !want_listed.empty()) {
      problems.push_back(name + " is Admitted but not in List (first given " +
                         DevicesText(want_listed) + ")");
    } else if (got_listed != want_listed) {
      problems.push_back(name + ": List shows " + DevicesText(got_listed) + ", first given " +
                         DevicesText(want_listed));
    }
    auto sit = stored.find(pod.uid);
    ContainerDevicesMap got_stored = sit == stored.end() ? ContainerDevicesMap{} : sit->second;
    if (got_stored != first) {
      problems.push_back(name + ": checkpoint holds " + DevicesText(got_stored) + ", first given " +
                         DevicesText(first));
    }
  }
  return problems;
}

std::vector<std::string> Soak::GonePods(const PodList& list,
                                        const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  std::map<std::string, const PodRecord*> by_uid;
  for (const auto& [name, p] : pods_) by_uid[p.uid] = &p;
  for (const auto& pod : list) {
    auto it = pods_.find(pod.name);
    if (it == pods_.end()) {
      problems.push_back("List shows a pod the soak never made: " + pod.name);
    } else if (!it->second.manifest_present) {
      bool holds = false;
      for (const auto& c : pod.containers) holds = holds || !c.devices.empty();
      if (holds) problems.push_back("List: " + pod.name + " holds devices, its manifest is gone");
    }
  }
  std::set<std::string> reported;
  for (const auto& e : ckpt.entries) {
    if (!reported.insert(e.pod_uid).second) continue;
    auto it = by_uid.find(e.pod_uid);
    if (it == by_uid.end()) {
      problems.push_back("checkpoint holds devices of an unknown pod uid " + e.pod_uid);
    } else if (!it->second->manifest_present) {
      problems.push_back("checkpoint: " + it->second->name +
                         " holds devices, its manifest is gone");
    }
  }
  return problems;
}

void Soak::CheckPods() {
  if (!kubelet_->running()) return;
  auto end = Clock::now() + kSettleBound;
  std::vector<std::string> held_problems, gone_problems, read_problems;
  bool held_ok = false, gone_ok = false;
  while (true) {
    // Status files before and after the reads: a pod whose status changed
    // meanwhile is judged on the next round.
    std::map<std::string, std::optional<PodStatusView>> before;
    for (const auto& [name, p] : pods_) {
      if (p.manifest_present) before[name] = ReadPodStatus(StatusPath(p));
    }
    auto list = List();
    auto ckpt = list.ok() ? ReadCheckpoint() : StatusOr<checkpoint::CheckpointData>(list.status());
    read_problems.clear();
    if (!list.ok() || !ckpt.ok()) {
      read_problems.push_back(!list.ok() ? list.status().message() : ckpt.status().message());
    } else {
      bool stable = true;
      for (auto& [name, view] : before) {
        PodRecord& p = pods_[name];
        auto after = ReadPodStatus(StatusPath(p));
        if (view.has_value() != after.has_value() || (view && view->text != after->text)) {
          stable = false;
          continue;
        }
        if (!view) continue;
        p.status_seen = true;
        if (view->phase == "Admitted") {
          if (!p.first_devices) {
            p.first_devices = view->devices;
            p.outcome = "admitted";
            Bump(outcomes_, "pods admitted");
          } else if (view->devices != *p.first_devices) {
            Violation("allocation-kept", name + ": status now says " + DevicesText(view->devices) +
                                             ", first given " + DevicesText(*p.first_devices));
            p.first_devices = view->devices;
          }
        } else if (view->phase == "Rejected") {
          if (p.outcome.empty()) {
            p.outcome = "rejected";
            Bump(outcomes_, "pods rejected");
          }
          if (p.first_devices && !p.rejected_after_admission) {
            p.rejected_after_admission = true;
            // After a restart the kubelet re-admits each pod; devices that
            // turned unhealthy meanwhile make that fail
            // (docs/kubelet-rules.md#allocation, step 2).
            if (view->message.find("no longer healthy") != std::string::npos) {
              Bump(outcomes_, "re-admissions refused (devices unhealthy)");
            } else {
              Violation("allocation-kept", name + " was Admitted with " +
                                               DevicesText(*p.first_devices) +
                                               ", then Rejected: " + view->message);
            }
          }
          if (p.first_devices) p.first_devices.reset();
        }
      }
      std::vector<std::string> doubles = DoubleDevices(*list, *ckpt);
      Count("no-double-device");
      if (!doubles.empty()) {
        // A transient view of List (pods listed one by one) is confirmed
        // with a second read before it counts.
        auto list2 = List();
        auto ckpt2 = ReadCheckpoint();
        if (list2.ok() && ckpt2.ok()) doubles = DoubleDevices(*list2, *ckpt2);
        for (const auto& d : doubles) Violation("no-double-device", d);
      }
      if (stable) {
        held_problems = HeldAllocations(*list, *ckpt);
        held_ok = held_ok || held_problems.empty();
      }
      gone_problems = GonePods(*list, *ckpt);
      gone_ok = gone_ok || gone_problems.empty();
    }
    if (held_ok && gone_ok) break;
    if (Stopping() || !kubelet_->running()) return;
    if (Clock::now() > end) break;
    Tick();
    std::this_thread::sleep_for(100ms);
  }
  Count("allocation-kept");
  Count("gone-pod-freed");
  if (!read_problems.empty() && (!held_ok || !gone_ok)) {
    Violation("read", "cannot read the agent for " + std::to_string(kSettleBound.count()) +
                          " s: " + read_problems.front());
    return;
  }
  if (!held_ok) {
    for (const auto& p : held_problems) Violation("allocation-kept", p);
    if (held_problems.empty()) Violation("allocation-kept", "status files never stable");
  }
  if (!gone_ok) {
    for (const auto& p : gone_problems) Violation("gone-pod-freed", p);
  }
}

std::vector<std::string> Soak::CapacityProblems() {
  std::vector<std::string> problems;
  auto alloc = Allocatable();
  if (!alloc.ok()) return {alloc.status().message()};
  std::map<std::string, std::set<std::string>> got;
  for (const auto& d : *alloc) {
    got[d.resource_name].insert(d.device_ids.begin(), d.device_ids.end());
  }
  StatusOr<fakes::NodeStatus> node = fakes::ReadNodeStatusFile(flags_.root + "/status/node.json");
  for (const auto& p : plugins_) {
    std::set<std::string> want;
    for (const auto& id : p.ids) {
      if (!p.unhealthy.count(id)) want.insert(id);
    }
    if (got[p.resource] != want) {
      std::string g, w;
      for (const auto& id : got[p.resource]) g += id + ",";
      for (const auto& id : want) w += id + ",";
      problems.push_back(p.resource + ": allocatable ids [" + g +
                         "], the plugin reports healthy [" + w + "]");
    }
    int64_t capacity = -1, allocatable = -1;
    if (node.ok()) {
      auto it = node->capacity.resources.find(p.resource);
      if (it != node->capacity.resources.end()) {
        capacity = it->second.capacity;
        allocatable = it->second.allocatable;
      }
    }
    if (capacity != static_cast<int64_t>(p.ids.size()) ||
        allocatable != static_cast<int64_t>(want.size())) {
      problems.push_back(p.resource + ": node.json capacity " + std::to_string(capacity) +
                         " allocatable " + std::to_string(allocatable) + ", the plugin reports " +
                         std::to_string(p.ids.size()) + " devices, " + std::to_string(want.size()) +
                         " healthy");
    }
  }
  for (const auto& [resource, ids] : got) {
    bool known = false;
    for (const auto& p : plugins_) known = known || p.resource == resource;
    if (!known && !ids.empty())
      problems.push_back("allocatable lists unknown resource " + resource);
  }
  return problems;
}

int CountDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

void Soak::SampleFdsThreads() {
  if (!kubelet_->running()) return;
  const std::string proc = "/proc/" + std::to_string(kubelet_->pid());
  int fds = CountDir(proc + "/fd"), threads = CountDir(proc + "/task");
  if (fds < 0 || threads < 0) return;
  min_fds_ = std::min(min_fds_, fds);
  max_fds_ = std::max(max_fds_, fds);
  min_threads_ = std::min(min_threads_, threads);
  max_threads_ = std::max(max_threads_, threads);
  Count("fds-threads");
  Log("kubelet fds=" + std::to_string(fds) + " threads=" + std::to_string(threads));
  if (!kubelet_baseline_taken_) {
    kubelet_baseline_taken_ = true;
    base_fds_ = fds;
    base_threads_ = threads;
    return;
  }
  if (fds > base_fds_ + kFdSlack) {
    Violation("fds-threads", "kubelet pid " + std::to_string(kubelet_->pid()) + " has " +
                                 std::to_string(fds) + " open fds, " + std::to_string(base_fds_) +
                                 " when it first settled (slack " + std::to_string(kFdSlack) + ")");
    base_fds_ = fds;  // report growth once per step
  }
  if (threads > base_threads_ + kThreadSlack) {
    Violation("fds-threads", "kubelet pid " + std::to_string(kubelet_->pid()) + " has " +
                                 std::to_string(threads) + " threads, " +
                                 std::to_string(base_threads_) + " when it first settled (slack " +
                                 std::to_string(kThreadSlack) + ")");
    base_threads_ = threads;
  }
}

void Soak::Settle() {
  if (extender_) extender_->Settle();
  if (kubelet_restart_at_) kubelet_restart_at_ = Clock::now();
  for (auto& p : plugins_) {
    if (p.restart_at) p.restart_at = Clock::now();
  }
  Tick();
  if (!WaitFor([&] { return KubeletServing(); }, kSettleBound)) {
    if (!Stopping()) Violation("read", "the pod-resources API does not answer");
    return;
  }
  // Every manifest has its status, every removed one lost it.
  bool statuses = WaitFor(
      [&] {
        for (const auto& [name, p] : pods_) {
          if (fs::exists(StatusPath(p)) != p.manifest_present) return false;
        }
        return true;
      },
      kSettleBound);
  if (Stopping()) return;
  if (!statuses) {
    for (const auto& [name, p] : pods_) {
      if (fs::exists(StatusPath(p)) != p.manifest_present) {
        Violation(p.manifest_present ? "admission" : "gone-pod-freed",
                  name + (p.manifest_present ? ": no status file" : ": status file not removed") +
                      " " + std::to_string(kSettleBound.count()) + " s after settling began");
      }
    }
  }
  std::vector<std::string> capacity;
  bool ok = WaitFor(
      [&] {
        capacity = CapacityProblems();
        return capacity.empty();
      },
      kSettleBound);
  if (Stopping()) return;
  Count("capacity");
  if (!ok) {
    for (const auto& c : capacity) Violation("capacity", c);
  }
  CheckPods();
  SampleFdsThreads();
}

}  // namespace kdm::soak
