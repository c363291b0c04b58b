// kdm::pluginapi::AbsoluteSocketPath and UnixSocketTarget: relative,
// absolute, `..`, spaces and gRPC's special characters; the 107-byte limit of
// a unix socket path; and a real gRPC server and dial over each shape
// (issue 22: "unix://" + a relative path made gRPC read the first component
// as a host name).
#include "kdm/pluginapi/unix_target.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::pluginapi {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Cwd() { return fs::current_path().string(); }

// A private directory under /tmp, removed at the end of the test.
class UnixTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-ut-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string dir_;
};

TEST_F(UnixTargetTest, AbsolutePathStaysAsIs) {
  EXPECT_EQ(*AbsoluteSocketPath("/var/lib/kubelet/device-plugins/kubelet.sock"),
            "/var/lib/kubelet/device-plugins/kubelet.sock");
  EXPECT_EQ(*UnixSocketTarget("/var/lib/kubelet/device-plugins/kubelet.sock"),
            "unix:/var/lib/kubelet/device-plugins/kubelet.sock");
}

TEST_F(UnixTargetTest, RelativePathIsMadeAbsoluteAgainstTheWorkingDirectory) {
  EXPECT_EQ(*AbsoluteSocketPath("node/device-plugins/kubelet.sock"),
            Cwd() + "/node/device-plugins/kubelet.sock");
  EXPECT_EQ(*AbsoluteSocketPath("./x.sock"), Cwd() + "/x.sock");
  EXPECT_EQ(*UnixSocketTarget("node/kubelet.sock"), "unix:" + Cwd() + "/node/kubelet.sock");
}

TEST_F(UnixTargetTest, DotDotAndDotAreNormalisedLexically) {
  EXPECT_EQ(*AbsoluteSocketPath("/a/b/../c/./d.sock"), "/a/c/d.sock");
  EXPECT_EQ(*AbsoluteSocketPath("/a//b///c.sock"), "/a/b/c.sock");
  EXPECT_EQ(*AbsoluteSocketPath("node/../node/x.sock"), Cwd() + "/node/x.sock");
  EXPECT_EQ(*AbsoluteSocketPath("/../../x.sock"), "/x.sock");
}

TEST_F(UnixTargetTest, SpacesAreKeptAndGrpcSpecialCharactersEscaped) {
  EXPECT_EQ(*AbsoluteSocketPath("/tmp/my dir/a b.sock"), "/tmp/my dir/a b.sock");
  EXPECT_EQ(*UnixSocketTarget("/tmp/my dir/a b.sock"), "unix:/tmp/my dir/a b.sock");
  EXPECT_EQ(*UnixSocketTarget("/tmp/p%41/q?x#y.sock"), "unix:/tmp/p%2541/q%3Fx%23y.sock");
  EXPECT_EQ(*UnixSocketTarget("/tmp/c:d.sock"), "unix:/tmp/c:d.sock");
}

TEST_F(UnixTargetTest, LongestPathFitsAndOneByteMoreIsRefused) {
  const std::string prefix = "/tmp/";
  std::string fits = prefix + std::string(kMaxUnixSocketPathLength - prefix.size(), 'f');
  ASSERT_EQ(fits.size(), 107u);
  EXPECT_EQ(*AbsoluteSocketPath(fits), fits);

  std::string too_long = fits + "x";  // 108 bytes
  StatusOr<std::string> s = AbsoluteSocketPath(too_long);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.status().message(),
            too_long + " is 108 bytes, longer than the 107 bytes a unix socket path allows");
  EXPECT_EQ(UnixSocketTarget(too_long).status(), s.status());
}

TEST_F(UnixTargetTest, RelativePathTooLongOnlyOnceAbsoluteNamesBothForms) {
  // Short as typed, too long once the working directory is in front. Run
  // from the fixture's short directory under /tmp, so that the case holds
  // wherever the test binary is started from.
  const fs::path before = fs::current_path();
  fs::current_path(dir_);
  struct Restore {
    fs::path path;
    ~Restore() { fs::current_path(path); }
  } restore{before};
  ASSERT_LT(Cwd().size(), 100u) << Cwd();
  std::string rel(kMaxUnixSocketPathLength - Cwd().size(), 'r');
  ASSERT_LE(rel.size(), kMaxUnixSocketPathLength);
  StatusOr<std::string> s = AbsoluteSocketPath(rel);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), StartsWith(rel + " (absolute: " + Cwd() + "/" + rel + ") is " +
                                               std::to_string(Cwd().size() + 1 + rel.size()) +
                                               " bytes, longer than the 107"));
}

TEST_F(UnixTargetTest, EmptyNulAndDirectoryPathsAreRefused) {
  EXPECT_EQ(AbsoluteSocketPath("").status(), InvalidArgumentError("the socket path is empty"));
  StatusOr<std::string> nul = AbsoluteSocketPath(std::string("/tmp/a\0b", 8));
  EXPECT_EQ(nul.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(nul.status().message(), HasSubstr("NUL"));
  for (const char* dir : {"/tmp/", "/tmp/x/.", "/tmp/x/..", "/", ".", ".."}) {
    StatusOr<std::string> s = UnixSocketTarget(dir);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << dir;
    EXPECT_THAT(s.status().message(), HasSubstr("names a directory")) << dir;
  }
}

// A real server and a real dial over each shape of path: what gRPC binds is
// the file the path names, and the dial reaches it.
TEST_F(UnixTargetTest, ServerAndDialMeetOnEveryShapeOfPath) {
  fs::create_directories(dir_ + "/a dir");
  // From the working directory (the build tree) to dir_: relative, with "..".
  std::string rel_dir = fs::relative(dir_, fs::current_path()).string();
  ASSERT_THAT(rel_dir, StartsWith(".."));
  struct Case {
    std::string typed;  // as a user types it
    std::string file;   // the file it names
  };
  std::vector<Case> cases = {
      {dir_ + "/plain.sock", dir_ + "/plain.sock"},
      {rel_dir + "/rel.sock", dir_ + "/rel.sock"},
      {"./" + rel_dir + "/a dir/../dot.sock", dir_ + "/dot.sock"},
      {rel_dir + "/a dir/sp ace.sock", dir_ + "/a dir/sp ace.sock"},
      {dir_ + "/p%41?q#r.sock", dir_ + "/p%41?q#r.sock"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.typed);
    StatusOr<std::string> target = UnixSocketTarget(c.typed);
    ASSERT_TRUE(target.ok()) << target.status();
    v1beta1::Registration::Service service;  // unimplemented methods are enough
    grpc::ServerBuilder builder;
    builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    ASSERT_NE(server, nullptr);
    struct stat st;
    ASSERT_EQ(::stat(c.file.c_str(), &st), 0) << "no socket at " << c.file;
    EXPECT_TRUE(S_ISSOCK(st.st_mode));
    auto channel = grpc::CreateChannel(*target, grpc::InsecureChannelCredentials());
    EXPECT_TRUE(
        channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10)));
    server->Shutdown();
    server->Wait();
  }
}

}  // namespace
}  // namespace kdm::pluginapi
