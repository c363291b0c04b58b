// kdm node demo: the end-to-end story of a node agent built on kdm, in one
// process, over real unix sockets and a real SQLite checkpoint.
//
//   1. a Manager serves kubelet.sock in a fresh temporary directory;
//   2. two device plugins built with kdm's SDK register: an 8-GPU DGX-1 V100
//      (hybrid cube-mesh NVLink) whose GetPreferredAllocation is kdm's optimal
//      allocator (packed policy), and a 4-device FPGA plugin without one;
//   3. pods of 2, 4 (after an init container), 1 and 1 GPUs are admitted, and
//      a fifth is rejected with the kubelet's message; for each GPU pod the
//      chosen set and its link score are shown beside first-fit's;
//   4. the Manager restarts on the same checkpoint: every allocation is
//      recovered and both plugins register again;
//   5. one GPU turns unhealthy and allocatable drops;
//   6. a summary table.
// Exits non-zero if any step misbehaves.
// Usage: kdm_node_demo [--keep] [--verbose]   (--keep leaves the directory,
// --verbose shows the Manager's event log)
#include <spdlog/spdlog.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/checkpoint/sqlite_store.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/presets.h"

namespace {

using namespace std::chrono_literals;
namespace dm = kdm::devicemanager;
namespace topo = kdm::topology;

constexpr char kGpu[] = "nvidia.com/gpu";
constexpr char kFpga[] = "example.com/fpga";

int failures = 0;

void Check(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::cout << "  !! FAILED: " << what << "\n";
  }
}

std::string Join(const std::vector<std::string>& v, const char* sep = ",") {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : sep) + s;
  return out;
}

std::string JoinIdx(const std::vector<int>& v) {
  std::string out;
  for (int i : v) out += (out.empty() ? "" : ",") + std::to_string(i);
  return "{" + out + "}";
}

// Waits (bounded) until `pred` holds.
template <typename Pred>
bool WaitFor(Pred pred, std::chrono::milliseconds timeout = 10s) {
  auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return pred();
}

std::unique_ptr<kdm::plugin::PluginServer> StartGpuPlugin(const std::string& dir,
                                                          const topo::Topology& t) {
  kdm::plugin::PluginServer::Options o;
  o.resource_name = kGpu;
  o.plugin_dir = dir;
  for (const auto& d : t.devices()) {
    kdm::plugin::Device dev{d.id, true, {}};
    if (d.numa) dev.numa_nodes.push_back(*d.numa);
    o.devices.push_back(dev);
  }
  o.get_preferred_allocation = [t](const v1beta1::ContainerPreferredAllocationRequest& req)
      -> kdm::StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
    std::vector<std::string> available(req.available_deviceids().begin(),
                                       req.available_deviceids().end());
    std::vector<std::string> must(req.must_include_deviceids().begin(),
                                  req.must_include_deviceids().end());
    auto ids = topo::AllocateIds(t, available, must, req.allocation_size(), topo::Policy::kPacked);
    if (!ids.ok()) return ids.status();
    v1beta1::ContainerPreferredAllocationResponse r;
    for (const auto& id : *ids) r.add_deviceids(id);
    return r;
  };
  o.allocate = [t](const v1beta1::ContainerAllocateRequest& req)
      -> kdm::StatusOr<v1beta1::ContainerAllocateResponse> {
    v1beta1::ContainerAllocateResponse r;
    std::vector<std::string> ids(req.devices_ids().begin(), req.devices_ids().end());
    (*r.mutable_envs())["NVIDIA_VISIBLE_DEVICES"] = Join(ids);
    for (const auto& id : ids) {
      auto idx = t.IndexOf(id);
      if (!idx) return kdm::NotFoundError("unknown GPU " + id);
      auto* spec = r.add_devices();
      spec->set_container_path("/dev/nvidia" + std::to_string(*idx));
      spec->set_host_path("/dev/nvidia" + std::to_string(*idx));
      spec->set_permissions("rw");
    }
    for (const char* ctl : {"/dev/nvidiactl", "/dev/nvidia-uvm"}) {
      auto* spec = r.add_devices();
      spec->set_container_path(ctl);
      spec->set_host_path(ctl);
      spec->set_permissions("rw");
    }
    return r;
  };
  o.register_backoff_initial = 20ms;
  o.watch_interval = 50ms;
  auto server = kdm::plugin::PluginServer::Create(std::move(o));
  if (!server.ok()) {
    std::cout << "gpu plugin: " << server.status() << "\n";
    return nullptr;
  }
  if (auto s = (*server)->Start(); !s.ok()) {
    std::cout << "gpu plugin: " << s << "\n";
    return nullptr;
  }
  return std::move(*server);
}

