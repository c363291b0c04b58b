// One owner per root and per socket (issue 30 item 1), with real processes:
// a second `kdm kubelet --root R`, a second `kdm plugin` on one socket and
// `kdm conform --root R` beside a live agent each stop at once with one line
// naming the holder's pid and take nothing over; the first owner keeps
// serving; a SIGKILLed owner's lock is free again at once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"
#include "kdm/test/e2e/kubelet_fixture.h"

namespace kdm {
namespace {

using kdm::e2e::Gpus;
using kdm::e2e::kFpga;
using kdm::e2e::kGpu;
using kdm::e2e::KubeletE2eTest;
using kdm::e2e::kWaitBound;
using kdm::e2e::PodYaml;
using kdm::e2e::Process;
using kdm::e2e::WaitUntil;
using kdm::e2e::WriteFileAtomically;
using ::testing::HasSubstr;
using ::testing::Not;

// The inode of `path` (0 when missing): a socket taken over is a new inode.
ino_t LockTestInode(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

// The number of lines in `text`.
size_t LockTestLines(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

class LocksE2eTest : public KubeletE2eTest {
 protected:
  // Runs `kdm args...` to its end; stdout and stderr in files named `name`.
  struct Ran {
    std::optional<int> code;
    std::string out, err;
  };
  Ran RunToEnd(const std::string& name, const std::vector<std::string>& args) {
    Process p(args, root_ + "/" + name + ".out", root_ + "/" + name + ".err");
    Ran r;
    r.code = p.Wait();
    r.out = p.Out();
    r.err = p.Err();
    return r;
  }
  std::string PluginSocket() const { return root_ + "/device-plugins/nvidia.com_gpu.sock"; }
};

// Issue 30 item 1: the second agent on a root exits 1 in one line naming the
// first's pid, and the first keeps kubelet.sock, its pod-resources socket
// and its plugin (a new pod is admitted; `kdm get pods` answers).
TEST_F(LocksE2eTest, SecondAgentOnOneRootExitsAndTheFirstKeepsServing) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  const std::vector<std::string> sockets = {root_ + "/device-plugins/kubelet.sock",
                                            root_ + "/pod-resources/kubelet.sock", PluginSocket()};
  std::vector<ino_t> before;
  for (const auto& s : sockets) before.push_back(LockTestInode(s));
  for (ino_t i : before) ASSERT_NE(i, 0u);

  Ran second = RunToEnd("second", {"kubelet", "--root", root_, "-v", "1"});
  EXPECT_EQ(second.code, 1) << second.err;
  EXPECT_EQ(second.err, "kdm kubelet: --root " + root_ + ": another agent runs on it: " + root_ +
                            "/.kdm-kubelet.lock is held by pid " + std::to_string(kubelet_->pid()) +
                            "\n");
  EXPECT_EQ(second.out, "");

  for (size_t i = 0; i < sockets.size(); ++i) {
    EXPECT_EQ(LockTestInode(sockets[i]), before[i]) << sockets[i] << " was taken over";
  }
  ASSERT_TRUE(kubelet_->Running());
  EXPECT_THAT(kubelet_->Log(), Not(HasSubstr("event=stale_socket_removed")));
  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 2));
  EXPECT_EQ(Gpus(WaitPhase("default_a", "Admitted")).size(), 2u);
  Ran get = RunToEnd("get", {"get", "pods", "--root", root_});
  EXPECT_EQ(get.code, 0) << get.err;
  EXPECT_THAT(get.out, ::testing::ContainsRegex("default +a ")) << get.out;
}

// A second `kdm plugin` with the same socket name exits 1 in one line naming
// the first plugin's pid; the first one's socket is untouched.
TEST_F(LocksE2eTest, SecondPluginOnOneSocketExitsAndTheFirstKeepsItsSocket) {
  StartKubelet();
  Process& first = StartPlugin({"--resource", kFpga, "--count", "2", "--socket-name", "f.sock"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kFpga, 2); }, kWaitBound)) << kubelet_->Log();
  const std::string socket = root_ + "/device-plugins/f.sock";
  const ino_t before = LockTestInode(socket);
  ASSERT_NE(before, 0u);

  Ran second = RunToEnd("second-plugin", {"plugin", "--root", root_, "--resource", kFpga, "--count",
                                          "4", "--socket-name", "f.sock"});
  EXPECT_EQ(second.code, 1) << second.err;
  EXPECT_EQ(second.err, "kdm plugin: socket " + socket + " is in use by another plugin: " + socket +
                            ".lock is held by pid " + std::to_string(first.pid()) + "\n");
  EXPECT_EQ(LockTestInode(socket), before);
  EXPECT_TRUE(first.Running());
  // The agent still has the first plugin's two devices, not the second's four,
  // from one registration.
  EXPECT_TRUE(Allocatable(kFpga, 2));
  const std::string log = kubelet_->Log();
  const std::string registered = "event=plugin_registered resource=\"example.com/fpga\"";
  ASSERT_NE(log.find(registered), std::string::npos) << log;
  EXPECT_EQ(log.find(registered), log.rfind(registered)) << log;
}

