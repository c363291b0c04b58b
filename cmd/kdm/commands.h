// The subcommands of the kdm binary. Each Add…Command attaches one CLI11
// subcommand (with its flags and callback) to the root app; the callback
// returns the process exit code through `exit_code`.
//
// cmd/kdm only parses flags and calls into the libraries.
#ifndef KDM_CMD_KDM_COMMANDS_H_
#define KDM_CMD_KDM_COMMANDS_H_

#include <CLI/CLI.hpp>
#include <string>

namespace kdm::cli {

// `kdm help [CMD...]`: listed among the subcommands; main.cc turns it into
// `kdm [CMD...] --help` before parsing.
void AddHelpCommand(CLI::App& app);
void AddVersionCommand(CLI::App& app, int& exit_code);
// What `kdm version` and `kdm --version` print.
std::string VersionText();
void AddTopoCommand(CLI::App& app, int& exit_code);
void AddCheckpointCommand(CLI::App& app, int& exit_code);
void AddGetCommand(CLI::App& app, int& exit_code);
void AddPluginCommand(CLI::App& app, int& exit_code);
void AddKubeletCommand(CLI::App& app, int& exit_code);
void AddConformCommand(CLI::App& app, int& exit_code);
void AddPublishCommand(CLI::App& app, int& exit_code);
void AddExtenderCommand(CLI::App& app, int& exit_code);

}  // namespace kdm::cli

#endif  // KDM_CMD_KDM_COMMANDS_H_
