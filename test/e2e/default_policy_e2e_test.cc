// Default policies agree (issue 30 item 9): every kdm command that takes a
// policy, run without --policy, says it uses topology::kDefaultPolicy,
// packed. Before, `kdm plugin` allocated with packed while `kdm extender`
// ranked with best-set, so a scheduler and a node left at their defaults
// disagreed on what "best" is. (The extender's assumption for a node that
// publishes no policy is the same constant:
// AssumptionsTest.WithoutAPublishedPolicyTheKdmPluginsDefaultPackedIsAssumed.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <filesystem>
#include <regex>
#include <string>

#include "kdm/test/e2e/e2e_util.h"
#include "kdm/topology/allocator.h"

namespace kdm {
namespace {

using e2e::kWaitBound;
using e2e::Process;
using e2e::WaitUntil;
using ::testing::HasSubstr;

class DefaultPolicyE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-policy-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The first capture of `re` in the output of a process started with
  // `args`, once it appears; the process is then stopped.
  std::string Said(const std::vector<std::string>& args, const std::string& re) {
    const std::string log = dir_ + "/" + args[0] + ".log";
    Process p(args, log);
    std::smatch m;
    std::string text;
    const bool seen = WaitUntil(
        [&] {
          text = p.Log();
          return std::regex_search(text, m, std::regex(re)) || !p.Running();
        },
        kWaitBound);
    if (p.Running()) p.Signal(SIGTERM);
    p.Wait();
    text = p.Log();
    if (!seen || !std::regex_search(text, m, std::regex(re))) {
      ADD_FAILURE() << "kdm " << args[0] << " never said /" << re << "/:\n" << text;
      return "";
    }
    return m[1].str();
  }

  std::string dir_;
};

TEST_F(DefaultPolicyE2eTest, EveryCommandDefaultsToTheOnePolicy) {
  const std::string expected{topology::PolicyName(topology::kDefaultPolicy)};
  EXPECT_EQ(expected, "packed");

  // kdm topo: "request: 2 devices, policy P, ...".
  EXPECT_EQ(Said({"topo", "--preset", "dgx1-v100", "--size", "2"}, "policy ([a-z-]+),"), expected);
  // kdm plugin: "event=serving ... policy=P" (it answers GetPreferredAllocation so).
  EXPECT_EQ(Said({"plugin", "--root", dir_ + "/node", "--resource", "nvidia.com/gpu", "--preset",
                  "dgx1-v100"},
                 "event=serving [^\n]* policy=([a-z-]+)"),
            expected);
  // kdm extender: "listening on HOST:PORT policy P" (its ranking).
  EXPECT_EQ(Said({"extender", "--listen", "127.0.0.1:0"}, "listening on [^ ]+ policy ([a-z-]+)"),
            expected);
}

// The help of each says the same default.
TEST_F(DefaultPolicyE2eTest, EachCommandsHelpNamesTheDefault) {
  const std::string expected{topology::PolicyName(topology::kDefaultPolicy)};
  for (const char* command : {"topo", "plugin", "extender"}) {
    SCOPED_TRACE(command);
    Process p({command, "--help"}, dir_ + "/" + command + "-help.log");
    ASSERT_EQ(p.Wait(), 0);
    std::smatch m;
    const std::string help = p.Log();
    ASSERT_TRUE(std::regex_search(help, m, std::regex("--policy[^\n]*(\n {10,}[^\n]*)*"))) << help;
    // "; default packed" in the text, or CLI11's "=packed" after the type.
    EXPECT_THAT(m[0].str(),
                ::testing::AnyOf(HasSubstr("default " + expected), HasSubstr("=" + expected + " ")))
        << help;
  }
}

}  // namespace
}  // namespace kdm
