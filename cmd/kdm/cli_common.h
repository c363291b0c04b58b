// Small pieces every kdm subcommand shares: the stderr log format, the text
// of an unknown-arguments usage error, and path flags.
//
// Path flags (--root, --plugin-dir, --plugin-socket, --topology,
// --health-file, --junit, ...) accept what a user types: relative paths,
// `./x`, `a/../b`, names with spaces. Each command makes them absolute once,
// while parsing (against the working directory then; kdm never changes it),
// and an error about a path that cannot work names the flag:
//   "--root: cannot create directory /home/me/file/node: Not a directory"
#ifndef KDM_CMD_KDM_CLI_COMMON_H_
#define KDM_CMD_KDM_CLI_COMMON_H_

#include <spdlog/spdlog.h>

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/http/listen_address.h"
#include "kdm/k8s/devices_annotation.h"

namespace kdm::cli {

// The exit codes of every subcommand: done, failed at run time, bad usage.
inline constexpr int kOk = 0;
inline constexpr int kRuntimeError = 1;
inline constexpr int kUsageError = 2;

// The lock file `kdm kubelet --root R` holds for its whole life,
// R/<kAgentLockName> (kdm/base/file_lock.h): a second agent on R, and
// `kdm conform --root R`, see it held and refuse.
inline constexpr std::string_view kAgentLockName = ".kdm-kubelet.lock";

// Makes a stderr logger named `name` (UTC timestamps, one event per line,
// flushed at once) the default logger, at `level`.
void SetUpStderrLogging(const std::string& name, spdlog::level::level_enum level);

// The absolute, lexically normal form of the value of the path flag `flag`
// ("" stays ""). Error: "<flag>: cannot make <value> absolute: <reason>".
StatusOr<std::string> AbsolutePathFlag(std::string_view flag, const std::string& value);

// OK when `socket`, a unix socket path under the path flag `flag`, can be
// bound or dialled: its absolute form fits a unix socket path. Error:
// "<flag>: <socket> ... is N bytes, longer than the 107 bytes a unix socket
// path allows".
Status CheckSocketPathFlag(std::string_view flag, const std::string& socket);

// The listen address HOST:PORT of the flag `flag` (--metrics-addr,
// --listen), read as http::ParseListenAddress reads it. A bare port ("9400")
// is refused with a hint: "--metrics-addr \"9400\": a bare port; did you
// mean ':9400'? ...". INVALID_ARGUMENT naming the flag (a usage error).
StatusOr<http::ListenAddress> ParseListenFlag(std::string_view flag, const std::string& value);

// Creates the directory `dir` (and its parents) for the path flag `flag`;
// OK when it exists already. Error: "<flag>: cannot create directory <dir>:
// <reason>".
Status MakeDirectoryFlag(std::string_view flag, const std::string& dir);

// Parses the values of a repeatable `--attributes` flag, each
// "RESOURCE=KEY=VALUE,KEY=VALUE,..." (keys as k8s::ParseAttributes). Error:
// INVALID_ARGUMENT "--attributes 'VALUE': <what>" for no '=', a resource
// that is not an extended resource name (domain/name), the same resource
// twice, or a bad attribute list.
StatusOr<std::map<std::string, k8s::DeviceAttributes>> ParseResourceAttributes(
    const std::vector<std::string>& values);

// Raises the soft RLIMIT_NOFILE to the hard one (containerd >= 2.0 and
// Docker >= 25 start containers at a soft 1024), once per process, logging
// event=fd_limit_raised (or event=fd_limit_unchanged with the reason). For
// every long-running command, once its flags and files are checked (a bad
// one stays a one-line error) and before it serves.
void RaiseFdLimit();

// Sends gRPC core's own log lines (printed to stderr in its own format, e.g.
// a failed bind) to the spdlog default logger at debug level, so that users
// see kdm's one-line errors, and `-v` still shows gRPC's detail. Call once,
// before the first gRPC object is made.
void RouteGrpcLogsToDebug();

// The stop signals (SIGINT, SIGTERM) of a long-running command.
//
// Construct it before any thread exists: it blocks both signals in the
// calling thread (every later thread inherits the mask) and starts a watcher
// thread, the only one that takes them. The first signal is handed to
// Wait()/WaitFor(): the command then stops cleanly. A second one, whatever
// the process is doing then (a stop held by a hung peer, a log write blocked
// on a full pipe), ends it at once with exit code 128 + signal, as a shell
// reports a process killed by that signal: 130 for SIGINT, 143 for SIGTERM.
// It writes `<command>: event=stop_forced signal=SIGTERM exit_code=143` to
// stderr first when stderr can take it without blocking.
//
// Thread-safety: Wait/WaitFor/received from any thread. The watcher lives
// until the process ends (it is never joined).
//
// Example:
//   StopSignals stop("kdm kubelet");
//   ... start threads ...
//   int sig = stop.Wait();
//   spdlog::info("event=stopping signal={}", StopSignalName(sig));
class StopSignals {
 public:
  explicit StopSignals(std::string command);
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // Blocks until the first stop signal; returns it (SIGINT or SIGTERM).
  int Wait();
  // As Wait(), for at most `timeout`; 0 when none came within it.
  int WaitFor(std::chrono::milliseconds timeout);
  // The first stop signal, or 0 when none came yet.
  int received() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// "SIGINT", "SIGTERM", or "signal N".
std::string StopSignalName(int sig);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_CLI_COMMON_H_
