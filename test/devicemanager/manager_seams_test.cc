// The Manager's seams: what it asks of the OS seam, kdm::Env (boot id, stale sockets, directory
// modes). The registration rules it applies are tested with the wire layer
// (test/pluginapi/api_rules_test.cc); the clocks in test/base/clock_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kdm/base/env.h"
#include "kdm/base/sync.h"
#include "kdm/devicemanager/manager.h"

namespace kdm::devicemanager {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class OsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-os-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void MakeSocket(const std::string& path) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  void MakeFile(const std::string& path, const std::string& text = "") {
    std::ofstream(path) << text;
  }
  std::string dir_;
};

TEST_F(OsTest, ReadBootIdTrimsAndNamesBadFiles) {
  MakeFile(dir_ + "/boot_id", "1f2e3d4c-0000-4000-8000-000000000001\n");
  EXPECT_EQ(*ReadBootIdFile(*Env::Default(), dir_ + "/boot_id"),
            "1f2e3d4c-0000-4000-8000-000000000001");
  MakeFile(dir_ + "/empty", "");
  EXPECT_THAT(ReadBootIdFile(*Env::Default(), dir_ + "/empty").status().message(),
              HasSubstr("is empty"));
  EXPECT_THAT(ReadBootIdFile(*Env::Default(), dir_ + "/missing").status().message(),
              HasSubstr("cannot read boot id from " + dir_ + "/missing"));
  // The real one exists on Linux.
  EXPECT_TRUE(Env::Default()->ReadBootId().ok());
}

TEST_F(OsTest, RemoveSocketsExceptKeepsKubeletSockAndOtherFiles) {
  MakeSocket(dir_ + "/kubelet.sock");
  MakeSocket(dir_ + "/a.sock");
  MakeSocket(dir_ + "/b");
  MakeFile(dir_ + "/kubelet_internal_checkpoint");
  std::filesystem::create_directory(dir_ + "/sub");
  auto removed = RemoveSocketsExcept(*Env::Default(), dir_, "kubelet.sock");
  ASSERT_TRUE(removed.ok());
  std::sort(removed->begin(), removed->end());
  EXPECT_THAT(*removed, ElementsAre("a.sock", "b"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kubelet.sock"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kubelet_internal_checkpoint"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/sub"));
  EXPECT_FALSE(RemoveSocketsExcept(*Env::Default(), dir_ + "/missing", "kubelet.sock").ok());
}

TEST_F(OsTest, TightenDirectoryModeRemovesOnlyExtraBits) {
  std::string d = dir_ + "/open";
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(chmod(d.c_str(), 0777), 0);
  auto was = Env::Default()->TightenDirectoryMode(d, 0750);
  ASSERT_TRUE(was.ok()) << was.status();
  EXPECT_EQ(*was, 0777u);
  struct stat st;
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  // Stricter than asked: left alone.
  ASSERT_EQ(chmod(d.c_str(), 0700), 0);
  EXPECT_EQ(*Env::Default()->TightenDirectoryMode(d, 0750), 0700u);
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(ModeText(0750), "0750");
  EXPECT_FALSE(Env::Default()->TightenDirectoryMode(dir_ + "/missing", 0750).ok());
  MakeFile(dir_ + "/plain");
  EXPECT_FALSE(Env::Default()->TightenDirectoryMode(dir_ + "/plain", 0750).ok());
}

// Options::env is the Manager's one way to the OS: with an in-memory Env, the
// plugin directory, its stale sockets and the boot id are that Env's. Only
// kubelet.sock itself is a real socket (gRPC binds it), in a real directory.
TEST_F(OsTest, ManagerStartGoesThroughOptionsEnv) {
  std::unique_ptr<MemoryEnv> env = NewMemoryEnv();
  const std::string plugins = dir_ + "/plugins";
  ASSERT_TRUE(std::filesystem::create_directory(plugins));
  ASSERT_TRUE(env->CreateDirectories(plugins, 0777).ok());
  ASSERT_TRUE(env->AddSocketForTest(plugins + "/stale.sock").ok());
  MakeSocket(plugins + "/real.sock");
  Manager::Options o;
  o.plugin_dir = plugins;
  o.env = env.get();
  o.clock = std::make_shared<FakeClock>();
  auto manager = Manager::Create(std::move(o));
  ASSERT_TRUE(manager.ok()) << manager.status();
  ASSERT_TRUE((*manager)->Start().ok());
  EXPECT_EQ(env->Stat(plugins + "/stale.sock").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(env->Stat(plugins).value().mode, 0750u);             // tightened in the Env
  EXPECT_TRUE(std::filesystem::exists(plugins + "/real.sock"));  // not the Env's
  (*manager)->Stop();
}

TEST(ManagerOptionsTest, NullEnvIsRefused) {
  Manager::Options o;
  o.plugin_dir = "/tmp/kdm-unused";
  o.env = nullptr;
  EXPECT_EQ(Manager::Create(std::move(o)).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kdm::devicemanager
