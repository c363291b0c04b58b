// kube::ExecCredentialProvider against stand-in plugin scripts written by
// the test: the environment and KUBERNETES_EXEC_INFO a plugin gets, the
// cache until expirationTimestamp, and every way a plugin can fail (issue 30
// item 4).
#include "kdm/kube/exec_credential.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "kdm/base/clock.h"
#include "kdm/test/wait_until.h"

namespace kdm::kube {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

constexpr char kV1[] = "client.authentication.k8s.io/v1";

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class ExecCredentialTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-exec-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    // 2026-01-01T00:00:00Z
    clock_ = std::make_shared<FakeClock>(std::chrono::system_clock::from_time_t(1767225600));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A plugin script: counts its runs in <dir>/runs, then runs `body`.
  std::string Script(const std::string& name, const std::string& body) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << "#!/bin/sh\necho run >> " << dir_ << "/runs\n" << body;
    ::chmod(path.c_str(), 0755);
    return path;
  }
  int Runs() {
    std::string runs = Slurp(dir_ + "/runs");
    return static_cast<int>(std::count(runs.begin(), runs.end(), '\n'));
  }

  // Prints an ExecCredential with `status`.
  static std::string Prints(const std::string& status, const std::string& api = kV1) {
    return "cat <<'JSON'\n{\"apiVersion\":\"" + api +
           "\",\"kind\":\"ExecCredential\",\"status\":" + status + "}\nJSON\n";
  }

  std::unique_ptr<ExecCredentialProvider> Provider(const std::string& command,
                                                   milliseconds timeout = milliseconds(10'000)) {
    ExecCredentialProvider::Options o;
    o.config.who = "user \"u1\" (kubeconfig /k: users[0].user.exec)";
    o.config.command = command;
    o.config.kubeconfig_dir = dir_;
    o.config.api_version = kV1;
    o.config.install_hint = "get it from example.com";
    o.config.exec_info_json = "{\"apiVersion\":\"client.authentication.k8s.io/v1\"}";
    o.config.args = {"one", "two words"};
    o.config.env = {{"KDM_EXEC_TEST", "set by config"}};
    o.timeout = timeout;
    o.clock = clock_;
    return ExecCredentialProvider::Create(std::move(o));
  }

  std::string dir_;
  std::shared_ptr<FakeClock> clock_;
};

TEST_F(ExecCredentialTest, RunsWithArgsEnvAndExecInfoAndCachesUntilExpiry) {
  std::string plugin =
      Script("plugin",
             "printf '%s|%s|%s|%s' \"$1\" \"$2\" \"$KDM_EXEC_TEST\" \"$KUBERNETES_EXEC_INFO\" > " +
                 dir_ + "/seen\n" +
                 Prints("{\"token\":\"tok-1\",\"expirationTimestamp\":\"2026-01-01T00:10:00Z\"}"));
  auto p = Provider("./plugin");  // relative with a '/': against the kubeconfig's directory
  StatusOr<std::string> t = p->Token();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "tok-1");
  EXPECT_EQ(Slurp(dir_ + "/seen"),
            "one|two words|set by config|{\"apiVersion\":\"client.authentication.k8s.io/v1\"}");
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(p->Token().ok());
  EXPECT_EQ(Runs(), 1);
  EXPECT_EQ(p->runs(), 1);
  // A 401 drops the token; a stale token's invalidation does not.
  p->Invalidate("some-older-token");
  ASSERT_TRUE(p->Token().ok());
  EXPECT_EQ(Runs(), 1);
  p->Invalidate("tok-1");
  ASSERT_TRUE(p->Token().ok());
  EXPECT_EQ(Runs(), 2);
  clock_->Advance(std::chrono::minutes(9));
  ASSERT_TRUE(p->Token().ok());
  EXPECT_EQ(Runs(), 2);
  clock_->Advance(std::chrono::minutes(1));  // at the expiry: run again
  ASSERT_TRUE(p->Token().ok());
  EXPECT_EQ(Runs(), 3);
}

