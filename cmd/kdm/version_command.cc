#include <iostream>

#include "commands.h"
#include "kdm/pluginapi/constants.h"

#ifndef KDM_VERSION
#define KDM_VERSION "unknown"
#endif

namespace kdm::cli {

void AddVersionCommand(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("version", "Print kdm's version and the API versions it speaks");
  cmd->callback([&exit_code] {
    std::cout << "kdm " << KDM_VERSION << "\n"
              << "device plugin API: " << kdm::pluginapi::kVersion << "\n"
              << "pod resources API: v1\n";
    exit_code = 0;
  });
}

}  // namespace kdm::cli
