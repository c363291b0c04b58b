// Regression test for issue 22 ("relative paths: every path flag works as a
// user types it"): `kdm kubelet --root node` used to exit 1 with "cannot
// serve Registration on node/device-plugins/kubelet.sock", because the path
// was glued to "unix://" and gRPC read "node" as a host name.
//
// The built binaries run from a private working directory (its name holds a
// space) with relative path flags, in the shapes a user types them: plain
// (`node`), `./x`, `x/../y`, and names with spaces, for --root, --plugin-dir,
// --plugin-socket, --topology, --health-file and --junit. kdm kubelet + kdm plugin
// admit a pod, kdm get reads it, kdm plugin + kdm conform pass, and a path
// that cannot work (a socket path longer than sockaddr_un allows, a directory
// that cannot be created) is one line naming the flag, the path and the
// reason, with no gRPC core text. Every wait is a bounded poll on a file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "kdm/test/e2e/e2e_util.h"

namespace kdm {
namespace {

namespace fs = std::filesystem;
using kdm::e2e::InDir;
using kdm::e2e::Process;
using kdm::e2e::ReadFile;
using kdm::e2e::WaitFor;
using kdm::e2e::WriteFileAtomically;
using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kResource[] = "example.com/x";

// Text that only gRPC core prints (its own log lines), never kdm.
void ExpectNoGrpcCoreText(const std::string& text) {
  EXPECT_THAT(text, Not(HasSubstr("No address added"))) << text;
  EXPECT_THAT(text, Not(HasSubstr("chttp2"))) << text;
  EXPECT_THAT(text, Not(HasSubstr("unix://"))) << text;
}

// The line of `text` that starts with `prefix` ("" if none).
std::string LineStartingWith(const std::string& text, const std::string& prefix) {
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, prefix.size(), prefix) == 0) return text.substr(start, end - start);
    start = end + 1;
  }
  return "";
}

class RelativePathsE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-rp-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    tmp_ = tmpl;
    // The working directory of every process; a space in its name too.
    cwd_ = tmp_ + "/work dir";
    fs::create_directories(cwd_);
  }
  void TearDown() override {
    if (HasFailure()) {
      for (const auto& e : fs::directory_iterator(tmp_)) {
        if (e.path().extension() == ".log") {
          std::cerr << "---- " << e.path() << "\n" << ReadFile(e.path()) << "\n";
        }
      }
    }
    plugins_.clear();
    kubelet_.reset();
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }

  // Starts `kdm ARGS...` in cwd_, logging to tmp_/<name>.log.
  std::unique_ptr<Process> Start(const std::string& name, const std::vector<std::string>& args) {
    auto p = std::make_unique<Process>(InDir{cwd_}, args, tmp_ + "/" + name + ".log");
    EXPECT_TRUE(p->started());
    return p;
  }
  // Runs `kdm ARGS...` in cwd_ to completion: its exit code (-1: it hung),
  // stdout and stderr.
  int Run(const std::string& name, const std::vector<std::string>& args, std::string* out,
          std::string* err) {
    Process p(InDir{cwd_}, args, tmp_ + "/" + name + ".out", tmp_ + "/" + name + ".err");
    if (!p.started()) return -1;
    std::optional<int> code = p.Wait();
    *out = p.Out();
    *err = p.Err();
    return code.value_or(-1);
  }

  json ReadJson(const std::string& path) {
    try {
      return json::parse(ReadFile(path));
    } catch (const json::exception&) {
      return json::object();
    }
  }

  std::string tmp_;
  std::string cwd_;
  std::unique_ptr<Process> kubelet_;
  std::vector<std::unique_ptr<Process>> plugins_;
};