// `kdm conform --root R` beside a live agent is a usage error (exit 2) that
// names the agent's pid and --plugin-socket; kubelet.sock stays the agent's
// and the plugin stays registered.
TEST_F(LocksE2eTest, ConformOnALiveAgentsRootRefusesAndPointsToPluginSocket) {
  StartKubelet();
  StartGpuPlugin();
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kGpu, 8); }, kWaitBound)) << kubelet_->Log();
  const std::string kubelet_sock = root_ + "/device-plugins/kubelet.sock";
  const ino_t before = LockTestInode(kubelet_sock);

  Ran conform =
      RunToEnd("conform", {"conform", "--root", root_, "--resource", kGpu, "--timeout", "2s"});
  EXPECT_EQ(conform.code, 2) << conform.err;
  EXPECT_THAT(conform.err, HasSubstr("kdm conform: --root " + root_ + " has a live agent (pid " +
                                     std::to_string(kubelet_->pid()) + " holds " + root_ +
                                     "/.kdm-kubelet.lock); to check a plugin registered with "
                                     "it, use --plugin-socket " +
                                     root_ + "/device-plugins/<the plugin's socket> instead\n"));
  EXPECT_EQ(LockTestLines(conform.err), 2u) << conform.err;  // + the --help hint
  EXPECT_EQ(conform.out, "");
  EXPECT_EQ(LockTestInode(kubelet_sock), before);
  // The way it points to works.
  Ran dial = RunToEnd("conform-dial", {"conform", "--plugin-socket", PluginSocket(), "--resource",
                                       kGpu, "--only", "lw.health"});
  EXPECT_EQ(dial.code, 0) << dial.out << dial.err;
  WriteFileAtomically(Manifests() + "/a.yaml", PodYaml("a", 1));
  EXPECT_EQ(Gpus(WaitPhase("default_a", "Admitted")).size(), 1u);
}

// conform's own kubelet.sock is locked while it runs: an agent (or a second
// conform) on that root refuses naming conform's pid; once conform is
// SIGKILLed the lock is free at once and the agent starts.
TEST_F(LocksE2eTest, ConformHoldsKubeletSockAndAKilledHolderFreesItAtOnce) {
  const std::string r2 = root_ + "/r2";
  Process conform({"conform", "--root", r2, "--resource", kFpga, "--timeout", "30s"},
                  root_ + "/conform.log");
  ASSERT_TRUE(conform.started());
  ASSERT_TRUE(WaitUntil([&] { return LockTestInode(r2 + "/device-plugins/kubelet.sock") != 0; },
                        kWaitBound))
      << conform.Log();
  const std::string held =
      r2 + "/device-plugins/kubelet.sock.lock is held by pid " + std::to_string(conform.pid());

  Ran agent = RunToEnd("agent", {"kubelet", "--root", r2});
  EXPECT_EQ(agent.code, 1) << agent.err;
  EXPECT_EQ(agent.err, "kdm kubelet: --root " + r2 +
                           ": device-plugins/kubelet.sock is in use: " + held + "\n");
  Ran again = RunToEnd("conform2", {"conform", "--root", r2, "--resource", kFpga});
  EXPECT_EQ(again.code, 3) << again.err;
  EXPECT_THAT(again.err, HasSubstr(held));
  EXPECT_TRUE(conform.Running());

  conform.Signal(SIGKILL);
  ASSERT_TRUE(conform.Wait().has_value());
  Process started({"kubelet", "--root", r2}, root_ + "/agent-after.log");
  ASSERT_TRUE(WaitUntil([&] { return LockTestInode(r2 + "/status/node.json") != 0; }, kWaitBound))
      << started.Log();
  EXPECT_TRUE(started.Running()) << started.Log();
}

// A SIGKILLed agent's root is free again at once; the restarted agent keeps
// the live plugin's socket (its lock is held: event=live_socket_kept, not
// stale_socket_removed) and the plugin registers with it again.
TEST_F(LocksE2eTest, SigkilledAgentFreesItsRootAndALivePluginSocketIsKept) {
  StartKubelet();
  Process& plugin = StartPlugin({"--resource", kFpga, "--count", "2", "--socket-name", "f.sock"});
  ASSERT_TRUE(WaitUntil([&] { return Allocatable(kFpga, 2); }, kWaitBound)) << kubelet_->Log();
  const ino_t before = LockTestInode(root_ + "/device-plugins/f.sock");
  kubelet_->Signal(SIGKILL);
  ASSERT_TRUE(kubelet_->Wait().has_value());

  StartKubelet();
  ASSERT_TRUE(WaitUntil(
      [&] {
        return kubelet_->Log().find("event=plugin_registered resource=\"example.com/fpga\"") !=
               std::string::npos;
      },
      kWaitBound))
      << kubelet_->Log();
  EXPECT_THAT(kubelet_->Log(), HasSubstr("event=live_socket_kept dir=" + root_ +
                                         "/device-plugins socket=\"f.sock\" holder_pid=" +
                                         std::to_string(plugin.pid())));
  EXPECT_THAT(kubelet_->Log(), Not(HasSubstr("event=stale_socket_removed")));
  EXPECT_EQ(LockTestInode(root_ + "/device-plugins/f.sock"), before);
}

}  // namespace
}  // namespace kdm
