// `kdm get pods|devices|capacity`: the built binary against a
// PodResourcesServer + Manager (with an SDK plugin) running in this test
// process, and against bad roots.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/pod_resources_server.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/test/e2e/e2e_util.h"

extern char** environ;

namespace kdm::devicemanager {
namespace {

using namespace std::chrono_literals;
using kdm::e2e::KdmBinary;
using kdm::e2e::ReadFile;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kGetGpu[] = "example.com/gpu";

struct Result {
  int exit_code = -1;
  std::string out, err;
};

// Runs the kdm binary with `args`; stdout and stderr go through files.
Result RunKdm(const std::vector<std::string>& args, const std::string& scratch) {
  std::vector<std::string> all = {KdmBinary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = scratch + "/stdout", err = scratch + "/stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  Result r;
  if (rc != 0) {
    r.err = "cannot run " + all[0] + ": " + std::strerror(rc);
    return r;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream s(text);
  for (std::string line; std::getline(s, line);) out.push_back(line);
  return out;
}

Container MakeContainer(const std::string& name, int gpus, bool restartable = false) {
  Container c;
  c.name = name;
  c.restartable = restartable;
  if (gpus > 0) {
    c.limits[kGetGpu] = Quantity::FromInt(gpus);
    c.requests[kGetGpu] = Quantity::FromInt(gpus);
  }
  return c;
}

class GetE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-get-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    scratch_ = root_ + "/scratch";
    std::filesystem::create_directories(scratch_);
  }
  void TearDown() override {
    if (server_) server_->Stop();
    if (manager_) manager_->Stop();
    if (plugin_) plugin_->Stop();
    std::filesystem::remove_all(root_);
  }

  // A Manager with one 4-GPU plugin (NUMA 0,0,1,1), serving pod-resources
  // at ROOT/pod-resources/kubelet.sock.
  void StartNode() {
    Manager::Options mo;
    mo.plugin_dir = root_ + "/device-plugins";
    mo.registration_timeout = 5s;
    mo.rpc_timeout = 5s;
    auto m = Manager::Create(std::move(mo));
    ASSERT_TRUE(m.ok()) << m.status();
    manager_ = std::move(*m);
    ASSERT_TRUE(manager_->Start().ok());
    plugin::PluginServer::Options o;
    o.resource_name = kGetGpu;
    o.plugin_dir = root_ + "/device-plugins";
    o.devices = {
        {"gpu0", true, {0}}, {"gpu1", true, {0}}, {"gpu2", true, {1}}, {"gpu3", true, {1}}};
    o.allocate = [](const v1beta1::ContainerAllocateRequest&)
        -> StatusOr<v1beta1::ContainerAllocateResponse> {
      return v1beta1::ContainerAllocateResponse();
    };
    o.register_backoff_initial = 10ms;
    auto p = plugin::PluginServer::Create(std::move(o));
    ASSERT_TRUE(p.ok()) << p.status();
    plugin_ = std::move(*p);
    ASSERT_TRUE(plugin_->Start().ok());
    ASSERT_TRUE(plugin_->WaitForRegistrationCount(1, 10s));

    PodResourcesServer::Options so;
    so.socket_path = root_ + "/pod-resources/kubelet.sock";
    so.manager = manager_.get();
    so.active_pods = [this] {
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<ActivePod> out;
      for (const Pod& p : pods_) out.push_back(ActivePodOf(p));
      return out;
    };
    auto s = PodResourcesServer::Start(std::move(so));
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
  }

  void Admit(Pod pod) {
    for (const auto& c : pod.init_containers) ASSERT_TRUE(manager_->Allocate(pod, c.name).ok());
    for (const auto& c : pod.containers) ASSERT_TRUE(manager_->Allocate(pod, c.name).ok());
    std::lock_guard<std::mutex> lock(mu_);
    pods_.push_back(std::move(pod));
  }

  void WriteNodeJson(const std::string& text) {
    std::filesystem::create_directories(root_ + "/status");
    std::ofstream(root_ + "/status/node.json") << text;
  }

  Result Kdm(std::vector<std::string> args) { return RunKdm(args, scratch_); }

  std::string root_, scratch_;
  std::unique_ptr<Manager> manager_;
  std::unique_ptr<plugin::PluginServer> plugin_;
  std::unique_ptr<PodResourcesServer> server_;
  std::mutex mu_;
  std::vector<Pod> pods_;
};

Pod MakePod(const std::string& ns, const std::string& name, std::vector<Container> init,
            std::vector<Container> app) {
  Pod p;
  p.uid = "uid-" + ns + "-" + name;
  p.namespace_name = ns;
  p.name = name;
  p.init_containers = std::move(init);
  p.containers = std::move(app);
  return p;
}

TEST_F(GetE2eTest, GetPodsPrintsAnAlignedTable) {
  StartNode();
  Admit(MakePod("default", "train", {}, {MakeContainer("main", 2), MakeContainer("logger", 0)}));
  Admit(MakePod("ml", "infer-long-name", {MakeContainer("proxy", 1, true)},
                {MakeContainer("srv", 1)}));
  Result r = Kdm({"get", "pods", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_EQ(lines.size(), 5u) << r.out;
  EXPECT_THAT(lines[0],
              StartsWith("NAMESPACE  NAME             CONTAINER  RESOURCE         DEVICES"));
  // STATUS and REASON came later, after the columns scripts already read.
  EXPECT_EQ(lines[1],
            "default    train            main       example.com/gpu  gpu0,gpu1  0     Admitted  -");
  EXPECT_EQ(lines[2],
            "default    train            logger     -                -          -     Admitted  -");
  // Every column starts at the same offset on every line.
  const std::size_t devices_col = lines[0].find("DEVICES");
  for (std::size_t i = 1; i < lines.size(); ++i) {
    EXPECT_NE(lines[i][devices_col], ' ') << lines[i];
    EXPECT_EQ(lines[i][devices_col - 1], ' ') << lines[i];
  }
  EXPECT_THAT(lines[3], StartsWith("ml         infer-long-name  proxy      example.com/gpu  gpu"));
  EXPECT_THAT(lines[4], StartsWith("ml         infer-long-name  srv        example.com/gpu  gpu"));
}

TEST_F(GetE2eTest, ARelativeRootWorks) {
  StartNode();
  Admit(MakePod("default", "train", {}, {MakeContainer("main", 1)}));
  const std::string relative = std::filesystem::relative(root_).string();
  ASSERT_NE(relative.front(), '/');
  Result r = Kdm({"get", "pods", "--root", relative});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("default    train  main       example.com/gpu  gpu0"));
}

TEST_F(GetE2eTest, GetPodsJson) {
  StartNode();
  Admit(MakePod("default", "train", {MakeContainer("setup", 1)}, {MakeContainer("main", 2)}));
  Result r = Kdm({"get", "pods", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["pods"].size(), 1u);
  EXPECT_EQ(j["pods"][0]["namespace"], "default");
  EXPECT_EQ(j["pods"][0]["name"], "train");
  ASSERT_EQ(j["pods"][0]["containers"].size(), 1u) << "plain init containers are not listed";
  const auto& main = j["pods"][0]["containers"][0];
  EXPECT_EQ(main["name"], "main");
  ASSERT_EQ(main["devices"].size(), 1u);
  EXPECT_EQ(main["devices"][0]["resource"], kGetGpu);
  EXPECT_EQ(main["devices"][0]["device_ids"].size(), 2u);
  EXPECT_EQ(main["devices"][0]["numa_nodes"], nlohmann::json::array({0}));
}

TEST_F(GetE2eTest, GetPodsWithNoPods) {
  StartNode();
  Result r = Kdm({"get", "pods", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "No active pods.\n");
}

TEST_F(GetE2eTest, GetDevicesShowsFreeAllocatedAndUnhealthyAllocated) {
  StartNode();
  Admit(MakePod("default", "train", {}, {MakeContainer("main", 2)}));
  // gpu0 (held by train) turns unhealthy; wait until the Manager sees it.
  std::mutex mu;
  std::condition_variable cv;
  bool seen = false;
  int64_t id = manager_->Subscribe([&](const std::vector<DeviceHealthEvent>& events) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& e : events) seen = seen || (e.device_id == "gpu0" && !e.healthy);
    cv.notify_all();
  });
  ASSERT_TRUE(plugin_->SetHealth("gpu0", false).ok());
  bool arrived;
  {
    std::unique_lock<std::mutex> lock(mu);
    arrived = cv.wait_for(lock, 10s, [&] { return seen; });
  }
  // Unsubscribed before any assertion can return: the callback uses locals.
  manager_->Unsubscribe(id);
  ASSERT_TRUE(arrived);

  Result r = Kdm({"get", "devices", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> lines = Lines(r.out);
  ASSERT_GE(lines.size(), 5u) << r.out;
  EXPECT_EQ(lines[0], "RESOURCE         DEVICE  NUMA  STATE                POD/CONTAINER");
  EXPECT_EQ(lines[1], "example.com/gpu  gpu0    0     allocated-unhealthy  default/train/main");
  EXPECT_EQ(lines[2], "example.com/gpu  gpu1    0     allocated            default/train/main");
  EXPECT_EQ(lines[3], "example.com/gpu  gpu2    1     free                 -");
  EXPECT_EQ(lines[4], "example.com/gpu  gpu3    1     free                 -");

  r = Kdm({"get", "devices", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["devices"].size(), 4u);
  EXPECT_EQ(j["devices"][0]["id"], "gpu0");
  EXPECT_EQ(j["devices"][0]["state"], "allocated-unhealthy");
  EXPECT_EQ(j["devices"][2]["state"], "free");
  EXPECT_EQ(j["devices"][1]["allocated_to"], "default/train/main");
}

constexpr char kNodeJson[] = R"({
  "capacity": {"example.com/fpga": 4, "nvidia.com/gpu": 8},
  "allocatable": {"example.com/fpga": 0, "nvidia.com/gpu": 7},
  "plugins": [
    {"resource": "example.com/fpga", "state": "Unhealthy", "devices": 4, "healthy": 0},
    {"resource": "nvidia.com/gpu", "state": "Healthy", "devices": 8, "healthy": 7}
  ],
  "deleted_resources": ["example.com/old"],
  "registrations": 3
}
)";

TEST_F(GetE2eTest, GetCapacityReadsNodeJson) {
  WriteNodeJson(kNodeJson);
  Result r = Kdm({"get", "capacity", "--root", root_});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out,
            "RESOURCE          CAPACITY  ALLOCATABLE  PLUGIN\n"
            "example.com/fpga  4         0            Unhealthy\n"
            "nvidia.com/gpu    8         7            Healthy\n"
            "Removed (grace period expired): example.com/old\n"
            "Registrations accepted: 3\n");
  r = Kdm({"get", "capacity", "--root", root_, "-o", "json"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(nlohmann::json::parse(r.out), nlohmann::json::parse(kNodeJson));
}

TEST_F(GetE2eTest, AMissingRootIsExit1NamingIt) {
  const std::string missing = root_ + "/nope";
  for (const char* what : {"pods", "devices", "capacity"}) {
    Result r = Kdm({"get", what, "--root", missing});
    EXPECT_EQ(r.exit_code, 1) << what;
    EXPECT_EQ(r.err,
              std::string("kdm get ") + what + ": root directory " + missing + " does not exist\n");
    EXPECT_EQ(r.out, "");
  }
}

TEST_F(GetE2eTest, AMissingSocketIsExit1NamingIt) {
  for (const char* what : {"pods", "devices"}) {
    Result r = Kdm({"get", what, "--root", root_});
    EXPECT_EQ(r.exit_code, 1) << what;
    EXPECT_THAT(r.err, HasSubstr("pod-resources socket " + root_ +
                                 "/pod-resources/kubelet.sock does not exist"));
  }
}

TEST_F(GetE2eTest, AStaleSocketNobodyServesIsExit1NamingIt) {
  std::filesystem::create_directories(root_ + "/pod-resources");
  const std::string socket = root_ + "/pod-resources/kubelet.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ::close(fd);  // bound, never listened: connections are refused
  Result r = Kdm({"get", "pods", "--root", root_, "--timeout", "2s"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("List on " + socket + " failed"));
}

TEST_F(GetE2eTest, AMissingOrBrokenNodeJsonIsExit1NamingIt) {
  Result r = Kdm({"get", "capacity", "--root", root_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("node status " + root_ + "/status/node.json does not exist"));
  WriteNodeJson("{\"capacity\": {\"a/b\": 1,");  // truncated
  r = Kdm({"get", "capacity", "--root", root_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr(root_ + "/status/node.json: not valid JSON"));
  WriteNodeJson("[1, 2]");
  r = Kdm({"get", "capacity", "--root", root_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("not a JSON object"));
  WriteNodeJson(R"({"capacity": []})");
  r = Kdm({"get", "capacity", "--root", root_});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("\"capacity\" is not an object"));
}

TEST_F(GetE2eTest, UsageErrorsAreExit2) {
  Result r = Kdm({"get", "pods"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--root is required"));
  r = Kdm({"get", "pods", "--root", root_, "-o", "yaml"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("-o must be table, wide or json, not \"yaml\""));
  r = Kdm({"get", "nodes", "--root", root_});
  EXPECT_NE(r.exit_code, 0);
}

}  // namespace
}  // namespace kdm::devicemanager
