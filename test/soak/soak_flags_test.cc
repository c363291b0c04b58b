// kdm_soak's own command line: bad input exits 2 with a message naming what
// was wrong, before anything is started.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

namespace kdm::soak {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string BinDir() {
  const char* dir = std::getenv("KDM_BINARY_DIR");
  return std::string(dir && *dir ? dir : KDM_TEST_BINARY_DIR) + "/bin";
}

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

// Runs kdm_soak with `args` (shell words, already quoted where needed).
Result RunSoak(const std::string& args) {
  Result r;
  std::string cmd = BinDir() + "/kdm_soak " + args + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.output.append(buf, n);
  int status = ::pclose(p);
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  return r;
}

std::string Kdm() { return "--kdm " + BinDir() + "/kdm"; }

TEST(SoakFlags, UnknownFlagExits2) {
  Result r = RunSoak(Kdm() + " --seconds 1 --frobnicate");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("unknown argument \"--frobnicate\""));
  EXPECT_THAT(r.output, HasSubstr("usage: kdm_soak"));
}

TEST(SoakFlags, BadSecondsExit2) {
  for (const char* bad : {"-5", "0", "ten", "1.5", "86401", "99999999999999999999", "''"}) {
    Result r = RunSoak(Kdm() + " --seconds " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("--seconds must be a whole number from 1 to 86400")) << bad;
  }
}

TEST(SoakFlags, MissingValueExits2) {
  Result r = RunSoak(Kdm() + " --seconds");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--seconds needs a value"));
}

TEST(SoakFlags, BadSeedExits2) {
  for (const char* bad : {"-1", "x", "18446744073709551616"}) {
    Result r = RunSoak(Kdm() + " --seconds 1 --seed " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad;
    EXPECT_THAT(r.output, HasSubstr("--seed must be a non-negative whole number")) << bad;
  }
}

TEST(SoakFlags, MissingBinaryExits2) {
  Result r = RunSoak("--seconds 1 --kdm /nonexistent/kdm");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--kdm: /nonexistent/kdm is not an executable file"));
  // A directory and a file that is not executable are refused the same way.
  r = RunSoak("--seconds 1 --kdm /tmp");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("is not an executable file"));
}

TEST(SoakFlags, MissingHostilePluginExits2) {
  Result r = RunSoak("--seconds 1 " + Kdm() + " --hostile-plugin /nonexistent/kdm_hostile_plugin");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("--hostile-plugin: /nonexistent/kdm_hostile_plugin is not an "
                                  "executable file"));
}

TEST(SoakFlags, RootThatIsNotFreshExits2) {
  fs::path dir = fs::temp_directory_path() / ("kdm-soak-flags-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "something") << "x";
  Result r = RunSoak(Kdm() + " --seconds 1 --root " + dir.string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("is not empty"));
  r = RunSoak(Kdm() + " --seconds 1 --root " + (dir / "something").string());
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("is not a directory"));
  r = RunSoak(Kdm() + " --seconds 1 --root /tmp/" + std::string(80, 'r'));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.output, HasSubstr("too long for unix socket paths"));
  fs::remove_all(dir);
}

TEST(SoakFlags, HelpExits0) {
  Result r = RunSoak("--help");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--seconds N"));
}

}  // namespace
}  // namespace kdm::soak