TEST_F(ExecCredentialTest, ExpiryInThePastRunsEveryTimeAndNoExpiryIsKept) {
  auto past = Provider(Script(
      "past", Prints("{\"token\":\"t\",\"expirationTimestamp\":\"2025-12-31T23:59:59+00:00\"}")));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(past->Token().ok());
  EXPECT_EQ(past->runs(), 3);
  // An offset: 01:00:30+01:00 is 00:00:30Z, 30 s from now.
  auto soon = Provider(
      Script("soon",
             Prints("{\"token\":\"t\",\"expirationTimestamp\":\"2026-01-01T01:00:30.25+01:00\"}")));
  ASSERT_TRUE(soon->Token().ok());
  ASSERT_TRUE(soon->Token().ok());
  EXPECT_EQ(soon->runs(), 1);
  clock_->Advance(std::chrono::seconds(31));
  ASSERT_TRUE(soon->Token().ok());
  EXPECT_EQ(soon->runs(), 2);
  auto forever = Provider(Script("forever", Prints("{\"token\":\"t\"}")));
  ASSERT_TRUE(forever->Token().ok());
  clock_->Advance(std::chrono::hours(24 * 365));
  ASSERT_TRUE(forever->Token().ok());
  EXPECT_EQ(forever->runs(), 1);
}

TEST_F(ExecCredentialTest, AHangingPluginIsKilledWithItsProcessGroup) {
  // The plugin leaves a child behind that holds stdout open, then hangs.
  std::string plugin =
      Script("hang", "sleep 300 &\necho $! > " + dir_ + "/child\nexec sleep 300\n");
  auto p = Provider(plugin, milliseconds(500));
  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::string> t = p->Token();
  const auto took = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(t.status().message(),
              HasSubstr("exec plugin of user \"u1\" (kubeconfig /k: users[0].user.exec): no "
                        "answer within 500 ms; its process group was killed"));
  EXPECT_LT(took, std::chrono::seconds(5));
  // The child left behind is gone too (or a zombie waiting for init).
  const std::string child = Slurp(dir_ + "/child");
  ASSERT_FALSE(child.empty());
  EXPECT_TRUE(kdm::test::WaitUntil(
      [&] {
        std::string stat = Slurp("/proc/" + std::to_string(std::stoi(child)) + "/stat");
        return stat.empty() || stat.find(") Z") != std::string::npos;
      },
      std::chrono::seconds(5)));
}

TEST_F(ExecCredentialTest, BadOutputsAreOneLineNamingTheUser) {
  struct Case {
    std::string body;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"echo 'not json at all'\n", "stdout is not JSON: \"not json at all\\n\""},
      {"printf '{\"apiVersion\":'\n", "stdout is not JSON"},
      {"true\n", "printed nothing on stdout"},
      {"echo '[1,2]'\n", "stdout is not an ExecCredential object"},
      {Prints("{\"token\":\"t\"}", "client.authentication.k8s.io/v1beta1"),
       "apiVersion \"client.authentication.k8s.io/v1beta1\", expected "
       "\"client.authentication.k8s.io/v1\""},
      {"echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"Pod\"}'\n",
       "kind \"Pod\", expected \"ExecCredential\""},
      {"echo '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\"}'\n",
       "status: missing"},
      {Prints("{}"), "status.token: missing"},
      {Prints("{\"token\":5}"), "status.token: not a string"},
      {Prints("{\"token\":\"\"}"), "status.token: empty"},
      {Prints("{\"token\":\"a\\nb\"}"), "status.token: holds a control character"},
      {Prints("{\"token\":\"t\",\"expirationTimestamp\":\"tomorrow\"}"),
       "status.expirationTimestamp: \"tomorrow\" is not RFC 3339"},
      {Prints("{\"token\":\"t\",\"expirationTimestamp\":7}"),
       "status.expirationTimestamp: not a string"},
      {Prints("{\"clientCertificateData\":\"x\",\"clientKeyData\":\"y\"}"),
       "status.clientCertificateData: a client certificate from a plugin is not supported by kdm"},
      {"echo oops >&2\nexit 1\n", "exited with status 1 (its stderr is above)"},
      {"kill -9 $$\n", "killed by signal 9"},
      {"printf '%0100000d' 0 | tr 0 '[' \n", "stdout is not JSON"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    auto p = Provider(Script("bad" + std::to_string(i), cases[i].body));
    StatusOr<std::string> t = p->Token();
    ASSERT_FALSE(t.ok()) << i;
    EXPECT_EQ(t.status().code(), StatusCode::kUnauthenticated) << i << ": " << t.status();
    EXPECT_THAT(t.status().message(),
                HasSubstr("exec plugin of user \"u1\" (kubeconfig /k: users[0].user.exec): "))
        << i;
    EXPECT_THAT(t.status().message(), HasSubstr(cases[i].message)) << i;
    EXPECT_EQ(t.status().message().find('\n'), std::string::npos) << i;
  }
}

