// `kdm plugin` end to end: the built binary, run as a user would, against a
// real kdm::devicemanager::Manager in this process (or the small fake
// kubelet), over real unix sockets; and every bad flag combination, each
// with its exit code and a clear message.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/devicemanager/manager.h"
#include "kdm/fakes/faulty_plugin.h"
#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/pluginapi/fake_registration_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/parse.h"
#include "kdm/topology/presets.h"

extern char** environ;

namespace kdm {
namespace {

namespace dm = kdm::devicemanager;
namespace fs = std::filesystem;
using kdm::testing::FakeRegistrationServer;
using kdm::testing::TempSocketDir;
using namespace std::chrono_literals;
using kdm::e2e::KdmBinary;
using kdm::e2e::kWaitBound;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitUntil;

constexpr char kPluginGpu[] = "nvidia.com/gpu";
// Upper bound of every wait; a healthy run never comes close.
constexpr auto kPluginBound = 30s;

// One `kdm` process: stdout on a pipe (for the ready line), stderr in a file.
class KdmProcess {
 public:
  KdmProcess(const std::vector<std::string>& args, const std::string& stderr_path)
      : stderr_path_(stderr_path) {
    int out[2];
    if (::pipe2(out, O_CLOEXEC) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<std::string> argv_s = {KdmBinary()};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    int rc = posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    stdout_fd_ = out[0];
    if (rc != 0) pid_ = -1;
  }

  ~KdmProcess() {
    if (pid_ > 0 && !exit_code_) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  bool started() const { return pid_ > 0; }

  // Reads stdout until a line starting with `prefix` (bounded); the line, or
  // nullopt on EOF or the bound.
  std::optional<std::string> WaitForLine(const std::string& prefix) {
    auto end = std::chrono::steady_clock::now() + kPluginBound;
    while (true) {
      size_t nl;
      while ((nl = stdout_.find('\n')) != std::string::npos) {
        std::string line = stdout_.substr(0, nl);
        stdout_.erase(0, nl + 1);
        if (line.rfind(prefix, 0) == 0) return line;
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          end - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{stdout_fd_, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      char buf[4096];
      ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0) return std::nullopt;
      stdout_.append(buf, n);
    }
  }

  void Signal(int sig) { ::kill(pid_, sig); }

  // Waits (bounded) for the process to exit; its exit code, or nullopt when
  // it did not exit normally in time (it is then killed).
  std::optional<int> Wait() {
    const bool exited = WaitUntil(
        [&] {
          int status = 0;
          if (::waitpid(pid_, &status, WNOHANG) != pid_) return false;
          exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
          return true;
        },
        kPluginBound);
    if (!exited) return std::nullopt;
    return exit_code_;
  }

  std::string Stderr() const { return ReadFile(stderr_path_); }

 private:
  std::string stderr_path_;
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string stdout_;
  std::optional<int> exit_code_;
};

// The largest `registrations=N` the plugin has logged so far (0 if none).
int LoggedRegistrations(const std::string& err) {
  int best = 0;
  const std::string key = "event=registered ";
  for (size_t at = err.find(key); at != std::string::npos; at = err.find(key, at + 1)) {
    size_t r = err.find("registrations=", at);
    size_t eol = err.find('\n', at);
    if (r == std::string::npos || r > eol) continue;
    best = std::max(best, std::atoi(err.c_str() + r + 14));
  }
  return best;
}

std::unique_ptr<dm::Manager> StartManager(const std::string& plugin_dir) {
  dm::Manager::Options o;
  o.plugin_dir = plugin_dir;
  o.registration_timeout = 10s;
  o.rpc_timeout = 10s;
  o.pre_start_timeout = 10s;
  o.active_pods = [] { return std::set<std::string>{}; };
  auto m = dm::Manager::Create(std::move(o));
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return nullptr;
  Status s = (*m)->Start();
  EXPECT_TRUE(s.ok()) << s;
  return s.ok() ? std::move(*m) : nullptr;
}

dm::Pod PodWith(const std::string& name, const std::string& resource, int n) {
  dm::Pod pod;
  pod.uid = "uid-" + name;
  pod.namespace_name = "default";
  pod.name = name;
  dm::Container c;
  c.name = "main";
  c.limits[resource] = dm::Quantity::FromInt(n);
  c.requests[resource] = dm::Quantity::FromInt(n);
  pod.containers.push_back(c);
  return pod;
}

std::vector<std::string> DevicesOf(const dm::Manager& m, const dm::Pod& pod,
                                   const std::string& resource) {
  std::vector<std::string> out;
  for (const auto& cd : m.GetDevices(pod.uid, "main")) {
    if (cd.resource_name == resource) {
      out.insert(out.end(), cd.device_ids.begin(), cd.device_ids.end());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

int64_t Allocatable(const dm::Manager& m, const std::string& resource) {
  auto c = m.GetCapacity();
  auto it = c.resources.find(resource);
  return it == c.resources.end() ? -1 : it->second.allocatable;
}

TEST(PluginE2ETest, RegistersServesPreferredAnswerAndExitsZeroOnSigterm) {
  TempSocketDir root;
  const std::string plugin_dir = root.path() + "/device-plugins";
  auto manager = StartManager(plugin_dir);
  ASSERT_TRUE(manager);

  KdmProcess kdm(
      {"plugin", "--root", root.path(), "--resource", kPluginGpu, "--preset", "dgx1-v100"},
      root.path() + "/plugin.err");
  ASSERT_TRUE(kdm.started());
  auto ready = kdm.WaitForLine("ready ");
  ASSERT_TRUE(ready.has_value()) << kdm.Stderr();
  const std::string socket = plugin_dir + "/nvidia.com_gpu.sock";
  EXPECT_EQ(*ready, "ready plugin=nvidia.com/gpu socket=" + socket + " devices=8");
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, kPluginGpu) == 8; }, kWaitBound))
      << kdm.Stderr();
  ASSERT_TRUE(WaitUntil([&] { return LoggedRegistrations(kdm.Stderr()) == 1; }, kWaitBound))
      << kdm.Stderr();

  // A 2-GPU pod gets what the packed allocator prefers, and the GPU answer.
  dm::Pod pod = PodWith("train", kPluginGpu, 2);
  Status s = manager->Allocate(pod, "main");
  ASSERT_TRUE(s.ok()) << s << kdm.Stderr();
  auto preset = topology::Preset("dgx1-v100");
  ASSERT_TRUE(preset.ok());
  std::vector<std::string> all;
  for (const auto& d : preset->devices()) all.push_back(d.id);
  auto want = topology::AllocateIds(*preset, all, {}, 2, topology::Policy::kPacked);
  ASSERT_TRUE(want.ok());
  std::vector<std::string> got = DevicesOf(*manager, pod, kPluginGpu);
  std::vector<std::string> want_sorted = *want;
  std::sort(want_sorted.begin(), want_sorted.end());
  EXPECT_EQ(got, want_sorted);
  EXPECT_EQ(manager->GetStats().preferred_ok, 1);
  auto run = manager->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->envs["NVIDIA_VISIBLE_DEVICES"].size(),
            want->at(0).size() + 1 + want->at(1).size());
  std::vector<std::string> paths;
  for (const auto& d : run->devices) paths.push_back(d.container_path);
  for (const char* ctl : {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}) {
    EXPECT_NE(std::find(paths.begin(), paths.end(), ctl), paths.end()) << ctl;
  }
  EXPECT_EQ(paths.size(), 5u);

  kdm.Signal(SIGTERM);
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value()) << "kdm plugin did not exit after SIGTERM";
  EXPECT_EQ(*code, 0) << kdm.Stderr();
  EXPECT_FALSE(fs::exists(socket));
  std::string err = kdm.Stderr();
  EXPECT_NE(err.find("event=registered resource=nvidia.com/gpu kubelet=" + plugin_dir +
                     "/kubelet.sock registrations=1"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("event=preferred_allocation resource=nvidia.com/gpu policy=packed"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("event=stopping resource=nvidia.com/gpu signal=SIGTERM"), std::string::npos)
      << err;
  manager->Stop();
}

TEST(PluginE2ETest, ReRegistersWhenTheKubeletRestartsAndSigintExitsZero) {
  TempSocketDir root;
  const std::string plugin_dir = root.path() + "/device-plugins";
  auto manager = StartManager(plugin_dir);
  ASSERT_TRUE(manager);
  KdmProcess kdm({"plugin", "--plugin-dir", plugin_dir, "--resource", "example.com/fpga", "--count",
                  "4", "--policy", "none"},
                 root.path() + "/plugin.err");
  ASSERT_TRUE(kdm.WaitForLine("ready ").has_value()) << kdm.Stderr();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, "example.com/fpga") == 4; }, kWaitBound))
      << kdm.Stderr();

