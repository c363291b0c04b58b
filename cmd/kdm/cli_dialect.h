// One command-line dialect for every kdm subcommand (issue 30): what main.cc
// sets up once the subcommands are built, and what each command shares.
//
//   -v N            the same on every command: 0 the command's normal lines,
//                   1 debug, 2 to 9 trace (LogLevelFor)
//   KDM_<FLAG>      every long flag of every command also from the
//                   environment (--plugin-dir: KDM_PLUGIN_DIR), and -v from
//                   KDM_V; the command line wins (AddEnvNames)
//   kdm --dry-run CMD ...   CMD checks its flags as a real run would, then
//                   exits 0 before any I/O (DryRun)
//   usage errors    one line "kdm <cmd>: <what>", exit 2; an unknown flag or
//                   command with a "did you mean" (ReportParseError)
//
// Thread-safety: everything here runs on main's thread, while parsing.
//
// Example (main.cc):
//   CLI::App app{...};  AddKubeletCommand(app, exit_code);  ...
//   AddEnvNames(app);
//   try { app.parse(argc, argv); } catch (const CLI::ParseError& e) {
//     return ReportParseError(app, e);
//   }
#ifndef KDM_CMD_KDM_CLI_DIALECT_H_
#define KDM_CMD_KDM_CLI_DIALECT_H_

#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace kdm::cli {

// The largest -v.
inline constexpr int kMaxVerbosity = 9;

// Adds `-v N` (0..kMaxVerbosity, default 0) to `cmd`, stored in
// `verbosity`. A value that is not a whole number in range is a usage error
// naming the range.
void AddVerbosityFlag(CLI::App* cmd, int* verbosity);

// The log level of -v `verbosity`: `normal` at 0 (info for the long-running
// commands, warn for the one-shot ones), debug at 1, trace from 2.
spdlog::level::level_enum LogLevelFor(int verbosity, spdlog::level::level_enum normal);

// `kdm --dry-run CMD ...`: set by main before CMD's callback runs. A command
// returns kOk right after its pure checks when it is set: no file, socket,
// NVML or network is touched, nothing is printed.
void SetDryRun(bool dry_run);
bool DryRun();

// The environment variable of the long flag `name` ("--plugin-dir" ->
// "KDM_PLUGIN_DIR").
std::string EnvNameOfFlag(std::string_view name);

// Gives every long flag of every subcommand of `root` (recursively) its
// KDM_<FLAG> variable, when that subcommand is parsed, so that a variable
// meant for one command never reaches another's flags. Skips options that
// already have a variable (a command may name its own, e.g. NVIDIA's) and
// the help flags. A boolean flag's value must be true, false, 1 or 0 (else
// a usage error naming the variable). Call once, after every subcommand is
// added.
void AddEnvNames(CLI::App& root);

// Prints the parse error `e` of `root` as one line "kdm <cmd>: <what>" on
// stderr, or the help text (for --help), and returns the exit code: 0 for
// help, else 2. An unknown flag: "kdm plugin: unknown flag '--prot' (did you
// mean '--port'?)"; an unknown command: "kdm: unknown command 'kubelt' (did
// you mean 'kubelet'?)".
int ReportParseError(CLI::App& root, const CLI::ParseError& e);

// The candidate closest to `word` by edit distance, if close enough to be
// a likely typo (at most 2 edits, or a third of the word's length for long
// words); "" if none is.
std::string DidYouMean(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_CLI_DIALECT_H_
