// The Manager's seams and validators: the fake and real clocks, the OS seam
// (boot id, directory creation, stale sockets, endpoint checks) and the
// registration validators (version, extended resource names).
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

#include "kdm/base/sync.h"
#include "kdm/devicemanager/clock.h"
#include "kdm/devicemanager/os.h"
#include "kdm/devicemanager/registration_server.h"

namespace kdm::devicemanager {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(FakeClockTest, AdvanceRunsDueTimersInOrderOnTheCallingThread) {
  FakeClock clock;
  std::vector<int> order;
  auto t0 = clock.Now();
  clock.ScheduleAfter(std::chrono::seconds(3), [&] { order.push_back(3); });
  clock.ScheduleAfter(std::chrono::seconds(1), [&] {
    order.push_back(1);
    // A timer scheduled by a callback inside the window runs in the same Advance.
    clock.ScheduleAfter(std::chrono::seconds(1), [&] { order.push_back(2); });
  });
  auto late = clock.ScheduleAfter(std::chrono::seconds(10), [&] { order.push_back(10); });
  EXPECT_EQ(clock.PendingTimers(), 3u);
  clock.Advance(std::chrono::milliseconds(999));
  EXPECT_TRUE(order.empty());
  clock.Advance(std::chrono::seconds(3));
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
  EXPECT_EQ(clock.Now() - t0, std::chrono::milliseconds(3999));
  EXPECT_TRUE(clock.Cancel(late));
  EXPECT_FALSE(clock.Cancel(late));
  clock.Advance(std::chrono::hours(1));
  EXPECT_THAT(order, ElementsAre(1, 2, 3));
  EXPECT_EQ(clock.PendingTimers(), 0u);
}

TEST(FakeClockTest, CancelFromInsideItsOwnCallbackDoesNotWait) {
  FakeClock clock;
  Clock::TimerId id = 0;
  bool ran = false;
  id = clock.ScheduleAfter(std::chrono::seconds(1), [&] {
    EXPECT_FALSE(clock.Cancel(id));
    ran = true;
  });
  clock.Advance(std::chrono::seconds(1));
  EXPECT_TRUE(ran);
}

TEST(RealClockTest, RunsATimerOnItsThreadAndCancelsPendingOnes) {
  auto clock = NewRealClock();
  kdm::Notification fired;
  clock->ScheduleAfter(std::chrono::milliseconds(1), [&] { fired.Notify(); });
  auto never = clock->ScheduleAfter(std::chrono::hours(1), [] { ADD_FAILURE() << "ran"; });
  EXPECT_TRUE(fired.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_TRUE(clock->Cancel(never));
  EXPECT_EQ(clock->PendingTimers(), 0u);
}

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
  EXPECT_EQ(*ReadBootId(dir_ + "/boot_id"), "1f2e3d4c-0000-4000-8000-000000000001");
  MakeFile(dir_ + "/empty", "");
  EXPECT_THAT(ReadBootId(dir_ + "/empty").status().message(), HasSubstr("is empty"));
  EXPECT_THAT(ReadBootId(dir_ + "/missing").status().message(),
              HasSubstr("cannot read boot id from " + dir_ + "/missing"));
  // The real one exists on Linux.
  EXPECT_TRUE(ReadBootId().ok());
}

TEST_F(OsTest, EnsureDirectoryCreatesParentsWithTheMode) {
  std::string d = dir_ + "/a/b/c";
  ASSERT_TRUE(EnsureDirectory(d, 0750).ok());
  struct stat st;
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_TRUE(EnsureDirectory(d, 0750).ok());  // existing: fine
  MakeFile(dir_ + "/file");
  EXPECT_THAT(EnsureDirectory(dir_ + "/file", 0750).message(), HasSubstr("is not a directory"));
  EXPECT_EQ(EnsureDirectory("", 0750).code(), StatusCode::kInvalidArgument);
}

TEST_F(OsTest, RemoveSocketsExceptKeepsKubeletSockAndOtherFiles) {
  MakeSocket(dir_ + "/kubelet.sock");
  MakeSocket(dir_ + "/a.sock");
  MakeSocket(dir_ + "/b");
  MakeFile(dir_ + "/kubelet_internal_checkpoint");
  std::filesystem::create_directory(dir_ + "/sub");
  auto removed = RemoveSocketsExcept(dir_, "kubelet.sock");
  ASSERT_TRUE(removed.ok());
  std::sort(removed->begin(), removed->end());
  EXPECT_THAT(*removed, ElementsAre("a.sock", "b"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kubelet.sock"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kubelet_internal_checkpoint"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/sub"));
  EXPECT_FALSE(RemoveSocketsExcept(dir_ + "/missing", "kubelet.sock").ok());
}

TEST_F(OsTest, CheckPluginEndpointAcceptsOnlyPlainSocketsInside) {
  MakeSocket(dir_ + "/ok.sock");
  MakeFile(dir_ + "/file.sock");
  ASSERT_EQ(symlink((dir_ + "/ok.sock").c_str(), (dir_ + "/alias.sock").c_str()), 0);
  ASSERT_EQ(symlink("/etc/passwd", (dir_ + "/out.sock").c_str()), 0);
  ASSERT_EQ(symlink((dir_ + "/gone").c_str(), (dir_ + "/dangling.sock").c_str()), 0);
  ASSERT_EQ(mkfifo((dir_ + "/fifo.sock").c_str(), 0600), 0);
  std::filesystem::create_directory(dir_ + "/sub");
  EXPECT_EQ(*CheckPluginEndpoint(dir_, "ok.sock"), dir_ + "/ok.sock");
  EXPECT_EQ(*CheckPluginEndpoint(dir_ + "/", "ok.sock"), dir_ + "/ok.sock");
  // Longest name whose path still fits a sun_path (107 bytes).
  std::string fits(107 - dir_.size() - 1, 'f');
  MakeSocket(dir_ + "/" + fits);
  EXPECT_TRUE(CheckPluginEndpoint(dir_, fits).ok());
  struct Bad {
    std::string endpoint;
    std::string message;
    std::string shown;  // how the message names the endpoint; "" = endpoint
  };
  for (const Bad& b : std::vector<Bad>{
           {"", "the socket file name is empty", ""},
           {std::string("ok.sock\0x", 9), "contains a NUL byte", "ok.sock\\0x"},
           {"a/b", "without '/'", ""},
           {"/abs.sock", "without '/'", ""},
           {"..", "must not contain \"..\"", ""},
           {"x..y", "must not contain \"..\"", ""},
           {".", "must name a file", ""},
           {fits + "x", "is 108 bytes, longer than the 107 bytes a unix socket path allows",
            fits.substr(0, 64) + "..."},
           {std::string(256, 'n'), "256 bytes, longer than 255", std::string(64, 'n') + "..."},
           {"file.sock", "not a unix socket but a regular file", ""},
           {"sub", "not a unix socket but a directory", ""},
           {"fifo.sock", "not a unix socket but a FIFO", ""},
           {"alias.sock", "is a symlink", ""},
           {"out.sock", "is a symlink", ""},
           {"dangling.sock", "is a symlink", ""},
           {"missing.sock", "no such file in " + dir_, ""},
       }) {
    SCOPED_TRACE(b.endpoint);
    auto r = CheckPluginEndpoint(dir_, b.endpoint);
    ASSERT_FALSE(r.ok());
    const std::string shown = b.shown.empty() ? b.endpoint : b.shown;
    EXPECT_THAT(r.status().message(), HasSubstr("invalid endpoint \"" + shown + "\""));
    EXPECT_THAT(r.status().message(), HasSubstr(b.message));
  }
}

TEST_F(OsTest, TightenDirectoryModeRemovesOnlyExtraBits) {
  std::string d = dir_ + "/open";
  ASSERT_EQ(mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(chmod(d.c_str(), 0777), 0);
  auto was = TightenDirectoryMode(d, 0750);
  ASSERT_TRUE(was.ok()) << was.status();
  EXPECT_EQ(*was, 0777u);
  struct stat st;
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0750u);
  // Stricter than asked: left alone.
  ASSERT_EQ(chmod(d.c_str(), 0700), 0);
  EXPECT_EQ(*TightenDirectoryMode(d, 0750), 0700u);
  ASSERT_EQ(stat(d.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_EQ(ModeText(0750), "0750");
  EXPECT_FALSE(TightenDirectoryMode(dir_ + "/missing", 0750).ok());
  MakeFile(dir_ + "/plain");
  EXPECT_FALSE(TightenDirectoryMode(dir_ + "/plain", 0750).ok());
}

TEST(JoinPathTest, ExactlyOneSlash) {
  EXPECT_EQ(JoinPath("/a", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/a/", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/a//", "b"), "/a/b");
  EXPECT_EQ(JoinPath("/", "b"), "/b");
}

TEST(RegistrationValidationTest, VersionText) {
  EXPECT_TRUE(ValidateVersion("v1beta1").ok());
  Status s = ValidateVersion("v1");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "requested API version \"v1\" is not supported by kubelet. Supported version is "
            "\"v1beta1\"");
}

TEST(RegistrationValidationTest, ExtendedResourceNames) {
  for (std::string ok : std::vector<std::string>{"vendor.com/gpu", "nvidia.com/gpu", "a/b", "x.y.z/A_b-c.D",
                         "example.com/" + std::string(63, 'g'),
                         std::string(253, 'v') + "/gpu"}) {
    EXPECT_TRUE(IsExtendedResourceName(ok)) << ok;
  }
  for (std::string bad : std::vector<std::string>{"", "gpu", "/gpu", "vendor.com/", "kubernetes.io/gpu", "x.kubernetes.io/gpu",
        "requests.vendor.com/gpu", "Vendor.com/gpu", "vendor.com/-gpu", "vendor.com/gpu.",
        "vendor.com/a/b", "vendor..com/gpu", "vendor.com./gpu", "-v.com/gpu", "v_x.com/gpu",
        "vendor.com/g pu", "example.com/" + std::string(64, 'g'),
        std::string(254, 'v') + "/gpu"}) {
    EXPECT_FALSE(IsExtendedResourceName(bad)) << bad;
    EXPECT_EQ(ValidateResourceName(bad).message(), "the ResourceName \"" + bad + "\" is invalid");
  }
}

}  // namespace
}  // namespace kdm::devicemanager
