// One CLI dialect (issue 30, item 7 and KDM_<FLAG>): the built kdm binary,
// table-driven over every subcommand where the rule is "every command":
// durations, -v, KDM_* variables, `kdm --dry-run`, unknown flags with a
// "did you mean"; and `kdm help`, `kdm --version`, a bare --metrics-addr
// port, a --topology resource the node does not have.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "e2e_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace kdm {
namespace {

namespace fs = std::filesystem;
using ::kdm::e2e::KdmBinary;
using ::kdm::e2e::kWaitBound;
using ::kdm::e2e::Process;
using ::kdm::e2e::ReadFile;
using ::kdm::e2e::WaitUntil;
using ::testing::HasSubstr;
using ::testing::Not;

struct Ran {
  int exit_code = -1;
  std::string out, err;
};

// Runs kdm with `args` and the test's environment plus `env` (NAME=VALUE),
// without any KDM_* variable of the test's own; waits for it (bounded by
// the test's timeout: every command here ends at once).
Ran RunKdmWithEnv(const std::vector<std::string>& args, const std::vector<std::string>& env,
                  const std::string& scratch) {
  std::vector<std::string> all = {KdmBinary()};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "KDM_", 4) != 0 || std::strncmp(*e, "KDM_BINARY_DIR=", 15) == 0) {
      env_text.push_back(*e);
    }
  }
  env_text.insert(env_text.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string out = scratch + "/stdout", err = scratch + "/stderr";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  Ran r;
  if (rc != 0) {
    r.err = "cannot run " + all[0] + ": " + std::strerror(rc);
    return r;
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  return r;
}

size_t LineCount(const std::string& text) {
  size_t n = 0;
  for (char c : text) n += c == '\n';
  return n + (!text.empty() && text.back() != '\n');
}

// One valid command line of each subcommand, for `kdm --dry-run`. {R} is a
// directory that does not exist: a dry run must not create it.
struct CommandLine {
  std::string name;  // for messages
  std::vector<std::string> args;
};

std::vector<CommandLine> EveryCommand() {
  return {
      {"version", {"version"}},
      {"topo", {"topo", "--preset", "dgx1-v100", "--size", "2"}},
      {"topo nvml", {"topo", "--nvml", "--nvml-library", "{R}/libnvidia-ml.so.1"}},
      {"topo presets", {"topo", "presets"}},
      {"topo show", {"topo", "show", "--topology", "{R}/topo.txt"}},
      {"checkpoint show", {"checkpoint", "show", "--root", "{R}"}},
      {"checkpoint export", {"checkpoint", "export", "--root", "{R}", "{R}/out.json"}},
      {"checkpoint import", {"checkpoint", "import", "--root", "{R}", "{R}/in.json"}},
      {"get pods", {"get", "pods", "--root", "{R}"}},
      {"get pod", {"get", "pod", "p", "--root", "{R}"}},
      {"get devices", {"get", "devices", "--root", "{R}"}},
      {"get capacity", {"get", "capacity", "--root", "{R}"}},
      {"plugin", {"plugin", "--root", "{R}", "--resource", "example.com/gpu", "--count", "2"}},
      {"plugin nvml", {"plugin", "--root", "{R}", "--nvml", "--nvml-library", "{R}/nvml.so"}},
      {"kubelet",
       {"kubelet", "--root", "{R}", "--metrics-addr", "127.0.0.1:0", "--checkpoint",
        "kubelet-json"}},
      {"kubelet --publish",
       {"kubelet", "--root", "{R}", "--publish", "--node-name", "n1", "--kubeconfig",
        "{R}/kubeconfig", "--topology", "nvidia.com/gpu={R}/topo.txt"}},
      {"conform", {"conform", "--root", "{R}", "--resource", "example.com/gpu"}},
      {"publish",
       {"publish", "--node-name", "n1", "--pod-resources-socket", "{R}/pr.sock", "--kubeconfig",
        "{R}/kubeconfig", "--topology", "nvidia.com/gpu=nvml"}},
      {"extender",
       {"extender", "--listen", "127.0.0.1:0", "--tls-cert", "{R}/c.pem", "--tls-key", "{R}/k.pem",
        "--kubeconfig", "{R}/kubeconfig"}},
  };
}

class CliE2eTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-cli-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    missing_ = dir_ + "/never";
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::vector<std::string> Expand(std::vector<std::string> args) const {
    for (std::string& a : args) {
      for (size_t at; (at = a.find("{R}")) != std::string::npos;) a.replace(at, 3, missing_);
    }
    return args;
  }
  Ran Kdm(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
    return RunKdmWithEnv(Expand(args), env, dir_);
  }
  Ran DryRun(std::vector<std::string> args, const std::vector<std::string>& env = {}) {
    args.insert(args.begin(), "--dry-run");
    return Kdm(args, env);
  }

  std::string dir_;
  std::string missing_;  // never created: a dry run touches nothing
};

