// The wire layer's rules (pluginapi/api_rules.h): the API version, Kubernetes
// names (DNS-1123 labels and subdomains, qualified names, extended resource
// names), the plugin endpoint, with their exact texts and bad input of every
// kind.
#include "kdm/pluginapi/api_rules.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "kdm/k8s/names.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::pluginapi {
namespace {

using ::testing::HasSubstr;

// A private directory under /tmp with sockets, files and links in it.
class EndpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-rules-XXXXXX";
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

TEST_F(EndpointTest, CheckPluginEndpointAcceptsOnlyPlainSocketsInside) {
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

TEST_F(EndpointTest, CheckPluginEndpointAppliesTheNameRulesFirst) {
  // A name the rules refuse is refused before any lookup, with the same
  // text, whether or not something of that name exists.
  MakeSocket(dir_ + "/x..y");
  for (std::string name : {"x..y", "", "../x"}) {
    auto r = CheckPluginEndpoint(dir_, name);
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.status(), CheckEndpointName(name)) << name;
  }
  // A relative directory is read against the working directory.
  MakeSocket(dir_ + "/ok.sock");
  const std::string cwd = std::filesystem::current_path().string();
  std::filesystem::current_path(dir_);
  auto r = CheckPluginEndpoint(".", "ok.sock");
  std::filesystem::current_path(cwd);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, dir_ + "/ok.sock");
}

TEST(ApiRulesTest, VersionText) {
  EXPECT_TRUE(ValidateVersion("v1beta1").ok());
  Status s = ValidateVersion("v1");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "requested API version \"v1\" is not supported by kubelet. Supported version is "
            "\"v1beta1\"");
}

TEST(ApiRulesTest, VersionRefusesNearMissesAndOddBytes) {
  EXPECT_TRUE(ValidateVersion(kVersion).ok());
  for (std::string bad :
       std::vector<std::string>{"", "v1beta2", "V1BETA1", "v1beta1 ", " v1beta1", "v1beta",
                                "v1beta1\n", std::string("v1beta1\0", 8), std::string(1000, 'v')}) {
    Status s = ValidateVersion(bad);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(s.message(), "requested API version \"" + bad +
                               "\" is not supported by kubelet. Supported version is \"v1beta1\"");
  }
}

TEST(ApiRulesTest, ResourceNameTextQuotesOddBytesAsGiven) {
  // The kubelet's text, with the name exactly as sent (the log quotes it).
  const std::string odd("vendor.com/g\"p\nu\0", 17);
  EXPECT_EQ(ValidateResourceName(odd).message(), "the ResourceName \"" + odd + "\" is invalid");
  EXPECT_EQ(ValidateResourceName(odd).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(ValidateResourceName("vendor.com/gpu").ok());
  // The longest accepted: a 253-character domain and a 63-character name.
  const std::string longest = std::string(253, 'v') + "/" + std::string(63, 'g');
  EXPECT_TRUE(ValidateResourceName(longest).ok());
  EXPECT_FALSE(ValidateResourceName(longest + "g").ok());
}

TEST(ApiRulesTest, EndpointNameRulesNeedNoFilesystem) {
  EXPECT_TRUE(CheckEndpointName("vendor.com_gpu.sock").ok());
  EXPECT_TRUE(CheckEndpointName(std::string(kMaxEndpointNameLength, 'n')).ok());
  // Names that look odd but are plain file names.
  EXPECT_TRUE(CheckEndpointName(".hidden.sock").ok());
  EXPECT_TRUE(CheckEndpointName("with space.sock").ok());
  // Any "..", not only the whole name, as the kubelet side always refused.
  EXPECT_FALSE(CheckEndpointName("...sock").ok());
  struct Bad {
    std::string endpoint;
    std::string message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"", "invalid endpoint \"\": the socket file name is empty"},
           {std::string("\0", 1), "invalid endpoint \"\\0\": contains a NUL byte"},
           {"a/b.sock",
            "invalid endpoint \"a/b.sock\": must be a plain file name inside the "
            "plugin directory, without '/'"},
           {"/", "without '/'"},
           {".", "invalid endpoint \".\": must name a file, not the directory"},
           {"..", "invalid endpoint \"..\": must not contain \"..\""},
           {std::string(kMaxEndpointNameLength + 1, 'n'),
            "invalid endpoint \"" + std::string(64, 'n') +
                "...\": the file name is 256 bytes, longer than 255"},
       }) {
    SCOPED_TRACE(b.endpoint);
    Status s = CheckEndpointName(b.endpoint);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(s.message(), HasSubstr(b.message));
  }
}

TEST(ApiRulesTest, DeviceIdLengthIsTheApisDocumentedOne) {
  // Kubernetes' api.proto: "Max length of this field is 63 characters".
  EXPECT_EQ(kMaxDeviceIdLength, 63u);
}

}  // namespace
}  // namespace kdm::pluginapi
