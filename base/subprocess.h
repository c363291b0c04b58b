// kdm::RunSubprocess: runs one outside command to its end, bounded in time
// and in the output kept, for the few places kdm runs a command a user
// named (`kdm conform --health-trigger`, a kubeconfig's exec credential
// plugin).
//
// The child gets /dev/null as stdin, pipes as stdout and stderr (read
// concurrently, so a child that writes much to both never blocks on a full
// pipe), the parent's environment plus `extra_env` (which wins), and a
// process group of its own: when `timeout` passes, the whole group is
// killed (SIGKILL), so a shell's grandchildren go too. Output past
// `max_output_bytes` (per stream) is read and dropped, and counted (or,
// with kill_past_max_output, ends it).
//
// Errors: INVALID_ARGUMENT for an empty argv; NOT_FOUND naming a program
// that is not there; FAILED_PRECONDITION for one that cannot be executed;
// INTERNAL when no pipe can be made. What the child did (an exit status, a
// signal, running past its timeout) is a result, not an error.
//
// Thread-safety: safe from any thread; each call owns its child and waits
// for it (a child is never left behind, even on timeout).
//
// Example:
//   SubprocessOptions o;
//   o.argv = {"/bin/sh", "-c", "echo hi"};
//   o.timeout = std::chrono::seconds(5);
//   KDM_ASSIGN_OR_RETURN(SubprocessResult r, RunSubprocess(o));
//   if (!r.ok()) return InternalError(r.Describe());
#ifndef KDM_BASE_SUBPROCESS_H_
#define KDM_BASE_SUBPROCESS_H_

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "kdm/base/status.h"

namespace kdm {

struct SubprocessOptions {
  // The program (argv[0], looked up in PATH when it holds no '/') and its
  // arguments. Required.
  std::vector<std::string> argv;
  // Set in the child's environment on top of the parent's.
  std::map<std::string, std::string> extra_env;
  // How long the child may run before its process group is killed.
  std::chrono::milliseconds timeout{10'000};
  // The most of stdout and of stderr kept each.
  size_t max_output_bytes = 64 << 10;
  // Stdout past max_output_bytes kills the process group (output_overflow)
  // instead of being dropped: for output that is useless cut.
  bool kill_past_max_output = false;
  // The child writes to the parent's stderr (a user sees it as it comes)
  // instead of a pipe; stderr_text stays empty.
  bool inherit_stderr = false;
};

struct SubprocessResult {
  // The exit status when it exited; -1 when a signal ended it.
  int exit_code = -1;
  // The signal that ended it (0 when it exited).
  int term_signal = 0;
  // True when it ran past the timeout and was killed.
  bool timed_out = false;
  std::string stdout_text;
  std::string stderr_text;
  // Bytes read past max_output_bytes and dropped, per stream.
  size_t stdout_dropped = 0;
  size_t stderr_dropped = 0;
  // True when kill_past_max_output killed it.
  bool output_overflow = false;

  // Exited 0 in time.
  bool ok() const { return !timed_out && !output_overflow && term_signal == 0 && exit_code == 0; }
  // "exited 0", "exited 3", "killed by signal 9", "ran past its 2s timeout
  // and was killed", followed by ": <last line of stderr>" when stderr has one.
  std::string Describe() const;
};

StatusOr<SubprocessResult> RunSubprocess(const SubprocessOptions& options);

}  // namespace kdm

#endif  // KDM_BASE_SUBPROCESS_H_