// ------------------------------------------------------------------ dry run

TEST_F(CliE2eTest, DryRunOfEveryCommandExitsZeroSilentlyAndTouchesNothing) {
  for (const CommandLine& c : EveryCommand()) {
    Ran r = DryRun(c.args);
    EXPECT_EQ(r.exit_code, 0) << c.name << ": " << r.err;
    EXPECT_EQ(r.out, "") << c.name;
    EXPECT_EQ(r.err, "") << c.name;
    // Not the root, the plugin directory, a socket nor a lock file.
    EXPECT_FALSE(fs::exists(missing_)) << c.name << " created " << missing_;
  }
}

TEST_F(CliE2eTest, DryRunRefusesABadFlagWithTheErrorAndExitOfARealRun) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"topo", "--preset", "dgx-9000", "--size", "2"}, "dgx-9000"},
      {{"checkpoint", "show", "--root", "{R}", "--checkpoint", "xml"}, "--checkpoint"},
      {{"get", "pods", "--root", "{R}", "-o", "yaml"}, "-o must be table, wide or json"},
      {{"plugin", "--root", "{R}", "--resource", "example.com/gpu", "--count", "0"},
       "--count must be between 1 and"},
      {{"plugin", "--root", "{R}", "--resource", "example.com/gpu"}, "no device source"},
      {{"kubelet", "--root", "{R}", "--restrict", "nvidia.com/gpu"}, "--restrict"},
      {{"kubelet", "--root", "{R}", "--interval", "2s"}, "need --publish"},
      {{"conform", "--resource", "example.com/gpu"}, "give exactly one of --root"},
      {{"publish", "--node-name", "N1", "--pod-resources-socket", "{R}/s", "--in-cluster"},
       "--node-name"},
      {{"publish", "--node-name", "n1", "--pod-resources-socket", "{R}/s", "--in-cluster", "--ids",
        "nvidia.com/gpu={R}/ids.csv"},
       "no --topology for this resource"},
      {{"extender", "--listen", "127.0.0.1:0", "--threads", "0"}, "--threads"},
      {{"extender", "--listen", "127.0.0.1:0", "--tls-cert", "{R}/c.pem"}, "give both"},
  };
  for (const Case& c : cases) {
    Ran dry = DryRun(c.args);
    Ran real = Kdm(c.args);
    EXPECT_EQ(dry.exit_code, 2) << c.message << ": " << dry.err;
    EXPECT_EQ(real.exit_code, 2) << c.message << ": " << real.err;
    EXPECT_THAT(dry.err, HasSubstr(c.message));
    EXPECT_EQ(dry.err, real.err);
    EXPECT_EQ(dry.out, "");
    EXPECT_FALSE(fs::exists(missing_)) << c.message;
  }
}

// -------------------------------------------------------------- durations

