// RunSubprocess: exit codes, signals, both outputs, the environment, the
// bound on output and on time (a hung child and its grandchildren are
// killed), and a program that does not exist.
#include "kdm/base/subprocess.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>

namespace kdm {
namespace {

using ::testing::HasSubstr;

SubprocessOptions Shell(const std::string& script,
                        std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
  SubprocessOptions o;
  o.argv = {"/bin/sh", "-c", script};
  o.timeout = timeout;
  return o;
}

TEST(SubprocessTest, ExitCodeAndBothOutputsAreKept) {
  StatusOr<SubprocessResult> r = RunSubprocess(Shell("echo out; echo err >&2; exit 3"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->exit_code, 3);
  EXPECT_EQ(r->term_signal, 0);
  EXPECT_FALSE(r->timed_out);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->stdout_text, "out\n");
  EXPECT_EQ(r->stderr_text, "err\n");
  EXPECT_EQ(r->Describe(), "exited 3: err");
}

TEST(SubprocessTest, SuccessIsOk) {
  StatusOr<SubprocessResult> r = RunSubprocess(Shell("true"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->Describe(), "exited 0");
}

TEST(SubprocessTest, ArgumentsAndExtraEnvironmentReachTheChild) {
  SubprocessOptions o = Shell("printf '%s|%s|%s' \"$1\" \"$KDM_SUB_TEST\" \"$HOME\"");
  o.argv.push_back("name");
  o.argv.push_back("first arg");
  o.extra_env["KDM_SUB_TEST"] = "v=1";
  o.extra_env["HOME"] = "/override";
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->stdout_text, "first arg|v=1|/override");
}

TEST(SubprocessTest, ASignalIsReported) {
  StatusOr<SubprocessResult> r = RunSubprocess(Shell("kill -TERM $$"));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->term_signal, SIGTERM);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->Describe(), "killed by signal 15");
}

// The parent blocks SIGTERM (as kdm's commands do): the child still gets
// the default mask and dies of it.
TEST(SubprocessTest, TheChildDoesNotInheritABlockedSignal) {
  sigset_t term, old;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &term, &old);
  StatusOr<SubprocessResult> r = RunSubprocess(Shell("kill -TERM $$; sleep 5"));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->term_signal, SIGTERM);
}

TEST(SubprocessTest, AHungChildAndItsGrandchildrenAreKilledAtTheTimeout) {
  StatusOr<SubprocessResult> r =
      RunSubprocess(Shell("sleep 300 & sleep 300", std::chrono::milliseconds(300)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
  EXPECT_FALSE(r->ok());
  EXPECT_THAT(r->Describe(), HasSubstr("timeout"));
}

TEST(SubprocessTest, AChildThatClosesItsOutputsIsStillBounded) {
  StatusOr<SubprocessResult> r =
      RunSubprocess(Shell("exec >/dev/null 2>&1; sleep 300", std::chrono::milliseconds(300)));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->timed_out);
}

TEST(SubprocessTest, OutputPastTheBoundIsDroppedAndCounted) {
  SubprocessOptions o = Shell("head -c 1000000 /dev/zero; head -c 300000 /dev/zero >&2");
  o.max_output_bytes = 1000;
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok()) << r->Describe();
  EXPECT_EQ(r->stdout_text.size(), 1000u);
  EXPECT_EQ(r->stdout_dropped, 999'000u);
  EXPECT_EQ(r->stderr_text.size(), 1000u);
  EXPECT_EQ(r->stderr_dropped, 299'000u);
}

TEST(SubprocessTest, AMissingProgramIsNotFoundNamingIt) {
  SubprocessOptions o;
  o.argv = {"/nonexistent/kdm-no-such-program"};
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/kdm-no-such-program"));
  o.argv = {"/dev/null"};  // there, not a program
  EXPECT_EQ(RunSubprocess(o).status().code(), StatusCode::kFailedPrecondition);
}

TEST(SubprocessTest, KillPastMaxOutputEndsAChildThatPrintsTooMuch) {
  SubprocessOptions o = Shell("yes; sleep 300");
  o.max_output_bytes = 4096;
  o.kill_past_max_output = true;
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->output_overflow);
  EXPECT_FALSE(r->timed_out);
  EXPECT_FALSE(r->ok());
  EXPECT_EQ(r->stdout_text.size(), 4096u);
  EXPECT_THAT(r->Describe(), HasSubstr("printed more than it may"));
}

TEST(SubprocessTest, InheritedStderrIsNotCaptured) {
  SubprocessOptions o = Shell("echo to-the-parent >&2; echo out");
  o.inherit_stderr = true;
  StatusOr<SubprocessResult> r = RunSubprocess(o);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->ok());
  EXPECT_EQ(r->stdout_text, "out\n");
  EXPECT_EQ(r->stderr_text, "");
}

TEST(SubprocessTest, NoProgramIsInvalid) {
  EXPECT_EQ(RunSubprocess(SubprocessOptions{}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kdm
