// churn_bench: how fast the Manager takes in device churn, over real unix
// sockets, in one process.
//
// (a) Snapshot: one plugin (the SDK's PluginServer) advertising 10,000
//     devices. Each round the plugin sends one full ListAndWatch snapshot of
//     all 10,000 devices (PluginServer::SetDevices), alternately all healthy
//     and all unhealthy; the time is from the SetDevices call to the
//     Manager's health callback reporting the 10,000 changes with its
//     capacity already showing them (allocatable 10,000 or 0, capacity
//     10,000). Rounds: --rounds=N (default 20); figures p50 and max.
// (b) Registration: --plugins=N (default 100) PluginServers, one resource
//     each ("bench.kdm.dev/r<i>", 4 devices), started together against one
//     running Manager; the time from the first Start() to every resource
//     showing capacity 4.
//
// Flags: --rounds=N, --devices=N (default 10000), --plugins=N, --json=PATH.
// Output: one JSON line per figure (bench/e2e/bench_output.h).
//   build-release/bin/bench/churn_bench
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "kdm/base/sync.h"
#include "kdm/bench/e2e/bench_output.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/pluginapi/sdk/plugin_server.h"

namespace kdm::bench {
namespace {

using namespace std::chrono_literals;
namespace dm = kdm::devicemanager;

constexpr char kBig[] = "bench.kdm.dev/big";

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "churn_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string MakeSocketDir() {
  std::string tmpl = "/tmp/kdm-c-XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) Die("mkdtemp failed");
  return tmpl;
}

std::unique_ptr<dm::Manager> StartManager(const std::string& dir) {
  dm::Manager::Options mo;
  mo.plugin_dir = dir;
  auto manager = dm::Manager::Create(std::move(mo));
  if (!manager.ok()) Die("Manager::Create: " + manager.status().ToString());
  if (Status s = (*manager)->Start(); !s.ok()) Die("Manager::Start: " + s.ToString());
  return std::move(*manager);
}

std::unique_ptr<plugin::PluginServer> StartPlugin(const std::string& dir,
                                                  const std::string& resource,
                                                  std::vector<plugin::Device> devices) {
  plugin::PluginServer::Options o =
      plugin::AllocateNothingOptions(resource, dir, std::move(devices));
  auto server = plugin::PluginServer::Create(std::move(o));
  if (!server.ok()) Die("PluginServer::Create: " + server.status().ToString());
  if (Status s = (*server)->Start(); !s.ok()) Die("PluginServer::Start: " + s.ToString());
  return std::move(*server);
}

std::vector<plugin::Device> Devices(int n, bool healthy) {
  std::vector<plugin::Device> d;
  d.reserve(n);
  for (int i = 0; i < n; ++i) d.push_back({"dev-" + std::to_string(i), healthy, {i % 2}});
  return d;
}

// (a): one snapshot of `n` devices, `rounds` times.
void SnapshotRounds(int n, long rounds, Figures& out) {
  const std::string dir = MakeSocketDir();
  std::unique_ptr<dm::Manager> manager = StartManager(dir);

  // Set by the health callback once the capacity shows the round's target.
  kdm::Mutex mu;
  int64_t want_allocatable = n;  // guarded by mu
  bool reached = false;          // guarded by mu
  std::chrono::steady_clock::time_point reached_at;
  dm::Manager* raw = manager.get();
  int64_t sub = manager->Subscribe([&](const std::vector<dm::DeviceHealthEvent>& events) {
    if (events.empty() || events.front().resource_name != kBig) return;
    dm::CapacityReport::Amounts a = raw->GetCapacity().resources[kBig];
    kdm::MutexLock lock(&mu);
    if (a.capacity == n && a.allocatable == want_allocatable) {
      reached = true;
      reached_at = std::chrono::steady_clock::now();
    }
  });

  std::unique_ptr<plugin::PluginServer> plugin = StartPlugin(dir, kBig, Devices(n, true));
  if (!WaitUntil([&] { return manager->GetCapacity().resources[kBig].allocatable == n; }, 30s,
                 1ms)) {
    Die("the " + std::to_string(n) + "-device plugin did not register within 30 s");
  }
  const std::vector<plugin::Device> healthy = Devices(n, true), unhealthy = Devices(n, false);

  // Process CPU time (plugin and Manager sides together) per snapshot: on a
  // loaded machine the wall time mostly measures waiting for a core.
  auto cpu_ms = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e3 +
           (u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e3;
  };
  const double cpu_start = cpu_ms();
  std::vector<double> ms;
  for (long r = 0; r < rounds; ++r) {
    const bool to_healthy = r % 2 == 1;  // round 0 turns everything unhealthy
    {
      kdm::MutexLock lock(&mu);
      want_allocatable = to_healthy ? n : 0;
      reached = false;
    }
    const auto t0 = std::chrono::steady_clock::now();
    plugin->SetDevices(to_healthy ? healthy : unhealthy);
    kdm::MutexLock lock(&mu);
    if (!mu.AwaitWithTimeout(kdm::Condition(&reached), absl::Seconds(30))) {
      Die("snapshot round " + std::to_string(r) + " was not processed within 30 s");
    }
    ms.push_back(std::chrono::duration<double, std::milli>(reached_at - t0).count());
  }
  const double cpu_per_snapshot = (cpu_ms() - cpu_start) / static_cast<double>(rounds);
  manager->Unsubscribe(sub);
  manager->Stop();  // first: a plugin going away would start grace timers
  plugin->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  out.Add("snapshot_devices", n, "count");
  out.Add("snapshot_p50_ms", Percentile(ms, 50), "ms");
  out.Add("snapshot_max_ms", Percentile(ms, 100), "ms");
  out.Add("snapshot_cpu_ms", cpu_per_snapshot, "ms");
  std::fprintf(stderr,
               "churn_bench: %ld snapshots of %d devices: p50 %.2f ms, max %.2f ms, process CPU "
               "%.2f ms per snapshot\n",
               rounds, n, Percentile(ms, 50), Percentile(ms, 100), cpu_per_snapshot);
}

// (b): `count` plugins registering with one Manager.
void Registration(long count, Figures& out) {
  const std::string dir = MakeSocketDir();
  std::unique_ptr<dm::Manager> manager = StartManager(dir);
  std::vector<std::unique_ptr<plugin::PluginServer>> plugins;
  const auto t0 = std::chrono::steady_clock::now();
  for (long i = 0; i < count; ++i) {
    plugins.push_back(StartPlugin(dir, "bench.kdm.dev/r" + std::to_string(i), Devices(4, true)));
  }
  auto all_there = [&] {
    dm::CapacityReport c = manager->GetCapacity();
    long ready = 0;
    for (const auto& [name, a] : c.resources) ready += a.capacity == 4 ? 1 : 0;
    return ready == count;
  };
  if (!WaitUntil(all_there, 60s, 1ms)) {
    Die(std::to_string(count) + " plugins did not all register within 60 s");
  }
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  manager->Stop();
  for (auto& p : plugins) p->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);

  out.Add("plugins", static_cast<double>(count), "count");
  out.Add("register_ms", ms, "ms");
  std::fprintf(stderr, "churn_bench: %ld plugins registered in %.1f ms\n", count, ms);
}

int Main(int argc, char** argv) {
  const long rounds = IntFlag(argc, argv, "rounds", 20);
  const long devices = IntFlag(argc, argv, "devices", 10000);
  const long plugins = IntFlag(argc, argv, "plugins", 100);
  Figures out("churn", FlagValue(argc, argv, "json"));
  // The Manager's per-event lines are not what is measured here; warnings
  // and errors still show.
  spdlog::set_level(spdlog::level::warn);
  SnapshotRounds(static_cast<int>(devices), rounds, out);
  Registration(plugins, out);
  return out.Write() ? 0 : 1;
}

}  // namespace
}  // namespace kdm::bench

int main(int argc, char** argv) { return kdm::bench::Main(argc, argv); }