  // The kubelet restarts: a new Manager on the same directory removes the
  // plugin's socket; the plugin serves and registers again.
  manager->Stop();
  manager.reset();
  manager = StartManager(plugin_dir);
  ASSERT_TRUE(manager);
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, "example.com/fpga") == 4; }, kWaitBound))
      << kdm.Stderr();
  ASSERT_TRUE(WaitUntil([&] { return LoggedRegistrations(kdm.Stderr()) >= 2; }, kWaitBound))
      << kdm.Stderr();
  dm::Pod pod = PodWith("fpga", "example.com/fpga", 2);
  ASSERT_TRUE(manager->Allocate(pod, "main").ok());
  EXPECT_EQ(DevicesOf(*manager, pod, "example.com/fpga"),
            (std::vector<std::string>{"fpga-0", "fpga-1"}));
  EXPECT_EQ(manager->GetStats().preferred_ok, 0);  // policy none: not offered
  auto run = manager->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok());
  EXPECT_EQ(run->envs["FPGA_VISIBLE_DEVICES"], "fpga-0,fpga-1");

  kdm.Signal(SIGINT);
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << kdm.Stderr();
  std::string err = kdm.Stderr();
  EXPECT_NE(err.find("signal=SIGINT"), std::string::npos) << err;
  EXPECT_FALSE(fs::exists(plugin_dir + "/example.com_fpga.sock"));
  manager->Stop();
}

