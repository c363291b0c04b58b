// `kdm checkpoint show|export|import`: look at, write out and fill an
// agent's checkpoint. Flag parsing only; the work is in kdm::checkpoint.
//
// Exit codes: 0 ok, 1 runtime error (message on stderr), 2 usage.
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "kdm/checkpoint/kubelet_json.h"
#include "kdm/checkpoint/kubelet_json_store.h"
#include "kdm/checkpoint/paths.h"

namespace kdm::cli {
namespace {

namespace ckpt = kdm::checkpoint;

struct CheckpointFlags {
  std::string root;
  std::string kind = "sqlite";
  std::string output = "text";
  std::string file;
  bool no_verify = false;
  int verbosity = 0;
};

int CheckpointUsage(const std::string& command, const std::string& message) {
  std::cerr << "kdm checkpoint " << command << ": " << message << "\n"
            << "Run 'kdm checkpoint " << command << " --help' for usage.\n";
  return kUsageError;
}

int CheckpointFail(const std::string& command, const Status& status) {
  std::cerr << "kdm checkpoint " << command << ": " << status.message() << "\n";
  return kRuntimeError;
}

// Checks the flags every subcommand shares; returns the store kind or sets
// `exit_code` to a usage error.
bool CommonFlags(const std::string& command, const CheckpointFlags& flags, ckpt::StoreKind* kind,
                 int* exit_code) {
  if (flags.root.empty()) {
    *exit_code = CheckpointUsage(command, "--root is required");
    return false;
  }
  StatusOr<ckpt::StoreKind> parsed = ckpt::ParseStoreKind(flags.kind);
  if (!parsed.ok()) {
    *exit_code = CheckpointUsage(command, "--checkpoint: " + parsed.status().message());
    return false;
  }
  *kind = *parsed;
  return true;
}

// Opens an existing store for reading: nothing is created, a bad file is
// reported and left where it is.
StatusOr<std::unique_ptr<ckpt::Store>> OpenExisting(const CheckpointFlags& flags,
                                                    ckpt::StoreKind kind) {
  KDM_ASSIGN_OR_RETURN(
      ckpt::OpenResult opened,
      ckpt::OpenStoreForRoot(flags.root, kind,
                             {.create_if_missing = false, .quarantine_corrupt = false}));
  return std::move(opened.store);
}

std::string DevicesText(const ckpt::DevicesPerNuma& devices) {
  std::string out;
  for (const auto& [numa, ids] : devices) {
    if (!out.empty()) out += ' ';
    out += numa == ckpt::kNoNumaNode ? std::string("numa=none:")
                                     : "numa=" + std::to_string(numa) + ":";
    for (size_t i = 0; i < ids.size(); ++i) out += (i > 0 ? "," : "") + ids[i];
  }
  return out;
}

void PrintText(const std::string& described, const ckpt::CheckpointData& data) {
  std::cout << "checkpoint: " << described << "\n"
            << "boot id: " << (data.boot_id.empty() ? "unknown" : data.boot_id) << "\n";
  std::cout << "entries: " << data.entries.size() << "\n";
  std::string last_pod;
  for (const ckpt::PodDevicesEntry& e : data.entries) {
    if (e.pod_uid != last_pod) {
      std::cout << "pod " << e.pod_uid << "\n";
      last_pod = e.pod_uid;
    }
    std::cout << "  container " << e.container_name << "  resource " << e.resource_name
              << "  devices " << DevicesText(e.device_ids) << "  (allocate response "
              << e.alloc_response.size() << " bytes)\n";
  }
  std::cout << "registered devices:\n";
  for (const auto& [resource, ids] : data.registered_devices) {
    std::cout << "  " << resource << ":";
    for (const std::string& id : ids) std::cout << " " << id;
    std::cout << "\n";
  }
}

void PrintJson(const std::string& described, const ckpt::CheckpointData& data) {
  nlohmann::json out;
  out["store"] = described;
  out["boot_id"] = data.boot_id;
  out["entries"] = nlohmann::json::array();
  for (const ckpt::PodDevicesEntry& e : data.entries) {
    nlohmann::json devices = nlohmann::json::object();
    for (const auto& [numa, ids] : e.device_ids) devices[std::to_string(numa)] = ids;
    out["entries"].push_back({{"pod_uid", e.pod_uid},
                              {"container_name", e.container_name},
                              {"resource_name", e.resource_name},
                              {"device_ids", devices},
                              {"alloc_response", ckpt::Base64Encode(e.alloc_response)}});
  }
  out["registered_devices"] = nlohmann::json::object();
  for (const auto& [resource, ids] : data.registered_devices)
    out["registered_devices"][resource] = ids;
  std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
}

int Show(const CheckpointFlags& flags) {
  ckpt::StoreKind kind;
  int code = kOk;
  if (!CommonFlags("show", flags, &kind, &code)) return code;
  if (flags.output != "text" && flags.output != "json") {
    return CheckpointUsage("show", "-o must be text or json, got \"" + flags.output + "\"");
  }
  if (DryRun()) return kOk;
  StatusOr<std::unique_ptr<ckpt::Store>> store = OpenExisting(flags, kind);
  if (!store.ok()) return CheckpointFail("show", store.status());
  StatusOr<ckpt::CheckpointData> data = (*store)->Load();
  if (!data.ok()) return CheckpointFail("show", data.status());
  if (flags.output == "json") {
    PrintJson((*store)->Describe(), *data);
  } else {
    PrintText((*store)->Describe(), *data);
  }
  return kOk;
}

int Export(const CheckpointFlags& flags) {
  ckpt::StoreKind kind;
  int code = kOk;
  if (!CommonFlags("export", flags, &kind, &code)) return code;
  if (flags.file.empty())
    return CheckpointUsage("export", "the output FILE is required ('-' for stdout)");
  if (DryRun()) return kOk;
  StatusOr<std::unique_ptr<ckpt::Store>> store = OpenExisting(flags, kind);
  if (!store.ok()) return CheckpointFail("export", store.status());
  StatusOr<ckpt::CheckpointData> data = (*store)->Load();
  if (!data.ok()) return CheckpointFail("export", data.status());
  if (flags.file == "-") {
    std::cout << ckpt::EncodeKubeletCheckpoint(*data);
    std::cout.flush();
    if (!std::cout) return CheckpointFail("export", UnavailableError("cannot write to stdout"));
    return kOk;
  }
  if (Status s = ckpt::WriteKubeletCheckpointFile(flags.file, *data); !s.ok()) {
    return CheckpointFail("export", s);
  }
  std::cerr << "exported " << data->entries.size() << " entries from " << (*store)->Describe()
            << " to " << flags.file << "\n";
  return kOk;
}

int Import(const CheckpointFlags& flags) {
  ckpt::StoreKind kind;
  int code = kOk;
  if (!CommonFlags("import", flags, &kind, &code)) return code;
  if (flags.file.empty())
    return CheckpointUsage("import", "the kubelet checkpoint FILE is required");
  if (DryRun()) return kOk;
  // Read and check the whole file first: a bad file changes nothing.
  StatusOr<ckpt::CheckpointData> data =
      ckpt::ReadKubeletCheckpointFile(flags.file, /*verify_checksum=*/!flags.no_verify);
  if (!data.ok()) {
    Status s = data.status();
    if (s.code() == StatusCode::kDataLoss) {
      s = Status(s.code(), s.message() + " (use --no-verify to import it anyway)");
    }
    return CheckpointFail("import", s);
  }
  StatusOr<ckpt::OpenResult> opened = ckpt::OpenStoreForRoot(flags.root, kind);
  if (!opened.ok()) return CheckpointFail("import", opened.status());
  if (!opened->recovered.ok()) {
    std::cerr << "kdm checkpoint import: warning: " << opened->recovered.message() << "\n";
  }
  if (Status s = opened->store->Replace(*data); !s.ok()) return CheckpointFail("import", s);
  std::cerr << "imported " << data->entries.size() << " entries and "
            << data->registered_devices.size() << " resources from " << flags.file << " into "
            << opened->store->Describe() << "\n";
  return kOk;
}

void AddCommonFlags(CLI::App* cmd, CheckpointFlags& flags) {
  cmd->add_option("--root", flags.root, "The agent's root directory (the store is under DIR/state)")
      ->type_name("DIR");
  cmd->add_option("--checkpoint", flags.kind, "Which store: sqlite (default) or kubelet-json")
      ->type_name("KIND");
  AddVerbosityFlag(cmd, &flags.verbosity);
}

// The store's own logs (a recovered or quarantined file) at -v.
void SetUpCheckpointLogging(const CheckpointFlags& flags) {
  SetUpStderrLogging("kdm-checkpoint", LogLevelFor(flags.verbosity, spdlog::level::warn));
}

}  // namespace

void AddCheckpointCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<CheckpointFlags>();
  auto* cmd = app.add_subcommand("checkpoint", "Show, export and import an agent's checkpoint");
  cmd->require_subcommand(1);