TEST_F(CliE2eTest, EveryDurationFlagTakesGoDurationsAndRefusesABareNumberWithAHint) {
  struct Case {
    std::vector<std::string> command;
    std::string flag;
  };
  const std::vector<std::string> publish = {
      "publish", "--node-name", "n1", "--pod-resources-socket", "{R}/s", "--in-cluster"};
  const std::vector<std::string> kubelet_publish = {
      "kubelet", "--root", "{R}", "--publish", "--node-name", "n1", "--in-cluster"};
  const std::vector<std::string> extender = {"extender", "--listen", "127.0.0.1:0"};
  const std::vector<std::string> plugin_nvml = {"plugin", "--root", "{R}", "--nvml"};
  const std::vector<Case> cases = {
      {{"kubelet", "--root", "{R}"}, "--grace"},
      {{"kubelet", "--root", "{R}"}, "--rpc-timeout"},
      {{"kubelet", "--root", "{R}"}, "--pre-start-timeout"},
      {{"kubelet", "--root", "{R}"}, "--registration-grace"},
      {kubelet_publish, "--interval"},
      {kubelet_publish, "--min-write-interval"},
      {kubelet_publish, "--resync"},
      {kubelet_publish, "--timeout"},
      {publish, "--interval"},
      {publish, "--min-write-interval"},
      {publish, "--resync"},
      {publish, "--timeout"},
      {{"get", "pods", "--root", "{R}"}, "--timeout"},
      {{"get", "devices", "--root", "{R}"}, "--timeout"},
      {{"conform", "--root", "{R}", "--resource", "example.com/gpu"}, "--timeout"},
      {extender, "--request-budget"},
      {extender, "--assume-timeout"},
      {extender, "--bind-wait"},
      {plugin_nvml, "--health-recovery"},
      {{"topo", "--preset", "dgx1-v100", "--size", "2"}, "--budget"},
  };
  for (const Case& c : cases) {
    const std::string what = c.command[0] + " " + c.flag;
    for (const std::string good : {"1s500ms", "100ms", "2s"}) {
      std::vector<std::string> args = c.command;
      args.insert(args.end(), {c.flag, good});
      Ran r = DryRun(args);
      EXPECT_EQ(r.exit_code, 0) << what << " " << good << ": " << r.err;
    }
    std::vector<std::string> args = c.command;
    args.insert(args.end(), {c.flag, "5"});
    Ran r = DryRun(args);
    EXPECT_EQ(r.exit_code, 2) << what;
    EXPECT_THAT(r.err, HasSubstr(c.flag)) << what;
    EXPECT_THAT(r.err, HasSubstr("a number needs a unit (did you mean 5s?")) << what;
    args.back() = "soon";
    r = DryRun(args);
    EXPECT_EQ(r.exit_code, 2) << what;
    EXPECT_THAT(r.err, HasSubstr("invalid duration \"soon\"")) << what;
  }
}