TEST(PluginE2ETest, HealthFileDropsAllocatableAndGarbageKeepsTheLastState) {
  TempSocketDir root;
  const std::string plugin_dir = root.path() + "/device-plugins";
  const std::string health = root.path() + "/health.json";
  auto manager = StartManager(plugin_dir);
  ASSERT_TRUE(manager);
  KdmProcess kdm({"plugin", "--root", root.path(), "--resource", kPluginGpu, "--preset", "hgx-h100",
                  "--health-file", health},
                 root.path() + "/plugin.err");
  ASSERT_TRUE(kdm.WaitForLine("ready ").has_value()) << kdm.Stderr();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, kPluginGpu) == 8; }, kWaitBound))
      << kdm.Stderr();

  {
    std::ofstream(health + ".tmp") << R"({"GPU3": "Unhealthy", "GPU99": "Unhealthy"})";
    fs::rename(health + ".tmp", health);
  }
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, kPluginGpu) == 7; }, kWaitBound))
      << kdm.Stderr();
  EXPECT_EQ(manager->GetCapacity().resources[kPluginGpu].capacity, 8);
  ASSERT_TRUE(WaitUntil(
      [&] {
        return kdm.Stderr().find(
                   "event=health_unknown_devices resource=nvidia.com/gpu ids=GPU99") !=
               std::string::npos;
      },
      kWaitBound))
      << kdm.Stderr();

  std::ofstream(health) << "{\"GPU3\": \"Healthy\", oops";
  ASSERT_TRUE(WaitUntil(
      [&] { return kdm.Stderr().find("event=health_file_rejected") != std::string::npos; },
      kWaitBound))
      << kdm.Stderr();
  EXPECT_EQ(Allocatable(*manager, kPluginGpu), 7);

  {
    std::ofstream(health + ".tmp") << "{}";
    fs::rename(health + ".tmp", health);
  }
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(*manager, kPluginGpu) == 8; }, kWaitBound))
      << kdm.Stderr();
  kdm.Signal(SIGTERM);
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << kdm.Stderr();
  manager->Stop();
}

