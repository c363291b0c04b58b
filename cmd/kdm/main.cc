// kdm: one binary, one subcommand per job (see docs and `kdm --help`).
#include <iostream>

#include "cli_common.h"
#include "commands.h"

int main(int argc, char** argv) {
  // Before any gRPC object: gRPC core's own stderr lines become debug logs.
  kdm::cli::RouteGrpcLogsToDebug();
  CLI::App app{"kdm: a Kubernetes device manager (device plugin API v1beta1)"};
  app.require_subcommand(1);
  int exit_code = 0;
  kdm::cli::AddVersionCommand(app, exit_code);
  kdm::cli::AddTopoCommand(app, exit_code);
  kdm::cli::AddCheckpointCommand(app, exit_code);
  kdm::cli::AddGetCommand(app, exit_code);
  kdm::cli::AddPluginCommand(app, exit_code);
  kdm::cli::AddKubeletCommand(app, exit_code);
  kdm::cli::AddConformCommand(app, exit_code);
  kdm::cli::AddPublishCommand(app, exit_code);
  kdm::cli::AddExtenderCommand(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help (exit 0) or the usage error; every usage error
    // exits 2, whichever CLI11 code it carries.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}