TEST_F(ExecCredentialTest, TenMiBOfOutputIsCutAtOneMiB) {
  auto p = Provider(Script("flood", "head -c 10485760 /dev/zero | tr '\\0' 'x'\n"));
  StatusOr<std::string> t = p->Token();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("printed more than 1048576 bytes on stdout; its process group was killed"));
}

TEST_F(ExecCredentialTest, CommandNotFoundCarriesTheInstallHint) {
  auto p = Provider("kdm-no-such-plugin-anywhere");
  StatusOr<std::string> t = p->Token();
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(t.status().message(),
              HasSubstr("command \"kdm-no-such-plugin-anywhere\" not found in PATH; installHint: "
                        "\"get it from example.com\""));
  p = Provider("../elsewhere/plugin");
  t = p->Token();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(),
              HasSubstr("command \"" + dir_ + "/../elsewhere/plugin\" is not an executable file"));
  // A file that is not executable.
  std::ofstream(dir_ + "/plain") << "#!/bin/sh\n";
  t = Provider(dir_ + "/plain")->Token();
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(t.status().message(), HasSubstr("is not an executable file"));
}

TEST_F(ExecCredentialTest, BarePluginNamesAreFoundInPath) {
  // sh is in every PATH; it runs `-c` with the arguments kdm gives.
  ExecCredentialProvider::Options o;
  o.config.who = "user \"u\"";
  o.config.command = "sh";
  o.config.api_version = kV1;
  o.config.args = {"-c", Prints("{\"token\":\"from-path\"}")};
  auto p = ExecCredentialProvider::Create(std::move(o));
  StatusOr<std::string> t = p->Token();
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(*t, "from-path");
}

TEST(ParseRfc3339Test, AcceptsWhatGoWritesAndRefusesTheRest) {
  EXPECT_EQ(ParseRfc3339("1970-01-01T00:00:00Z"), 0);
  EXPECT_EQ(ParseRfc3339("2026-01-01T00:00:00Z"), 1767225600);
  EXPECT_EQ(ParseRfc3339("2026-01-01T01:00:00+01:00"), 1767225600);
  EXPECT_EQ(ParseRfc3339("2025-12-31T23:00:00.123456789-01:00"), 1767225600);
  for (const char* bad :
       {"", "2026-01-01", "2026-01-01T00:00:00", "2026-13-01T00:00:00Z", "2026-01-01T24:00:00Z",
        "2026-01-01T00:00:00Zjunk", "2026-01-01T00:00:00.Z", "2026-01-01 00:00:00Z",
        "2026-01-01T00:00:00+0100", "x026-01-01T00:00:00Z"}) {
    EXPECT_FALSE(ParseRfc3339(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace kdm::kube