TEST(PluginE2ETest, CdiPreStartAndSocketNameAgainstTheFakeKubelet) {
  TempSocketDir dir;
  FakeRegistrationServer kubelet(dir.path());
  ASSERT_TRUE(kubelet.Start());
  KdmProcess kdm(
      {"plugin", "--plugin-dir", dir.path(), "--resource", kPluginGpu, "--preset", "dgx-a100",
       "--cdi", "--pre-start", "--socket-name", "gpus.sock", "--policy", "best-set"},
      dir.path() + "/plugin.err");
  ASSERT_TRUE(kdm.WaitForLine("ready ").has_value()) << kdm.Stderr();
  ASSERT_FALSE(kubelet.WaitForSnapshots(1).empty()) << kdm.Stderr();
  // The fake kubelet records the dialed options just after the stream opens.
  ASSERT_TRUE(WaitUntil([&] { return !kubelet.DialedOptions().empty(); }, kWaitBound));
  auto requests = kubelet.Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].endpoint(), "gpus.sock");
  auto options = kubelet.DialedOptions();
  ASSERT_FALSE(options.empty());
  EXPECT_TRUE(options[0].pre_start_required());
  EXPECT_TRUE(options[0].get_preferred_allocation_available());

  auto stub = v1beta1::DevicePlugin::NewStub(
      grpc::CreateChannel("unix:" + dir.path() + "/gpus.sock", grpc::InsecureChannelCredentials()));
  v1beta1::AllocateRequest req;
  req.add_container_requests()->add_devices_ids("GPU2");
  v1beta1::AllocateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ASSERT_TRUE(stub->Allocate(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses(0).cdi_devices_size(), 1);
  EXPECT_EQ(resp.container_responses(0).cdi_devices(0).name(), "nvidia.com/gpu=GPU2");

  v1beta1::PreStartContainerRequest pre;
  pre.add_devices_ids("GPU2");
  v1beta1::PreStartContainerResponse pre_resp;
  grpc::ClientContext pre_ctx;
  pre_ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ASSERT_TRUE(stub->PreStartContainer(&pre_ctx, pre, &pre_resp).ok());
  EXPECT_NE(kdm.Stderr().find("event=pre_start_container resource=nvidia.com/gpu devices=GPU2"),
            std::string::npos)
      << kdm.Stderr();

  v1beta1::AllocateRequest unknown;
  unknown.add_container_requests()->add_devices_ids("GPU-nope");
  grpc::ClientContext unknown_ctx;
  unknown_ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  grpc::Status s = stub->Allocate(&unknown_ctx, unknown, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(s.error_message().find("GPU-nope"), std::string::npos) << s.error_message();

  kdm.Signal(SIGTERM);
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << kdm.Stderr();
  EXPECT_FALSE(fs::exists(dir.path() + "/gpus.sock"));
  kubelet.Stop();
}

struct BadFlagsCase {
  std::string name;
  std::vector<std::string> args;  // after "plugin"; {ROOT} is the temp dir
  int exit_code;
  std::string needle;
};

// Keeps test listings (and ctest's names) readable.
void PrintTo(const BadFlagsCase& c, std::ostream* os) { *os << c.name; }

class PluginBadFlagsTest : public ::testing::TestWithParam<BadFlagsCase> {};

TEST_P(PluginBadFlagsTest, ExitsWithCodeAndClearMessage) {
  TempSocketDir root;
  std::ofstream(root.path() + "/garbage.txt") << "GPU0 GPU1\nGPU0 X what\n{{{";
  std::vector<std::string> args = {"plugin"};
  for (std::string a : GetParam().args) {
    size_t at = a.find("{ROOT}");
    if (at != std::string::npos) a.replace(at, 6, root.path());
    args.push_back(a);
  }
  KdmProcess kdm(args, root.path() + "/plugin.err");
  ASSERT_TRUE(kdm.started());
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value()) << "kdm plugin did not exit";
  std::string err = kdm.Stderr();
  std::string needle = GetParam().needle;
  if (size_t at = needle.find("{ROOT}"); at != std::string::npos) {
    needle.replace(at, 6, root.path());
  }
  EXPECT_EQ(*code, GetParam().exit_code) << err;
  // Errors found by kdm start with "kdm plugin: "; the flag parser's own
  // (a flag without its value) carry its text.
  if (GetParam().name != "CountWithoutValue") {
    EXPECT_NE(err.find("kdm plugin: "), std::string::npos) << err;
  }
  EXPECT_NE(err.find(needle), std::string::npos) << err;
  // Nothing was served.
  EXPECT_FALSE(fs::exists(root.path() + "/device-plugins/nvidia.com_gpu.sock"));
}

const std::string kLong(120, 'r');

