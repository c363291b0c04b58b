#include <iostream>
#include <memory>
#include <string>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "kdm/pluginapi/constants.h"

#ifndef KDM_VERSION
#define KDM_VERSION "unknown"
#endif

namespace kdm::cli {

std::string VersionText() {
  return std::string("kdm ") + KDM_VERSION + "\n" +
         "device plugin API: " + std::string(kdm::pluginapi::kVersion) + "\n" +
         "pod resources API: v1";
}

void AddHelpCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("help", "Show kdm's commands, or a command's flags: kdm help CMD");
  // Reached only when main.cc did not rewrite it (it always does).
  cmd->callback([&app] { std::cout << app.help(); });
}

void AddVersionCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("version", "Print kdm's version and the API versions it speaks");
  auto verbosity = std::make_shared<int>(0);
  AddVerbosityFlag(cmd, verbosity.get());
  cmd->callback([&exit_code, verbosity] {
    exit_code = kOk;
    if (DryRun()) return;
    std::cout << VersionText() << "\n";
  });
}

}  // namespace kdm::cli
