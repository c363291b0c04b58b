// kdm: one binary, one subcommand per job (see docs and `kdm --help`).
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"

int main(int argc, char** argv) {
  // Before any gRPC object: gRPC core's own stderr lines become debug logs.
  kdm::cli::RouteGrpcLogsToDebug();
  CLI::App app{"kdm: a Kubernetes device manager (device plugin API v1beta1)", "kdm"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kdm::cli::VersionText(), "Print kdm's version and exit");
  // A flag callback: set before any command's callback runs.
  app.add_flag_callback(
      "--dry-run", [] { kdm::cli::SetDryRun(true); },
      "kdm --dry-run CMD ...: check CMD's flags and values as a run would, then exit 0 "
      "without touching files, sockets, NVML or the network");
  app.footer(
      "Every long flag of every command can also be set as KDM_<FLAG> (e.g. --plugin-dir: "
      "KDM_PLUGIN_DIR); the command line wins. 'kdm help CMD' shows a command's flags.");
  int exit_code = 0;
  kdm::cli::AddHelpCommand(app);
  kdm::cli::AddVersionCommand(app, exit_code);
  kdm::cli::AddTopoCommand(app, exit_code);
  kdm::cli::AddCheckpointCommand(app, exit_code);
  kdm::cli::AddGetCommand(app, exit_code);
  kdm::cli::AddPluginCommand(app, exit_code);
  kdm::cli::AddKubeletCommand(app, exit_code);
  kdm::cli::AddConformCommand(app, exit_code);
  kdm::cli::AddPublishCommand(app, exit_code);
  kdm::cli::AddExtenderCommand(app, exit_code);
  kdm::cli::AddEnvNames(app);
  // `kdm help` is `kdm --help`; `kdm help CMD [SUB]` is `kdm CMD [SUB] --help`.
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args.front() == "help") {
    args.erase(args.begin());
    args.push_back("--help");
  }
  std::reverse(args.begin(), args.end());  // CLI11 takes them last first
  try {
    app.parse(args);
  } catch (const CLI::ParseError& e) {
    // One line for every usage error (exit 2), CLI11's help for --help.
    return kdm::cli::ReportParseError(app, e);
  }
  return exit_code;
}