  auto* show = cmd->add_subcommand("show", "Print the pods, containers, resources and devices");
  AddCommonFlags(show, *flags);
  show->add_option("-o,--output", flags->output, "text (default) or json")->type_name("FORMAT");
  show->callback([flags, &exit_code] {
    SetUpCheckpointLogging(*flags);
    exit_code = Show(*flags);
  });

  auto* exp = cmd->add_subcommand("export",
                                  "Write the checkpoint as a "
                                  "kubelet_internal_checkpoint file ('-' for stdout)");
  AddCommonFlags(exp, *flags);
  exp->add_option("FILE", flags->file, "Output file, '-' for stdout");
  exp->callback([flags, &exit_code] {
    SetUpCheckpointLogging(*flags);
    exit_code = Export(*flags);
  });

  auto* imp =
      cmd->add_subcommand("import",
                          "Replace the checkpoint with a kubelet_internal_checkpoint file, in one "
                          "transaction");
  AddCommonFlags(imp, *flags);
  imp->add_option("FILE", flags->file, "The kubelet checkpoint file");
  imp->add_flag("--no-verify", flags->no_verify,
                "Import even when the file's checksum does not verify");
  imp->callback([flags, &exit_code] {
    SetUpCheckpointLogging(*flags);
    exit_code = Import(*flags);
  });
}

}  // namespace kdm::cli