std::unique_ptr<kdm::plugin::PluginServer> StartFpgaPlugin(const std::string& dir) {
  kdm::plugin::PluginServer::Options o;
  o.resource_name = kFpga;
  o.plugin_dir = dir;
  for (int i = 0; i < 4; ++i) o.devices.push_back({"fpga" + std::to_string(i), true, {i / 2}});
  o.allocate = [](const v1beta1::ContainerAllocateRequest& req)
      -> kdm::StatusOr<v1beta1::ContainerAllocateResponse> {
    v1beta1::ContainerAllocateResponse r;
    std::vector<std::string> ids(req.devices_ids().begin(), req.devices_ids().end());
    (*r.mutable_envs())["FPGA_DEVICES"] = Join(ids);
    return r;
  };
  o.register_backoff_initial = 20ms;
  o.watch_interval = 50ms;
  auto server = kdm::plugin::PluginServer::Create(std::move(o));
  if (!server.ok() || !(*server)->Start().ok()) return nullptr;
  return std::move(*server);
}

struct DemoPod {
  dm::Pod pod;
  int gpus = 0;  // app container's GPUs
  bool expect_admitted = true;
  // Filled in as the demo runs.
  std::vector<int> chosen;
  int64_t score = 0;
  std::vector<int> first_fit;
  int64_t first_fit_score = 0;
  std::string result;
};

dm::Container MakeContainer(const std::string& name, std::map<std::string, int64_t> devices) {
  dm::Container c;
  c.name = name;
  for (const auto& [resource, n] : devices) {
    c.limits[resource] = dm::Quantity::FromInt(n);
    c.requests[resource] = dm::Quantity::FromInt(n);
  }
  return c;
}

std::unique_ptr<dm::Manager> StartManager(const std::string& dir,
                                          std::shared_ptr<kdm::checkpoint::Store> store,
                                          const std::set<std::string>* active) {
  dm::Manager::Options o;
  o.plugin_dir = dir;
  o.store = std::move(store);
  o.rpc_timeout = 5s;
  o.registration_timeout = 5s;
  o.active_pods = [active] { return *active; };
  auto m = dm::Manager::Create(std::move(o));
  if (!m.ok()) {
    std::cout << "manager: " << m.status() << "\n";
    return nullptr;
  }
  if (auto s = (*m)->Start(); !s.ok()) {
    std::cout << "manager start: " << s << "\n";
    return nullptr;
  }
  return std::move(*m);
}