// `kdm get --timeout` was whole seconds; now a duration, in a real run too.
TEST_F(CliE2eTest, GetTimeoutTakesADurationInARealRun) {
  Ran r = Kdm({"get", "pods", "--root", dir_, "--timeout", "300ms"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("kdm get pods: "));
  r = Kdm({"get", "pods", "--root", dir_, "--timeout", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--timeout must be positive"));
}

// -------------------------------------------------------------------- -v

TEST_F(CliE2eTest, DashVIsTheSameOnEveryCommand) {
  for (const CommandLine& c : EveryCommand()) {
    for (const std::string level : {"0", "1", "2", "9"}) {
      std::vector<std::string> args = c.args;
      args.insert(args.end(), {"-v", level});
      Ran r = DryRun(args);
      EXPECT_EQ(r.exit_code, 0) << c.name << " -v " << level << ": " << r.err;
    }
    Ran env = DryRun(c.args, {"KDM_V=12"});
    EXPECT_EQ(env.exit_code, 2) << c.name << ": KDM_V is -v";
    EXPECT_THAT(env.err, HasSubstr("-v: must be a whole number from 0 to 9")) << c.name;
    EXPECT_EQ(DryRun(c.args, {"KDM_V=2"}).exit_code, 0) << c.name;
    for (const std::string bad : {"10", "-1", "x", "1.5"}) {
      std::vector<std::string> args = c.args;
      args.insert(args.end(), {"-v", bad});
      Ran r = DryRun(args);
      EXPECT_EQ(r.exit_code, 2) << c.name << " -v " << bad;
      EXPECT_THAT(r.err, HasSubstr("-v: must be a whole number from 0 to 9")) << c.name;
      EXPECT_EQ(LineCount(r.err), 1u) << c.name << ": " << r.err;
    }
  }
}

// A real run: -v 1 logs debug lines (level letter D: the agent's
// event=node_status), -v 0 does not.
TEST_F(CliE2eTest, DashVOneLogsDebugLines) {
  auto run = [&](const std::string& name, const std::string& level) {
    const std::string root = dir_ + "/" + name;
    Process kubelet({"kubelet", "--root", root, "-v", level}, dir_ + "/" + name + ".log");
    EXPECT_TRUE(
        WaitUntil([&] { return fs::exists(root + "/device-plugins/kubelet.sock"); }, kWaitBound))
        << kubelet.Log();
    Process plugin({"plugin", "--root", root, "--resource", "example.com/a", "--count", "1"},
                   dir_ + "/" + name + "-plugin.log");
    EXPECT_TRUE(WaitUntil(
        [&] {
          return ReadFile(root + "/status/node.json").find("example.com/a") != std::string::npos;
        },
        kWaitBound))
        << kubelet.Log();
    kubelet.Signal(SIGTERM);
    EXPECT_EQ(kubelet.Wait(), 0) << kubelet.Log();
    return kubelet.Log();
  };
  const std::string debug = run("debug", "1");
  const std::string quiet = run("quiet", "0");
  EXPECT_THAT(debug, HasSubstr("Z D event=node_status resource=example.com/a")) << debug;
  EXPECT_THAT(quiet, Not(HasSubstr("Z D "))) << quiet;
}

// -------------------------------------------------------------- KDM_<FLAG>

TEST_F(CliE2eTest, EveryCommandTakesItsFlagsFromKdmVariables) {
  struct Case {
    std::string name;
    std::vector<std::string> args;  // valid once `env` is set
    std::string env;                // KDM_X=VALUE
    std::string without;            // the error without it
  };
  const std::vector<Case> cases = {
      {"topo", {"topo", "--preset", "dgx1-v100"}, "KDM_SIZE=2", "--size N is required"},
      {"checkpoint", {"checkpoint", "show"}, "KDM_ROOT={R}", "--root is required"},
      {"get", {"get", "pods"}, "KDM_ROOT={R}", "--root is required"},
      {"plugin",
       {"plugin", "--root", "{R}", "--count", "2"},
       "KDM_RESOURCE=example.com/gpu",
       "--resource NAME is required"},
      {"kubelet", {"kubelet"}, "KDM_ROOT={R}", "--root is required"},
      {"conform",
       {"conform", "--root", "{R}"},
       "KDM_RESOURCE=example.com/gpu",
       "--resource NAME is required"},
      {"publish",
       {"publish", "--pod-resources-socket", "{R}/s", "--in-cluster"},
       "KDM_NODE_NAME=n1",
       "--node-name is required"},
      {"extender", {"extender"}, "KDM_LISTEN=127.0.0.1:0", "--listen is required"},
  };
  for (const Case& c : cases) {
    Ran without = DryRun(c.args);
    EXPECT_EQ(without.exit_code, 2) << c.name;
    EXPECT_THAT(without.err, HasSubstr(c.without)) << c.name;
    Ran with = DryRun(c.args, Expand({c.env}));
    EXPECT_EQ(with.exit_code, 0) << c.name << " " << c.env << ": " << with.err;
  }
  EXPECT_FALSE(fs::exists(missing_));
}

TEST_F(CliE2eTest, TheCommandLineWinsOverAKdmVariable) {
  const std::vector<std::string> plugin = {"plugin", "--root", "{R}", "--resource",
                                           "example.com/gpu"};
  Ran from_env = DryRun(plugin, {"KDM_COUNT=0"});
  EXPECT_EQ(from_env.exit_code, 2);
  EXPECT_THAT(from_env.err, HasSubstr("--count must be between 1 and 1024, got 0"));
  std::vector<std::string> args = plugin;
  args.insert(args.end(), {"--count", "3"});
  Ran flag = DryRun(args, {"KDM_COUNT=0"});
  EXPECT_EQ(flag.exit_code, 0) << flag.err;
}

TEST_F(CliE2eTest, BooleanKdmVariablesTakeTrueFalseOneZero) {
  const std::vector<std::string> plugin = {"plugin",     "--root",         "{R}", "--count", "2",
                                           "--resource", "example.com/gpu"};
  for (const std::string yes : {"true", "1", "TRUE"}) {
    Ran r = DryRun(plugin, {"KDM_NVML=" + yes});
    EXPECT_EQ(r.exit_code, 2) << yes;
    EXPECT_THAT(r.err, HasSubstr("--nvml takes its devices from NVML")) << yes;
  }
  for (const std::string no : {"false", "0", ""}) {
    Ran r = DryRun(plugin, {"KDM_NVML=" + no});
    EXPECT_EQ(r.exit_code, 0) << no << ": " << r.err;
  }
  Ran r = DryRun(plugin, {"KDM_NVML=maybe"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("KDM_NVML: 'maybe' is not a boolean (true, false, 1 or 0)"));
  EXPECT_EQ(LineCount(r.err), 1u) << r.err;
}

// A variable is read by the command being run only: KDM_THREADS=many (an
// integer flag of `kdm extender`) does not break `kdm kubelet`.
TEST_F(CliE2eTest, AKdmVariableOfAnotherCommandIsNotRead) {
  Ran r = DryRun({"kubelet", "--root", "{R}"}, {"KDM_THREADS=many", "KDM_SIZE=x"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  Ran extender = DryRun({"extender", "--listen", ":0"}, {"KDM_THREADS=many"});
  EXPECT_EQ(extender.exit_code, 2);
  EXPECT_THAT(extender.err, HasSubstr("--threads")) << extender.err;
}

// A real run reads them too (not only --dry-run): `kdm get` names the root
// that came from KDM_ROOT.
TEST_F(CliE2eTest, ARealRunReadsKdmVariables) {
  Ran r = Kdm({"get", "capacity"}, {"KDM_ROOT=" + missing_});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("root directory " + missing_ + " does not exist"));
}

TEST_F(CliE2eTest, HelpShowsEachFlagsVariable) {
  Ran r = Kdm({"help", "plugin"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("KDM_PLUGIN_DIR"));
  EXPECT_THAT(r.out, HasSubstr("KDM_HEALTH_RECOVERY"));
}

// ------------------------------------------------------ unknown flags, help

TEST_F(CliE2eTest, AnUnknownFlagOfEveryCommandIsOneLineWithADidYouMean) {
  struct Case {
    std::vector<std::string> args;
    std::string line;
  };
  const std::vector<Case> cases = {
      {{"version", "--hepl"}, "kdm version: unknown flag '--hepl' (did you mean '--help'?)"},
      {{"topo", "--preset", "dgx1-v100", "--sise", "2"},
       "kdm topo: unknown flag '--sise' (did you mean '--size'?)"},
      {{"topo", "show", "--topolgy", "x"},
       "kdm topo show: unknown flag '--topolgy' (did you mean '--topology'?)"},
      {{"checkpoint", "show", "--rot", "x"},
       "kdm checkpoint show: unknown flag '--rot' (did you mean '--root'?)"},
      {{"get", "pods", "--root", "x", "--namspace", "y"},
       "kdm get pods: unknown flag '--namspace' (did you mean '--namespace'?)"},
      {{"plugin", "--root", "x", "--resorce=example.com/gpu"},
       "kdm plugin: unknown flag '--resorce' (did you mean '--resource'?)"},
      {{"kubelet", "--root", "x", "--metrics-adr", ":0"},
       "kdm kubelet: unknown flag '--metrics-adr' (did you mean '--metrics-addr'?)"},
      {{"conform", "--plugin-sokcet", "x"},
       "kdm conform: unknown flag '--plugin-sokcet' (did you mean '--plugin-socket'?)"},
      {{"publish", "--node-nme", "n1"},
       "kdm publish: unknown flag '--node-nme' (did you mean '--node-name'?)"},
      {{"extender", "--lisen", ":0"},
       "kdm extender: unknown flag '--lisen' (did you mean '--listen'?)"},
      // The example: an unknown flag and its value; nothing close.
      {{"extender", "--port", "8888"}, "kdm extender: unknown flag '--port'"},
      {{"kubelt", "--root", "x"}, "kdm: unknown command 'kubelt' (did you mean 'kubelet'?)"},
      {{"topo", "shwo"}, "kdm topo: unknown command 'shwo' (did you mean 'show'?)"},
      {{"--rdy-run", "version"}, "kdm: unknown flag '--rdy-run' (did you mean '--dry-run'?)"},
  };
  for (const Case& c : cases) {
    for (bool dry : {false, true}) {
      Ran r = dry ? DryRun(c.args) : Kdm(c.args);
      EXPECT_EQ(r.exit_code, 2) << c.line;
      EXPECT_EQ(r.err, c.line + "\n");
      EXPECT_EQ(r.out, "");
    }
  }
  Ran r = Kdm({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("kdm: unknown command 'frobnicate' (known: help, version, topo"));
  EXPECT_EQ(LineCount(r.err), 1u) << r.err;
  r = Kdm({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("kdm: a command is required ("));
  EXPECT_EQ(LineCount(r.err), 1u) << r.err;
}

TEST_F(CliE2eTest, HelpAndVersionWork) {
  Ran help = Kdm({"help"});
  Ran dash_help = Kdm({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_EQ(help.out, dash_help.out);
  EXPECT_THAT(help.out, HasSubstr("Subcommands:"));
  EXPECT_THAT(help.out, HasSubstr("KDM_<FLAG>"));
  for (const std::vector<std::string>& cmd :
       std::vector<std::vector<std::string>>{{"kubelet"}, {"get", "pods"}, {"topo", "show"}}) {
    std::vector<std::string> help_args = {"help"};
    help_args.insert(help_args.end(), cmd.begin(), cmd.end());
    std::vector<std::string> flag_args = cmd;
    flag_args.push_back("--help");
    Ran a = Kdm(help_args), b = Kdm(flag_args);
    EXPECT_EQ(a.exit_code, 0) << cmd[0];
    EXPECT_EQ(a.out, b.out) << cmd[0];
    EXPECT_THAT(a.out, HasSubstr("-v N")) << cmd[0];
  }
  Ran unknown = Kdm({"help", "kubelt"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_EQ(unknown.err, "kdm: unknown command 'kubelt' (did you mean 'kubelet'?)\n");
  Ran version = Kdm({"version"});
  Ran dash_version = Kdm({"--version"});
  EXPECT_EQ(version.exit_code, 0);
  EXPECT_EQ(dash_version.exit_code, 0);
  EXPECT_THAT(version.out, HasSubstr("kdm "));
  EXPECT_THAT(version.out, HasSubstr("device plugin API: v1beta1"));
  EXPECT_EQ(version.out, dash_version.out);
}

// ------------------------------------------------- listen addresses, topology

TEST_F(CliE2eTest, ABarePortIsAUsageErrorPrintedOnceWithAHint) {
  for (bool dry : {false, true}) {
    std::vector<std::string> args = {"kubelet", "--root", "{R}", "--metrics-addr", "9400"};
    Ran r = dry ? DryRun(args) : Kdm(args);
    EXPECT_EQ(r.exit_code, 2);
    EXPECT_EQ(LineCount(r.err), 2u) << r.err;  // the line and the --help hint
    EXPECT_THAT(r.err, HasSubstr("kdm kubelet: --metrics-addr \"9400\": a bare port; did you "
                                 "mean ':9400'?"));
    EXPECT_FALSE(fs::exists(missing_));
    Ran e = dry ? DryRun({"extender", "--listen", "8888"}) : Kdm({"extender", "--listen", "8888"});
    EXPECT_EQ(e.exit_code, 2);
    EXPECT_EQ(LineCount(e.err), 1u) << e.err;
    EXPECT_THAT(e.err, HasSubstr("kdm extender: --listen \"8888\": a bare port; did you mean "
                                 "':8888'?"));
  }
}

// `kdm publish --dry-run --topology R=...` for a resource the node does not
// have: an error naming it, not an entry with no devices.
TEST_F(CliE2eTest, PublishTopologyForAResourceTheNodeLacksIsAnErrorNamingIt) {
  const std::string root = dir_ + "/node";
  Process kubelet({"kubelet", "--root", root}, dir_ + "/kubelet.log");
  ASSERT_TRUE(kubelet.started());
  const std::string socket = root + "/pod-resources/kubelet.sock";
  ASSERT_TRUE(WaitUntil([&] { return fs::exists(socket); }, kWaitBound)) << kubelet.Log();
  Ran r = Kdm({"publish", "--node-name", "n1", "--pod-resources-socket", socket, "--topology",
               "nvidia.com/gpu=preset:dgx1-v100", "--dry-run"});
  EXPECT_EQ(r.exit_code, 1) << r.out;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err,
            "kdm publish: --topology nvidia.com/gpu: the node has no resource nvidia.com/gpu "
            "(its resources: none; is its device plugin registered?)\n");
}

}  // namespace
}  // namespace kdm