TEST_F(RelativePathsE2eTest, KubeletPluginGetAndConformFromAWorkingDirectory) {
  // kdm kubelet --root node: the issue's own command.
  kubelet_ = Start("kubelet", {"kubelet", "--root", "node", "--rpc-timeout", "5s", "-v", "1"});
  const std::string node = cwd_ + "/node";
  ASSERT_TRUE(WaitFor([&] {
    return fs::exists(node + "/status/node.json") || !kubelet_->Running();
  })) << kubelet_->Log();
  ASSERT_TRUE(kubelet_->Running()) << kubelet_->Log();

  // kdm plugin with a --plugin-dir that takes a detour through "..", a
  // relative --topology in a directory with a space, and a relative
  // --health-file with a space in its name.
  std::string out, err;
  ASSERT_EQ(Run("topo", {"topo", "show", "--preset", "dgx1-v100", "--json"}, &out, &err), 0) << err;
  fs::create_directories(cwd_ + "/topo dir");
  std::ofstream(cwd_ + "/topo dir/t.json") << out;
  std::ofstream(cwd_ + "/health x.json") << "{}";
  plugins_.push_back(Start(
      "plugin", {"plugin", "--plugin-dir", "./node/../node/device-plugins", "--resource", kResource,
                 "--topology", "topo dir/../topo dir/t.json", "--health-file", "health x.json"}));
  ASSERT_TRUE(WaitFor([&] {
    json n = ReadJson(node + "/status/node.json");
    return n.contains("allocatable") && n["allocatable"].value(kResource, -1) == 8;
  })) << kubelet_->Log();

  WriteFileAtomically(node + "/manifests/p.yaml",
                      "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers:\n"
                      "  - name: main\n    resources:\n      limits:\n        example.com/x: 1\n");
  json status;
  EXPECT_TRUE(WaitFor([&] {
    status = ReadJson(node + "/status/default_p.json");
    return status.value("phase", "") == "Admitted";
  })) << status.dump()
      << "\n"
      << kubelet_->Log();

  // kdm get --root with "./" in front reads the same agent.
  EXPECT_EQ(Run("get", {"get", "pods", "--root", "./node", "-o", "json"}, &out, &err), 0)
      << out << err;
  EXPECT_THAT(out, HasSubstr("\"p\"")) << out;
  ExpectNoGrpcCoreText(err);

  // kdm conform acts as the kubelet of its own directory (a space in it)
  // toward a second plugin, and writes its JUnit file to a relative path.
  plugins_.push_back(Start(
      "plugin2", {"plugin", "--root", "conform root", "--resource", kResource, "--count", "2"}));
  EXPECT_EQ(Run("conform",
                {"conform", "--root", "conform root", "--resource", kResource, "--timeout", "10s",
                 "--junit", "./reports/../junit.xml"},
                &out, &err),
            0)
      << out << err;
  EXPECT_THAT(out, HasSubstr(" passed, 0 failed, ")) << out;
  EXPECT_THAT(ReadFile(cwd_ + "/junit.xml"), HasSubstr("<testsuite name=\"kdm-conform\""));
  ExpectNoGrpcCoreText(err);

  // kdm conform --plugin-socket dials the first plugin by a relative path.
  std::vector<std::string> socks;
  for (const auto& e : fs::directory_iterator(node + "/device-plugins")) {
    if (e.is_socket() && e.path().filename() != "kubelet.sock")
      socks.push_back(e.path().filename());
  }
  ASSERT_EQ(socks.size(), 1u);
  EXPECT_EQ(Run("conform-dial",
                {"conform", "--plugin-socket", "node/device-plugins/" + socks[0], "--resource",
                 kResource, "--only", "lw.health"},
                &out, &err),
            0)
      << out << err;
  EXPECT_THAT(out, HasSubstr("1 passed, 0 failed, 0 skipped")) << out;
  ExpectNoGrpcCoreText(err);
  kubelet_->Signal(SIGTERM);
  EXPECT_EQ(kubelet_->Wait(), 0) << kubelet_->Log();
}

// A relative path whose absolute form is longer than a unix socket path may
// be (107 bytes): every command says which flag, which path and why, in one
// line, and no gRPC core text reaches the user.
TEST_F(RelativePathsE2eTest, TooLongSocketPathNamesTheFlag) {
  // cwd_ is /tmp/kdm-rp-XXXXXX/work dir (28 bytes); 90 more make any socket
  // under it too long.
  const std::string deep(90, 'd');
  // It exists, so that what fails is the socket path, not a missing root.
  fs::create_directories(cwd_ + "/" + deep);
  struct Case {
    std::string name;
    std::vector<std::string> args;
    std::string prefix;  // "kdm <command>: <flag>: "
    int code;
  };
  std::vector<Case> cases = {
      {"kubelet", {"kubelet", "--root", deep}, "kdm kubelet: --root: ", 1},
      {"plugin-root",
       {"plugin", "--root", deep, "--resource", kResource, "--count", "1"},
       "kdm plugin: --root: ",
       1},
      {"plugin-dir",
       {"plugin", "--plugin-dir", deep, "--resource", kResource, "--count", "1"},
       "kdm plugin: --plugin-dir: ",
       1},
      {"conform-root",
       {"conform", "--root", deep, "--resource", kResource},
       "kdm conform: --root: ",
       3},
      {"conform-socket",
       {"conform", "--plugin-socket", deep + "/p.sock", "--resource", kResource},
       "kdm conform: --plugin-socket: ",
       3},
      {"get", {"get", "pods", "--root", deep}, "kdm get pods: --root: ", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string out, err;
    int code = Run(c.name, c.args, &out, &err);
    EXPECT_EQ(code, c.code) << out << err;
    std::string line = LineStartingWith(err, c.prefix);
    EXPECT_THAT(line, HasSubstr(deep)) << err;
    EXPECT_THAT(line, HasSubstr("longer than the 107 bytes a unix socket path allows")) << err;
    ExpectNoGrpcCoreText(err);
  }
}

// A directory that cannot be created (a regular file is in the way): the
// flag, the path and the reason.
TEST_F(RelativePathsE2eTest, DirectoryThatCannotBeCreatedNamesTheFlag) {
  std::ofstream(cwd_ + "/file") << "not a directory\n";
  struct Case {
    std::string name;
    std::vector<std::string> args;
    std::string prefix;  // "kdm <command>: <flag>: "
    int code;
  };
  std::vector<Case> cases = {
      {"kubelet", {"kubelet", "--root", "file/node"}, "kdm kubelet: --root: ", 1},
      {"plugin",
       {"plugin", "--root", "file/node", "--resource", kResource, "--count", "1"},
       "kdm plugin: --root: ",
       1},
      {"conform",
       {"conform", "--root", "file/node", "--resource", kResource},
       "kdm conform: --root: ",
       3},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string out, err;
    int code = Run(c.name, c.args, &out, &err);
    EXPECT_EQ(code, c.code) << out << err;
    std::string line = LineStartingWith(err, c.prefix);
    EXPECT_THAT(line, HasSubstr("file/node")) << err;
    EXPECT_THAT(line, HasSubstr("Not a directory")) << err;
    ExpectNoGrpcCoreText(err);
  }
}

}  // namespace
}  // namespace kdm