std::vector<std::string> DevicesOf(const dm::Manager& m, const std::string& uid,
                                   const std::string& container, const std::string& resource) {
  std::vector<std::string> out;
  for (const auto& cd : m.GetDevices(uid, container)) {
    if (cd.resource_name == resource)
      out.insert(out.end(), cd.device_ids.begin(), cd.device_ids.end());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Indices(const topo::Topology& t, const std::vector<std::string>& ids) {
  std::vector<int> out;
  for (const auto& id : ids) out.push_back(t.IndexOf(id).value_or(-1));
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  bool keep = false;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--keep") {
      keep = true;
    } else if (arg == "--verbose") {
      verbose = true;
    } else {
      std::cerr << "usage: kdm_node_demo [--keep] [--verbose]\n";
      return 2;
    }
  }
  spdlog::set_level(verbose ? spdlog::level::info : spdlog::level::warn);
  auto started = std::chrono::steady_clock::now();
  char tmpl[] = "/tmp/kdm-demo-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string root = tmpl;
  const std::string dir = root + "/device-plugins";
  std::cout << "== kdm node demo in " << root << "\n";

  auto preset = topo::Preset("dgx1-v100");
  if (!preset.ok()) {
    std::cout << preset.status() << "\n";
    return 1;
  }
  const topo::Topology& gpus = *preset;

  auto opened = kdm::checkpoint::OpenSqliteStore({.path = root + "/checkpoint.db"});
  if (!opened.ok()) {
    std::cout << "checkpoint: " << opened.status() << "\n";
    return 1;
  }
  std::shared_ptr<kdm::checkpoint::Store> store = std::move(opened->store);

  std::set<std::string> active;
  auto manager = StartManager(dir, store, &active);
  if (!manager) return 1;
  std::cout << "-- 1. manager serving " << dir << "/kubelet.sock, checkpoint " << store->Describe()
            << "\n";

  auto gpu_plugin = StartGpuPlugin(dir, gpus);
  auto fpga_plugin = StartFpgaPlugin(dir);
  if (!gpu_plugin || !fpga_plugin) return 1;
  bool registered = WaitFor([&] {
    auto c = manager->GetCapacity();
    return c.resources[kGpu].allocatable == 8 && c.resources[kFpga].allocatable == 4;
  });
  Check(registered, "both plugins registered (8 GPUs, 4 FPGAs allocatable)");
  std::cout << "-- 2. plugins registered: " << kGpu << " (dgx1-v100, packed policy), " << kFpga
            << " (4 devices)\n";

  // The pods.
  std::vector<DemoPod> pods;
  auto add_pod = [&](const std::string& name, std::vector<dm::Container> init, dm::Container app,
                     int gpus_wanted, bool admitted) {
    DemoPod p;
    p.pod.uid = "uid-" + name;
    p.pod.namespace_name = "default";
    p.pod.name = name;
    p.pod.init_containers = std::move(init);
    p.pod.containers.push_back(std::move(app));
    p.gpus = gpus_wanted;
    p.expect_admitted = admitted;
    pods.push_back(std::move(p));
  };
  add_pod("train-2gpu", {}, MakeContainer("main", {{kGpu, 2}}), 2, true);
  add_pod("train-4gpu", {MakeContainer("fetch-weights", {{kGpu, 1}})},
          MakeContainer("main", {{kGpu, 4}, {kFpga, 1}}), 4, true);
  add_pod("infer-a", {}, MakeContainer("main", {{kGpu, 1}}), 1, true);
  add_pod("infer-b", {}, MakeContainer("main", {{kGpu, 1}, {kFpga, 2}}), 1, true);
  add_pod("one-too-many", {}, MakeContainer("main", {{kGpu, 1}}), 1, false);

  std::cout << "-- 3. admitting pods\n";
  std::set<std::string> gpus_taken;
  for (DemoPod& p : pods) {
    active.insert(p.pod.uid);
    // What first-fit would pick from the GPUs free right now.
    std::vector<int> free_gpus;
    for (int i = 0; i < gpus.size(); ++i) {
      if (!gpus_taken.count(gpus.Device(i).id)) free_gpus.push_back(i);
    }
    kdm::Status status;
    for (const auto& c : p.pod.init_containers) {
      status = manager->Allocate(p.pod, c.name);
      if (!status.ok()) break;
    }
    // The init container's GPU is handed to the app container: first-fit
    // must keep it too.
    std::vector<int> must;
    if (status.ok() && !p.pod.init_containers.empty()) {
      must = Indices(gpus, DevicesOf(*manager, p.pod.uid, p.pod.init_containers[0].name, kGpu));
    }
    if (status.ok()) status = manager->Allocate(p.pod, "main");
    if (free_gpus.size() >= static_cast<size_t>(p.gpus)) {
      auto ff = topo::Allocate(gpus, free_gpus, must, p.gpus, topo::Policy::kFirstFit);
      if (ff.ok()) {
        p.first_fit = ff->chosen;
        p.first_fit_score = ff->score;
      }
    }
    if (!status.ok()) {
      p.result = "Rejected";
      std::cout << "   " << p.pod.name << ": rejected: " << status.message() << "\n";
      Check(!p.expect_admitted, p.pod.name + " should have been admitted");
      active.erase(p.pod.uid);
      continue;
    }
    p.result = "Admitted";
    Check(p.expect_admitted, p.pod.name + " should have been rejected");
    auto ids = DevicesOf(*manager, p.pod.uid, "main", kGpu);
    for (const auto& id : ids) gpus_taken.insert(id);
    p.chosen = Indices(gpus, ids);
    p.score = gpus.SetScore(p.chosen);
    Check(static_cast<int>(p.chosen.size()) == p.gpus, p.pod.name + " got " + JoinIdx(p.chosen));
    auto run = manager->GetDeviceRunContainerOptions(p.pod, "main");
    Check(run.ok(), p.pod.name + " run options");
    std::cout << "   " << p.pod.name << ": GPUs " << JoinIdx(p.chosen) << " score " << p.score
              << "   (first-fit: " << JoinIdx(p.first_fit) << " score " << p.first_fit_score << ")";
    if (run.ok()) std::cout << "  NVIDIA_VISIBLE_DEVICES=" << run->envs["NVIDIA_VISIBLE_DEVICES"];
    std::cout << "\n";
  }
  Check(pods.back().result == "Rejected", "the ninth GPU is refused");

  // Restart on the same checkpoint.
  std::cout << "-- 4. restarting the manager on the same checkpoint\n";
  std::map<std::string, std::vector<std::string>> before;
  for (const auto& p : pods) before[p.pod.name] = DevicesOf(*manager, p.pod.uid, "main", kGpu);
  const dm::ManagerStats stats_before_restart = manager->GetStats();
  int gpu_regs = gpu_plugin->RegistrationCount();
  int fpga_regs = fpga_plugin->RegistrationCount();
  manager->Stop();
  manager.reset();
  manager = StartManager(dir, store, &active);
  if (!manager) return 1;
  bool recovered = true;
  for (const auto& p : pods) {
    auto now = DevicesOf(*manager, p.pod.uid, "main", kGpu);
    if (now != before[p.pod.name]) recovered = false;
    std::cout << "   " << p.pod.name << ": " << (now.empty() ? "-" : Join(now)) << "\n";
  }
  Check(recovered, "every allocation recovered after the restart");
  bool reregistered = gpu_plugin->WaitForRegistrationCount(gpu_regs + 1, 10s) &&
                      fpga_plugin->WaitForRegistrationCount(fpga_regs + 1, 10s);
  Check(reregistered, "both plugins registered again");
  bool back = WaitFor([&] { return manager->GetCapacity().resources[kGpu].capacity == 8; });
  Check(back, "GPU capacity back to 8");
  std::cout << "   plugins registered again: " << (reregistered ? "yes" : "no") << "\n";
  // A restarted container gets its own devices back, never new ones.
  kdm::Status again = manager->Allocate(pods[0].pod, "main");
  Check(
      again.ok() && DevicesOf(*manager, pods[0].pod.uid, "main", kGpu) == before[pods[0].pod.name],
      "a restarted container reuses its recorded GPUs");

  std::cout << "-- 5. GPU3 turns unhealthy\n";
  auto before_health = manager->GetCapacity().resources[kGpu];
  (void)gpu_plugin->SetHealth("GPU3", false);
  bool dropped = WaitFor([&] { return manager->GetCapacity().resources[kGpu].allocatable == 7; });
  auto after_health = manager->GetCapacity().resources[kGpu];
  Check(dropped, "allocatable drops to 7");
  std::cout << "   " << kGpu << " capacity " << after_health.capacity << ", allocatable "
            << before_health.allocatable << " -> " << after_health.allocatable << "\n";

  std::cout << "-- 6. summary\n";
  std::printf("   %-14s %-9s %-12s %6s   %-12s %6s\n", "pod", "result", "kdm GPUs", "score",
              "first-fit", "score");
  int64_t kdm_total = 0, ff_total = 0;
  for (const auto& p : pods) {
    std::printf("   %-14s %-9s %-12s %6lld   %-12s %6lld\n", p.pod.name.c_str(), p.result.c_str(),
                p.chosen.empty() ? "-" : JoinIdx(p.chosen).c_str(), static_cast<long long>(p.score),
                p.first_fit.empty() ? "-" : JoinIdx(p.first_fit).c_str(),
                static_cast<long long>(p.first_fit_score));
    if (p.result == "Admitted") {
      kdm_total += p.score;
      ff_total += p.first_fit_score;
    }
  }
  std::printf("   %-14s %-9s %-12s %6lld   %-12s %6lld\n", "total", "", "",
              static_cast<long long>(kdm_total), "", static_cast<long long>(ff_total));
  const auto& st = stats_before_restart;
  std::cout << "   GetPreferredAllocation answers used: " << st.preferred_ok
            << ", rejected: " << st.preferred_invalid << ", RPC errors: " << st.preferred_rpc_error
            << "; checkpoint: " << store->Describe() << "\n";

  manager->Stop();
  manager.reset();
  gpu_plugin->Stop();
  fpga_plugin->Stop();
  store.reset();
  if (!keep) std::filesystem::remove_all(root);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::cout << "== " << (failures == 0 ? "demo OK" : "demo FAILED") << " (" << failures
            << " failed checks, " << secs << " s)\n";
  return failures == 0 ? 0 : 1;
}
