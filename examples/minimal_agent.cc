// minimal_agent: the smallest node agent that embeds kdm's device manager.
// docs/embedding.md walks through it.
//
//   minimal_agent [--plugin-dir DIR] [--resource NAME] [--wait-seconds N] [--demo]
//
// It serves the device plugin Registration service in DIR, waits until a
// plugin has registered NAME, admits one pod that asks for one device of it,
// prints the run options the container runtime would get, and exits. With
// --demo it first starts an example plugin of its own (kdm's plugin SDK) in
// the same process, so it runs anywhere without a real plugin; CI runs it so.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "kdm/base/sync.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"

namespace {

using kdm::devicemanager::Manager;

int Fail(const std::string& what, const kdm::Status& s) {
  std::fprintf(stderr, "minimal_agent: %s: %s\n", what.c_str(), s.ToString().c_str());
  return 1;
}

// The agent's own pod bookkeeping: the Manager asks it which pods are active.
class PodTable {
 public:
  void Add(const std::string& uid) {
    kdm::MutexLock lock(&mu_);
    active_.insert(uid);
  }
  std::set<std::string> Active() const {
    kdm::MutexLock lock(&mu_);
    return active_;
  }

 private:
  mutable kdm::Mutex mu_;
  std::set<std::string> active_ ABSL_GUARDED_BY(mu_);
};

// The example plugin for --demo: two devices on NUMA nodes 0 and 1.
kdm::StatusOr<std::unique_ptr<kdm::plugin::PluginServer>> StartDemoPlugin(
    const std::string& dir, const std::string& resource) {
  kdm::plugin::PluginServer::Options o;
  o.resource_name = resource;
  o.plugin_dir = dir;
  o.devices = {{"dev0", true, {0}}, {"dev1", true, {1}}};
  o.allocate = [](const v1beta1::ContainerAllocateRequest& req)
      -> kdm::StatusOr<v1beta1::ContainerAllocateResponse> {
    v1beta1::ContainerAllocateResponse r;
    std::string ids;
    for (const auto& id : req.devices_ids()) ids += (ids.empty() ? "" : ",") + id;
    (*r.mutable_envs())["EXAMPLE_DEVICES"] = ids;
    auto* dev = r.add_devices();
    dev->set_container_path("/dev/example");
    dev->set_host_path("/dev/null");
    dev->set_permissions("rw");
    return r;
  };
  auto server = kdm::plugin::PluginServer::Create(std::move(o));
  if (!server.ok()) return server.status();
  if (kdm::Status s = (*server)->Start(); !s.ok()) return s;
  return server;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin_dir = "/tmp/kdm-minimal-agent";
  std::string resource = "example.com/dev";
  int wait_seconds = 30;
  bool demo = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (arg == "--plugin-dir") {
      plugin_dir = value();
    } else if (arg == "--resource") {
      resource = value();
    } else if (arg == "--wait-seconds") {
      wait_seconds = std::atoi(value().c_str());
    } else if (arg == "--demo") {
      demo = true;
    } else {
      std::fprintf(stderr,
                   "usage: minimal_agent [--plugin-dir DIR] [--resource NAME] "
                   "[--wait-seconds N] [--demo]\n");
      return 2;
    }
  }

  // 1. Options: where plugins register, and how to learn which pods are
  //    active. Everything else (in-memory checkpoint, real clock, 10 s RPC
  //    deadlines, 5 min grace period) keeps its default.
  PodTable pods;
  Manager::Options options;
  options.plugin_dir = plugin_dir;
  options.active_pods = [&pods] { return pods.Active(); };
  auto created = Manager::Create(std::move(options));
  if (!created.ok()) return Fail("create", created.status());
  std::unique_ptr<Manager> manager = std::move(*created);

  // 2. Health changes arrive on the Manager's threads, without its lock held.
  manager->Subscribe([](const std::vector<kdm::devicemanager::DeviceHealthEvent>& events) {
    for (const auto& e : events) {
      std::printf("health: %s %s %s\n", e.resource_name.c_str(), e.device_id.c_str(),
                  e.healthy ? "healthy" : "unhealthy");
    }
  });

  // 3. Start: restores the checkpoint, clears stale plugin sockets, serves
  //    <plugin_dir>/kubelet.sock.
  if (kdm::Status s = manager->Start(); !s.ok()) return Fail("start", s);

  std::unique_ptr<kdm::plugin::PluginServer> plugin;
  if (demo) {
    auto p = StartDemoPlugin(plugin_dir, resource);
    if (!p.ok()) return Fail("demo plugin", p.status());
    plugin = std::move(*p);
  }

  // 4. Wait until the resource has an allocatable device.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(wait_seconds);
  while (true) {
    auto capacity = manager->GetCapacity();
    auto it = capacity.resources.find(resource);
    if (it != capacity.resources.end() && it->second.allocatable > 0) {
      std::printf("capacity: %s capacity=%lld allocatable=%lld\n", resource.c_str(),
                  static_cast<long long>(it->second.capacity),
                  static_cast<long long>(it->second.allocatable));
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return Fail("wait", kdm::DeadlineExceededError("no plugin registered " + resource));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }

  // 5. Admit a pod: one app container asking for one device.
  kdm::devicemanager::Pod pod;
  pod.uid = "7f1c0e9a-0000-4000-8000-000000000001";
  pod.namespace_name = "default";
  pod.name = "example";
  kdm::devicemanager::Container main_container;
  main_container.name = "main";
  main_container.limits[resource] = kdm::devicemanager::Quantity::FromInt(1);
  pod.containers.push_back(main_container);
  pods.Add(pod.uid);
  if (kdm::Status s = manager->Allocate(pod, "main"); !s.ok()) return Fail("allocate", s);

  // 6. What the container runtime gets.
  auto run = manager->GetDeviceRunContainerOptions(pod, "main");
  if (!run.ok()) return Fail("run options", run.status());
  for (const auto& [k, v] : run->envs) std::printf("env: %s=%s\n", k.c_str(), v.c_str());
  for (const auto& d : run->devices) {
    std::printf("device: %s -> %s (%s)\n", d.host_path.c_str(), d.container_path.c_str(),
                d.permissions.c_str());
  }
  for (const auto& c : run->cdi_devices) std::printf("cdi: %s\n", c.c_str());
  for (const auto& d : manager->GetDevices(pod.uid, "main")) {
    for (const auto& id : d.device_ids) {
      std::printf("pod-resources: %s %s numa=%lld\n", d.resource_name.c_str(), id.c_str(),
                  d.numa_node ? static_cast<long long>(*d.numa_node) : -1LL);
    }
  }

  // 7. The pod finished: free its devices, then shut down.
  if (kdm::Status s = manager->RemovePod(pod.uid); !s.ok()) return Fail("remove pod", s);
  if (plugin) plugin->Stop();
  manager->Stop();
  std::printf("ok\n");
  return 0;
}