INSTANTIATE_TEST_SUITE_P(
    Flags, PluginBadFlagsTest,
    ::testing::Values(
        BadFlagsCase{"NoDeviceSource",
                     {"--root", "{ROOT}", "--resource", kPluginGpu},
                     2,
                     "no device source"},
        BadFlagsCase{
            "TwoSources",
            {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100", "--count", "2"},
            2,
            "more than one device source"},
        BadFlagsCase{"ThreeSources",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--count", "2", "--topology", "{ROOT}/garbage.txt"},
                     2,
                     "more than one device source"},
        BadFlagsCase{"UnknownPreset",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx-9000"},
                     2,
                     "unknown preset \"dgx-9000\" (known: dgx1-p100"},
        BadFlagsCase{
            "MissingTopologyFile",
            {"--root", "{ROOT}", "--resource", kPluginGpu, "--topology", "{ROOT}/nope.json"},
            1,
            "nope.json"},
        BadFlagsCase{
            "GarbageTopologyFile",
            {"--root", "{ROOT}", "--resource", kPluginGpu, "--topology", "{ROOT}/garbage.txt"},
            1,
            "garbage.txt"},
        BadFlagsCase{"BadPolicy",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--policy", "greedy"},
                     2,
                     "unknown policy \"greedy\""},
        BadFlagsCase{"EmptyResource",
                     {"--root", "{ROOT}", "--resource", "", "--preset", "dgx1-v100"},
                     2,
                     "--resource NAME is required"},
        BadFlagsCase{"NoResource",
                     {"--root", "{ROOT}", "--preset", "dgx1-v100"},
                     2,
                     "--resource NAME is required"},
        BadFlagsCase{"ResourceWithoutVendor",
                     {"--root", "{ROOT}", "--resource", "gpu", "--preset", "dgx1-v100"},
                     2,
                     "the ResourceName \"gpu\" is invalid"},
        BadFlagsCase{
            "ResourceInTheKubernetesDomain",
            {"--root", "{ROOT}", "--resource", "kubernetes.io/gpu", "--preset", "dgx1-v100"},
            2,
            "the ResourceName \"kubernetes.io/gpu\" is invalid"},
        BadFlagsCase{
            "RootTooLongForUnixSocket",
            {"--root", "{ROOT}/" + kLong, "--resource", kPluginGpu, "--preset", "dgx1-v100"},
            1,
            "bytes, longer than the 107 bytes a unix socket path allows"},
        BadFlagsCase{"CountNotANumber",
                     {"--root", "{ROOT}", "--resource", "example.com/fpga", "--count", "four"},
                     2,
                     "--count 'four' is not a number"},
        BadFlagsCase{"CountZero",
                     {"--root", "{ROOT}", "--resource", "example.com/fpga", "--count", "0"},
                     2,
                     "--count must be between 1 and 1024, got 0"},
        BadFlagsCase{"NoDirectory",
                     {"--resource", kPluginGpu, "--preset", "dgx1-v100"},
                     2,
                     "give exactly one of --root DIR"},
        BadFlagsCase{"RootAndPluginDir",
                     {"--root", "{ROOT}", "--plugin-dir", "{ROOT}", "--resource", kPluginGpu,
                      "--preset", "dgx1-v100"},
                     2,
                     "give exactly one of --root DIR"},
        BadFlagsCase{"SocketNameWithSlash",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--socket-name", "../evil.sock"},
                     2,
                     "--socket-name '../evil.sock' must be a plain file name"},
        BadFlagsCase{"SocketNameKubelet",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--socket-name", "kubelet.sock"},
                     2,
                     "other than kubelet.sock"},
        BadFlagsCase{"HealthFileInMissingDirectory",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--health-file", "{ROOT}/no/such/dir/health.json"},
                     1,
                     "{ROOT}/no/such/dir"},
        BadFlagsCase{
            "UnknownFlag",
            {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100", "--gpus", "8"},
            2,
            "kdm plugin: unknown flag '--gpus'"},
        BadFlagsCase{"CountWithoutValue",
                     {"--root", "{ROOT}", "--resource", "example.com/fpga", "--count"},
                     2,
                     "--count"},
        BadFlagsCase{
            "PluginDirMissing",
            {"--plugin-dir", "{ROOT}/missing", "--resource", kPluginGpu, "--preset", "dgx1-v100"},
            1,
            "missing"},
        BadFlagsCase{"UnknownFault",
                     {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100",
                      "--fault", "nope"},
                     2,
                     "unknown fault \"nope\" (known: reg-bad-version, reg-bad-resource-name"},
        BadFlagsCase{
            "EmptyFault",
            {"--root", "{ROOT}", "--resource", kPluginGpu, "--preset", "dgx1-v100", "--fault", ""},
            2,
            "unknown fault \"\""}),
    [](const ::testing::TestParamInfo<BadFlagsCase>& info) { return info.param.name; });

// `kdm plugin --fault nope` names every known fault.
TEST(PluginE2ETest, UnknownFaultListsEveryKnownFault) {
  TempSocketDir root;
  KdmProcess kdm({"plugin", "--root", root.path(), "--resource", "example.com/gpu", "--count", "4",
                  "--fault", "nope"},
                 root.path() + "/plugin.err");
  ASSERT_TRUE(kdm.started());
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 2);
  std::string err = kdm.Stderr();
  // The catalogue itself is pinned, name by name, in faulty_plugin_test.cc.
  ASSERT_FALSE(fakes::FaultNames().empty());
  for (const std::string& fault : fakes::FaultNames()) {
    EXPECT_NE(err.find(fault), std::string::npos) << fault << " missing from: " << err;
  }
}

// `kdm plugin --fault pref-wrong-size` starts, logs the fault mode, registers
// with the (fake) kubelet and answers GetPreferredAllocation one id short,
// even with --policy none; SIGTERM still stops it cleanly.
TEST(PluginE2ETest, FaultModeStartsLogsAndBreaksOnlyItsCheck) {
  TempSocketDir dir;
  FakeRegistrationServer kubelet(dir.path());
  ASSERT_TRUE(kubelet.Start());
  KdmProcess kdm({"plugin", "--plugin-dir", dir.path(), "--resource", "example.com/gpu", "--count",
                  "8", "--policy", "none", "--fault", "pref-wrong-size"},
                 dir.path() + "/plugin.err");
  auto ready = kdm.WaitForLine("ready ");
  ASSERT_TRUE(ready.has_value()) << kdm.Stderr();
  EXPECT_NE(ready->find("fault=pref-wrong-size"), std::string::npos) << *ready;
  EXPECT_NE(kdm.Stderr().find("event=fault_mode fault=pref-wrong-size"), std::string::npos)
      << kdm.Stderr();
  ASSERT_FALSE(kubelet.WaitForSnapshots(1).empty()) << kdm.Stderr();
  ASSERT_TRUE(WaitUntil([&] { return !kubelet.DialedOptions().empty(); }, kWaitBound));
  EXPECT_TRUE(kubelet.DialedOptions()[0].get_preferred_allocation_available());
  auto requests = kubelet.Requests();
  ASSERT_FALSE(requests.empty());
  EXPECT_EQ(requests[0].version(), "v1beta1");
  EXPECT_EQ(requests[0].resource_name(), "example.com/gpu");
  EXPECT_EQ(kubelet.WaitForSnapshots(1)[0].devices_size(), 8);

  auto stub = v1beta1::DevicePlugin::NewStub(grpc::CreateChannel(
      "unix:" + dir.path() + "/" + requests[0].endpoint(), grpc::InsecureChannelCredentials()));
  v1beta1::PreferredAllocationRequest req;
  auto* c = req.add_container_requests();
  for (int i = 0; i < 8; ++i) c->add_available_deviceids("gpu-" + std::to_string(i));
  c->set_allocation_size(3);
  v1beta1::PreferredAllocationResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ASSERT_TRUE(stub->GetPreferredAllocation(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.container_responses_size(), 1);
  EXPECT_EQ(resp.container_responses(0).deviceids_size(), 2);
  // Allocate is untouched.
  v1beta1::AllocateRequest alloc;
  alloc.add_container_requests()->add_devices_ids("gpu-1");
  v1beta1::AllocateResponse alloc_resp;
  grpc::ClientContext alloc_ctx;
  alloc_ctx.set_deadline(std::chrono::system_clock::now() + 10s);
  ASSERT_TRUE(stub->Allocate(&alloc_ctx, alloc, &alloc_resp).ok());
  ASSERT_EQ(alloc_resp.container_responses_size(), 1);

  kdm.Signal(SIGTERM);
  auto code = kdm.Wait();
  ASSERT_TRUE(code.has_value());
  EXPECT_EQ(*code, 0) << kdm.Stderr();
  EXPECT_FALSE(fs::exists(dir.path() + "/" + requests[0].endpoint()));
  kubelet.Stop();
}

}  // namespace
}  // namespace kdm
