// NodeAgent::Stop with a plugin call in flight (issue 30, item 2), in
// process over real sockets: the agent's Stop cancels the plugin's held
// GetPreferredAllocation (Manager::CancelPluginCalls) instead of waiting for
// the RPC deadline, and writes no status file for the pod whose admission it
// cut short.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "kdm/fakes/faulty_plugin.h"
#include "kdm/fakes/node_agent.h"
#include "kdm/test/wait_until.h"

namespace kdm::fakes {
namespace {

using kdm::test::WaitUntil;
using namespace std::chrono_literals;

constexpr char kStopGpu[] = "example.com/gpu";

int64_t StopTestCapacity(const NodeAgent& agent) {
  auto report = agent.manager().GetCapacity();
  auto it = report.resources.find(kStopGpu);
  return it == report.resources.end() ? -1 : it->second.capacity;
}

TEST(NodeAgentStopTest, StopCancelsAHeldPluginCallAndWritesNoStatus) {
  char tmpl[] = "/tmp/kdm-as-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl;

  NodeAgent::Options o;
  o.root = root;
  o.rpc_timeout = 30s;  // a Stop that waited for it would take 30 s
  o.registration_grace = 0ms;
  auto agent = NodeAgent::Start(o);
  ASSERT_TRUE(agent.ok()) << agent.status();

  PluginConfig c;
  c.resource_name = kStopGpu;
  c.plugin_dir = root + "/device-plugins";
  c.count = 4;
  c.register_with_kubelet = true;
  c.register_backoff_initial = 10ms;
  c.register_backoff_max = 50ms;
  auto plugin = FaultyPlugin::Create(c, "pref-slow");  // holds requests of 3 or more
  ASSERT_TRUE(plugin.ok()) << plugin.status();
  ASSERT_TRUE((*plugin)->Start().ok());
  ASSERT_TRUE(WaitUntil([&] { return StopTestCapacity(**agent) == 4; }, 10s));

  std::ofstream(root + "/manifests/big.yaml")
      << "apiVersion: v1\nkind: Pod\nmetadata: {name: big}\nspec:\n  containers:\n"
         "  - name: main\n    resources: {limits: {example.com/gpu: 3}}\n";
  ASSERT_TRUE(WaitUntil([&] { return (*plugin)->HeldCalls() == 1; }, 10s));

  const auto start = std::chrono::steady_clock::now();
  (*agent)->Stop();
  const auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, 3s);
  // The plugin saw its caller go.
  EXPECT_TRUE(WaitUntil([&] { return (*plugin)->HeldCalls() == 0; }, 10s));
  EXPECT_FALSE(std::filesystem::exists(root + "/status/default_big.json"));
  (*plugin)->Stop();
  agent->reset();
  std::filesystem::remove_all(root);
}

}  // namespace
}  // namespace kdm::fakes
