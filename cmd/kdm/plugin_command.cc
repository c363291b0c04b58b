// `kdm plugin`: a fake device plugin (GPU topologies from presets or files,
// or N generic devices) that registers with a kubelet (kdm's or a real one),
// serves the v1beta1 DevicePlugin API, answers GetPreferredAllocation with
// kdm's topology allocator and follows a health file for fault injection.
// With --fault NAME it runs a deliberately broken plugin instead
// (kdm::fakes::FaultyPlugin), for testing `kdm conform` and kubelets.
// With --nvml it serves the node's real NVIDIA GPUs from NVML instead
// (kdm::nvml::NvmlPlugin: UUIDs, live topology, Xid health). See
// docs/plugin.md and docs/nvml.md.
//
// Exit codes: 0 after SIGTERM or SIGINT (a clean stop); 1 a runtime error (a
// topology file that cannot be read or parsed, a socket path too long for a
// unix socket, a directory that cannot be used, a socket that cannot be
// bound, a socket whose lock <socket>.lock another live plugin holds: one
// line naming its pid); 2 bad usage (missing or conflicting flags, a malformed number, an
// unknown preset, policy or fault, an empty or malformed resource name,
// a flag that does not apply to --nvml
// or needs it, a bad DP_DISABLE_HEALTHCHECKS, a bad value of one of NVIDIA's
// flags or environment variables (named), --nvml on a machine without
// libnvidia-ml: one line "NVML not found: ...; is the NVIDIA driver
// installed?"). With --fail-on-init-error=false (FAIL_ON_INIT_ERROR) NVML's
// start failures are logged once and the plugin waits for a stop signal,
// then exits 0. Path flags may be relative; they are
// made absolute at once, and a directory or socket path that cannot work is
// an error naming its flag.
#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <charconv>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cli_common.h"
#include "cli_dialect.h"
#include "commands.h"
#include "duration_flag.h"
#include "kdm/base/file_lock.h"
#include "kdm/base/file_system.h"
#include "kdm/base/log_value.h"
#include "kdm/fakes/faulty_plugin.h"
#include "kdm/fakes/gpu_plugin.h"
#include "kdm/fakes/health_file.h"
#include "kdm/nvml/health_rules.h"
#include "kdm/nvml/library.h"
#include "kdm/nvml/nvml_plugin.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/sdk/plugin_server.h"
#include "kdm/topology/allocator.h"
#include "kdm/topology/presets.h"

namespace kdm::cli {
namespace {

// A flag that NVIDIA's plugin also reads from an environment variable
// (CLI11's envname: the command line wins, the variable fills a flag not
// given). Where a value came from is told apart after parsing: a given
// option whose value equals the variable's (non-empty) text came from it.
struct EnvBackedFlag {
  enum class Source { kDefault, kFlag, kEnv };
  const char* flag = "";
  const char* env = "";
  Source source = Source::kDefault;

  // "--device-id-strategy", or "DEVICE_ID_STRATEGY (--device-id-strategy)".
  std::string Name() const {
    return source == Source::kEnv ? std::string(env) + " (" + flag + ")" : std::string(flag);
  }
};

struct PluginFlags {
  std::string root;
  std::string plugin_dir;
  std::string resource;
  std::string preset;
  std::string topology_file;
  std::string count;
  std::string policy{topology::PolicyName(topology::kDefaultPolicy)};
  std::string socket_name;
  std::string health_file;
  std::string fault;
  bool fault_given = false;  // --fault "" is a usage error, not healthy mode
  bool pre_start = false;
  bool cdi = false;
  int verbosity = 0;
  // --nvml and the flags only it takes.
  bool nvml = false;
  std::string nvml_library;
  std::string sysfs_root;
  std::string dev_root;
  std::string health_recovery;
  // NVIDIA's plugin's flags, each also under NVIDIA's environment variable
  // (see AddPluginCommand); held as text and checked in CheckNvidiaFlags so
  // that an error names where the value came from.
  std::string mig_strategy = "none";
  std::string fail_on_init_error = "true";
  std::string driver_root;
  std::string nvidia_dev_root;
  std::string pass_device_specs = "true";
  std::string device_list_strategy = "envvar";
  std::string device_id_strategy = "uuid";
  std::string cdi_annotation_prefix = nvml::kDefaultCdiAnnotationPrefix;
  std::string config_file;
  std::string kubelet_socket;
  // Where each of those came from; filled by the command's callback.
  std::vector<EnvBackedFlag> nvidia_flags;
};

int PluginFail(int code, const std::string& message) {
  std::cerr << "kdm plugin: " << message << "\n";
  if (code == kUsageError) std::cerr << "Run 'kdm plugin --help' for usage.\n";
  return code;
}

const char* SignalName(int sig) {
  switch (sig) {
    case SIGTERM:
      return "SIGTERM";
    case SIGINT:
      return "SIGINT";
    default:
      return "signal";
  }
}

// NVIDIA's settings after their checks (CheckNvidiaFlags).
struct NvidiaSettings {
  bool fail_on_init_error = true;
  nvml::DeviceIdStrategy device_id_strategy = nvml::DeviceIdStrategy::kUuid;
  nvml::DeviceListStrategies device_list;
  bool pass_device_specs = true;
  std::string host_dev_root = "/";
  std::string cdi_annotation_prefix = nvml::kDefaultCdiAnnotationPrefix;
  bool register_with_kubelet = true;
};

// Go's strconv.ParseBool, which NVIDIA's flags and variables go through.
std::optional<bool> ParseGoBool(std::string_view text) {
  for (std::string_view t : {"1", "t", "T", "TRUE", "true", "True"}) {
    if (text == t) return true;
  }
  for (std::string_view t : {"0", "f", "F", "FALSE", "false", "False"}) {
    if (text == t) return false;
  }
  return std::nullopt;
}

const EnvBackedFlag& NvidiaFlag(const PluginFlags& f, std::string_view flag) {
  for (const EnvBackedFlag& e : f.nvidia_flags) {
    if (e.flag == flag) return e;
  }
  static const EnvBackedFlag kNone;
  return kNone;
}

// Checks NVIDIA's flags and variables into `out`; nullopt when fine, else the
// usage error, naming the flag (and the variable when the value came from
// it). Without --nvml the variables are not read (they belong to the GPU
// plugin's container; a fake plugin in the same shell must not trip on
// them) and the flags, --kubelet-socket apart, are usage errors. A
// --kubelet-socket given without --root or --plugin-dir sets the plugin
// directory (`f->plugin_dir`): the kubelet finds plugins beside its socket.
std::optional<std::string> CheckNvidiaFlags(PluginFlags* f, NvidiaSettings* out) {
  using Source = EnvBackedFlag::Source;
  for (EnvBackedFlag& e : f->nvidia_flags) {
    if (f->nvml || e.source != Source::kFlag) {
      if (!f->nvml) e.source = Source::kDefault;
      continue;
    }
    if (std::string_view(e.flag) != "--kubelet-socket") {
      return std::string(e.flag) + " needs --nvml (it is a setting of the NVIDIA GPU plugin)";
    }
  }
  auto given = [&](std::string_view flag) {
    return NvidiaFlag(*f, flag).source != Source::kDefault;
  };
  auto name = [&](std::string_view flag) { return NvidiaFlag(*f, flag).Name(); };
  if (given("--mig-strategy")) {
    const std::string& m = f->mig_strategy;
    if (m == "single" || m == "mixed") {
      return name("--mig-strategy") + ": " + QuoteLogValue(m, kMaxLogValueBytes) +
             " is not supported yet: kdm serves whole GPUs only until MIG comes with issue 31; "
             "use none";
    }
    if (m != "none") {
      return name("--mig-strategy") + ": " + QuoteLogValue(m, kMaxLogValueBytes) +
             " is not none, single or mixed";
    }
  }
  // A boolean of NVIDIA's: Go's spellings; the error names flag or variable.
  auto boolean = [&](std::string_view flag, const std::string& value,
                     bool* to) -> std::optional<std::string> {
    if (!given(flag)) return std::nullopt;
    std::optional<bool> b = ParseGoBool(value);
    if (!b)
      return name(flag) + ": " + QuoteLogValue(value, kMaxLogValueBytes) + " is not true or false";
    *to = *b;
    return std::nullopt;
  };
  if (auto e = boolean("--fail-on-init-error", f->fail_on_init_error, &out->fail_on_init_error)) {
    return *e;
  }
  if (auto e = boolean("--pass-device-specs", f->pass_device_specs, &out->pass_device_specs)) {
    return *e;
  }
  if (given("--device-list-strategy")) {
    StatusOr<nvml::DeviceListStrategies> l =
        nvml::ParseDeviceListStrategies(f->device_list_strategy);
    if (!l.ok()) return name("--device-list-strategy") + ": " + l.status().message();
    out->device_list = *l;
  }
  if (given("--device-id-strategy")) {
    StatusOr<nvml::DeviceIdStrategy> d = nvml::ParseDeviceIdStrategy(f->device_id_strategy);
    if (!d.ok()) return name("--device-id-strategy") + ": " + d.status().message();
    out->device_id_strategy = *d;
  }
  if (given("--cdi-annotation-prefix")) {
    if (Status st = nvml::CheckCdiAnnotationPrefix(f->cdi_annotation_prefix); !st.ok()) {
      return name("--cdi-annotation-prefix") + ": " + st.message();
    }
    out->cdi_annotation_prefix = f->cdi_annotation_prefix;
  }
  if (given("--config-file")) {
    return name("--config-file") + ": " + QuoteLogValue(f->config_file, kMaxLogValueBytes) +
           ": config files are not supported yet (NVIDIA's config format comes with issue 31); "
           "give the settings as flags or environment variables";
  }
  // Host paths: the plugin never opens them, so they are not made absolute
  // against its working directory.
  for (const char* flag : {"--driver-root", "--nvidia-dev-root"}) {
    const std::string& root =
        std::string_view(flag) == "--driver-root" ? f->driver_root : f->nvidia_dev_root;
    if (given(flag) && (root.empty() || root[0] != '/')) {
      return name(flag) + ": " + QuoteLogValue(root, kMaxLogValueBytes) +
             " must be an absolute path on the host";
    }
  }
  // NVIDIA's rule: the device root defaults to the driver root.
  if (given("--nvidia-dev-root")) {
    out->host_dev_root = f->nvidia_dev_root;
  } else if (given("--driver-root")) {
    out->host_dev_root = f->driver_root;
  }
  if (given("--kubelet-socket")) {
    if (f->kubelet_socket.empty()) {
      // NVIDIA's meaning of an empty socket: serve, never register.
      out->register_with_kubelet = false;
    } else {
      std::filesystem::path socket(f->kubelet_socket);
      if (socket.filename() != pluginapi::kKubeletSocketName) {
        return name("--kubelet-socket") + ": " +
               QuoteLogValue(f->kubelet_socket, kMaxLogValueBytes) +
               " must name a file kubelet.sock (the kubelet's registration socket)";
      }
      const std::string dir = socket.parent_path().lexically_normal().string();
      if (f->root.empty() && f->plugin_dir.empty()) {
        f->plugin_dir = dir;
      } else {
        const std::string plugin_dir =
            (f->plugin_dir.empty() ? std::filesystem::path(f->root) / "device-plugins"
                                   : std::filesystem::path(f->plugin_dir))
                .lexically_normal()
                .string();
        if (plugin_dir != dir) {
          return name("--kubelet-socket") + ": " +
                 QuoteLogValue(f->kubelet_socket, kMaxLogValueBytes) +
                 " is not in the plugin directory " + plugin_dir + " (given by " +
                 (f->plugin_dir.empty() ? "--root" : "--plugin-dir") +
                 "); the kubelet looks for plugins beside its socket";
        }
      }
    }
  }
  return std::nullopt;
}

// Checks the flags' shape; nullopt when fine, else the usage error.
std::optional<std::string> CheckUsage(const PluginFlags& f, fakes::PluginConfig* config) {
  if (f.resource.empty()) return "--resource NAME is required and must not be empty";
  if (f.root.empty() == f.plugin_dir.empty()) {
    return "give exactly one of --root DIR (the agent's root; the plugin directory is "
           "DIR/device-plugins) or --plugin-dir PATH";
  }
  int sources = !f.preset.empty() + !f.topology_file.empty() + !f.count.empty();
  if (f.nvml) {
    if (sources != 0) {
      return "--nvml takes its devices from NVML: --preset, --topology and --count do not apply";
    }
    if (!f.health_file.empty()) {
      return "--health-file does not apply to --nvml (health comes from NVML events)";
    }
    if (f.fault_given) return "--fault does not apply to --nvml";
    if (f.pre_start) return "--pre-start does not apply to --nvml";
  } else if (!f.nvml_library.empty() || !f.sysfs_root.empty() || !f.dev_root.empty() ||
             !f.health_recovery.empty()) {
    return "--nvml-library, --sysfs-root, --dev-root and --health-recovery need --nvml";
  } else if (sources != 1) {
    return std::string(sources == 0 ? "no device source" : "more than one device source") +
           ": give exactly one of --preset NAME, --topology FILE or --count N";
  }
  if (Status s = pluginapi::ValidateResourceName(f.resource); !s.ok()) return s.message();
  if (f.fault_given) {
    if (Status s = fakes::CheckFaultName(f.fault); !s.ok()) return "--fault: " + s.message();
  }
  config->resource_name = f.resource;
  if (!f.count.empty()) {
    int n = 0;
    auto [ptr, ec] = std::from_chars(f.count.data(), f.count.data() + f.count.size(), n);
    if (ec != std::errc() || ptr != f.count.data() + f.count.size()) {
      return "--count '" + f.count + "' is not a number";
    }
    if (n < 1 || n > fakes::kMaxCountDevices) {
      return "--count must be between 1 and " + std::to_string(fakes::kMaxCountDevices) + ", got " +
             f.count;
    }
    config->count = n;
  }
  if (!f.preset.empty()) {
    if (!topology::Preset(f.preset).ok()) {
      std::string names;
      for (const std::string& n : topology::PresetNames()) names += (names.empty() ? "" : ", ") + n;
      return "unknown preset \"" + f.preset + "\" (known: " + names + ")";
    }
    config->preset = f.preset;
  }
  config->topology_file = f.topology_file;
  StatusOr<fakes::PreferredPolicy> policy = fakes::ParsePreferredPolicy(f.policy);
  if (!policy.ok()) return policy.status().message();
  if (f.nvml && !policy->has_value()) {
    return "--policy none does not apply to --nvml (it always answers GetPreferredAllocation)";
  }
  config->policy = *policy;
  // Empty: the default name. Else the rules the kubelet side applies to the
  // endpoint a plugin registers.
  if (!f.socket_name.empty() && (!pluginapi::CheckEndpointName(f.socket_name).ok() ||
                                 f.socket_name == pluginapi::kKubeletSocketName)) {
    return "--socket-name '" + f.socket_name +
           "' must be a plain file name other than kubelet.sock";
  }
  config->socket_name = f.socket_name;
  config->pre_start = f.pre_start;
  config->cdi = f.cdi;
  config->plugin_dir = f.plugin_dir.empty()
                           ? (std::filesystem::path(f.root) / "device-plugins").string()
                           : f.plugin_dir;
  return std::nullopt;
}

// The one serve loop of `kdm plugin`, healthy or faulty: waits for SIGTERM or
// SIGINT and logs registrations (and failures) as they happen. Returns the
// signal that ended it.
int ServeUntilSignal(StopSignals& stop_signals, const fakes::PluginConfig& config,
                     const std::function<int()>& registration_count,
                     const std::function<Status()>& last_registration_error,
                     const std::string& fault) {
  const std::string& resource = config.resource_name;
  // Faulty plugins tag their lines with the fault.
  const std::string tag = fault.empty() ? "" : " fault=" + fault;
  int registrations = 0;
  std::string last_error;
  // A plugin started before its agent (or whose agent went away) waits for
  // kubelet.sock to appear: said once at info per wait (a wait ends with a
  // registration), then at -v once a second, so that a silent plugin is
  // never a mystery (issue 30).
  const std::string kubelet_socket =
      config.plugin_dir + "/" + std::string(pluginapi::kKubeletSocketName);
  bool wait_announced = false;
  std::chrono::steady_clock::time_point wait_started, next_wait_debug;
  auto log_waiting = [&] {
    // --kubelet-socket "": serving only, no registration to wait for.
    if (!config.register_with_kubelet) return;
    std::error_code ec;
    if (std::filesystem::exists(kubelet_socket, ec)) return;
    const auto now = std::chrono::steady_clock::now();
    if (!wait_announced) {
      wait_announced = true;
      wait_started = now;
      next_wait_debug = now + std::chrono::seconds(1);
      spdlog::info("event=waiting_for_kubelet resource={} socket={} detail={}{}", resource,
                   QuoteLogValue(kubelet_socket, kMaxLogValueBytes),
                   QuoteLogValue("waiting for kubelet.sock at " + kubelet_socket +
                                     "; registers once an agent serves it",
                                 2 * kMaxLogValueBytes),
                   tag);
    } else if (now >= next_wait_debug) {
      next_wait_debug = now + std::chrono::seconds(1);
      spdlog::debug("event=waiting_for_kubelet resource={} socket={} waited_s={}{}", resource,
                    QuoteLogValue(kubelet_socket, kMaxLogValueBytes),
                    std::chrono::duration_cast<std::chrono::seconds>(now - wait_started).count(),
                    tag);
    }
  };
  // Logs registrations (and failures) since the last call.
  auto log_registration = [&] {
    int now = registration_count();
    if (now != registrations) {
      spdlog::info("event=registered resource={} kubelet={}/{} registrations={}{}", resource,
                   config.plugin_dir, pluginapi::kKubeletSocketName, now, tag);
      registrations = now;
      wait_announced = false;
    } else {
      log_waiting();
    }
    Status err = last_registration_error();
    if (!err.ok() && err.message() != last_error) {
      spdlog::warn("event=registration_failed resource={} error={} action=retry{}", resource,
                   QuoteLogValue(err.message()), tag);
    }
    last_error = err.ok() ? "" : err.message();
  };
  int sig = 0;
  while (true) {
    // Bounded wait: registration changes are logged between waits.
    sig = stop_signals.WaitFor(std::chrono::milliseconds(100));
    if (sig != 0) break;
    log_registration();
  }
  log_registration();
  return sig;
}

// Runs a FaultyPlugin until SIGTERM or SIGINT (see RunPlugin).
// Follows --health-file (`path`), applying each version through `apply`.
// Errors: INVALID_ARGUMENT for a file that cannot be watched (exit 2), the
// watch's start error otherwise (exit 1); see StatusExitCode.
StatusOr<std::unique_ptr<fakes::HealthFileWatcher>> StartHealthFile(
    const std::string& path, const std::string& resource,
    std::function<fakes::HealthUpdate(const fakes::HealthMap&)> apply) {
  auto w = fakes::HealthFileWatcher::Create(
      path,
      [apply, path, resource](const fakes::HealthMap& health) {
        fakes::HealthUpdate u = apply(health);
        spdlog::info(
            "event=health_file_applied resource={} path={} healthy={} unhealthy={} "
            "unknown_ids={}",
            resource, path, u.healthy, u.unhealthy, u.unknown_ids.size());
      },
      [path, resource](const Status& error) {
        if (error.code() == StatusCode::kNotFound) {
          spdlog::info(
              "event=health_file_missing resource={} path={} detail={} "
              "action=keep_last_state",
              resource, path, QuoteLogValue(error.message()));
        } else {
          spdlog::warn(
              "event=health_file_rejected resource={} path={} error={} "
              "action=keep_last_state",
              resource, path, QuoteLogValue(error.message()));
        }
      });
  if (!w.ok()) return InvalidArgumentError(w.status().message());
  std::unique_ptr<fakes::HealthFileWatcher> watcher = std::move(*w);
  if (Status s = watcher->Start(); !s.ok()) return InternalError(s.message());
  return watcher;
}

// kUsageError for INVALID_ARGUMENT, kRuntimeError otherwise.
int StatusExitCode(const Status& s) {
  return s.code() == StatusCode::kInvalidArgument ? kUsageError : kRuntimeError;
}

int RunFaultyPlugin(const PluginFlags& f, const fakes::PluginConfig& config,
                    StopSignals& stop_signals) {
  spdlog::info("event=fault_mode fault={}", f.fault);
  StatusOr<std::unique_ptr<fakes::FaultyPlugin>> created =
      fakes::FaultyPlugin::Create(config, f.fault);
  if (!created.ok()) return PluginFail(kRuntimeError, created.status().message());
  std::unique_ptr<fakes::FaultyPlugin> plugin = std::move(*created);
  const std::string& resource = config.resource_name;
  std::unique_ptr<fakes::HealthFileWatcher> watcher;
  if (!f.health_file.empty()) {
    fakes::FaultyPlugin* p = plugin.get();
    StatusOr<std::unique_ptr<fakes::HealthFileWatcher>> w = StartHealthFile(
        f.health_file, resource, [p](const fakes::HealthMap& h) { return p->ApplyHealth(h); });
    if (!w.ok()) return PluginFail(StatusExitCode(w.status()), w.status().message());
    watcher = std::move(*w);
  }
  RaiseFdLimit();
  if (Status s = plugin->Start(); !s.ok()) {
    if (watcher) watcher->Stop();
    return PluginFail(kRuntimeError, s.message());
  }
  spdlog::info("event=serving resource={} socket={} devices={} source={} fault={}", resource,
               plugin->SocketPath(), plugin->healthy().topology().size(),
               QuoteLogValue(plugin->healthy().source()), f.fault);
  std::cout << "ready plugin=" << resource << " socket=" << plugin->SocketPath()
            << " devices=" << plugin->healthy().topology().size() << " fault=" << f.fault
            << std::endl;
  const int sig = ServeUntilSignal(
      stop_signals, config, [&] { return plugin->RegistrationCount(); },
      [&] { return plugin->LastRegistrationError(); }, f.fault);
  spdlog::info("event=stopping resource={} signal={}", resource, SignalName(sig));
  if (watcher) watcher->Stop();
  plugin->Stop();
  spdlog::info("event=stopped resource={}", resource);
  return 0;
}

// `given` with its path flags made absolute (see cli_common.h), or the
// error naming the flag.
StatusOr<PluginFlags> WithAbsolutePaths(const PluginFlags& given) {
  PluginFlags f = given;
  const std::pair<const char*, std::string*> paths[] = {{"--root", &f.root},
                                                        {"--plugin-dir", &f.plugin_dir},
                                                        {"--topology", &f.topology_file},
                                                        {"--health-file", &f.health_file},
                                                        {"--sysfs-root", &f.sysfs_root},
                                                        {"--dev-root", &f.dev_root}};
  for (const auto& [flag, value] : paths) {
    KDM_ASSIGN_OR_RETURN(*value, AbsolutePathFlag(flag, *value));
  }
  // Empty is NVIDIA's "do not register", not the working directory.
  if (!f.kubelet_socket.empty()) {
    KDM_ASSIGN_OR_RETURN(
        f.kubelet_socket,
        AbsolutePathFlag(NvidiaFlag(f, "--kubelet-socket").Name(), f.kubelet_socket));
  }
  // A bare library name goes through the loader's search path; a path is
  // made absolute like every other.
  if (f.nvml_library.find('/') != std::string::npos) {
    KDM_ASSIGN_OR_RETURN(f.nvml_library, AbsolutePathFlag("--nvml-library", f.nvml_library));
  }
  return f;
}

// Runs the NVML GPU plugin until SIGTERM or SIGINT (see RunPlugin).
int RunNvmlPlugin(const PluginFlags& f, const fakes::PluginConfig& config,
                  const NvidiaSettings& nvidia, StopSignals& stop_signals) {
  // Without NVML, --fail-on-init-error=false waits for the stop signal
  // instead of exiting: a DaemonSet on a node without a working driver does
  // not crash-loop (NVIDIA's plugin "blocks indefinitely").
  auto init_failed = [&](int code, const std::string& message, bool prefix) {
    if (nvidia.fail_on_init_error) {
      if (!prefix) {
        std::cerr << message << "\n";
        return code;
      }
      return PluginFail(code, message);
    }
    spdlog::warn(
        "event=nvml_init_failed resource={} error={} fail_on_init_error=false "
        "action=wait_for_stop_signal",
        config.resource_name, QuoteLogValue(message));
    const int sig = stop_signals.Wait();
    spdlog::info("event=stopped resource={} signal={}", config.resource_name, SignalName(sig));
    return 0;
  };
  nvml::NvmlPluginConfig c;
  c.resource_name = config.resource_name;
  c.plugin_dir = config.plugin_dir;
  c.socket_name = config.socket_name;
  c.library_path = f.nvml_library;
  if (!f.sysfs_root.empty()) c.sysfs_root = f.sysfs_root;
  if (!f.dev_root.empty()) c.dev_root = f.dev_root;
  c.cdi = f.cdi;
  c.host_dev_root = nvidia.host_dev_root;
  c.device_id_strategy = nvidia.device_id_strategy;
  c.device_list = nvidia.device_list;
  c.pass_device_specs = nvidia.pass_device_specs;
  c.cdi_annotation_prefix = nvidia.cdi_annotation_prefix;
  c.register_with_kubelet = config.register_with_kubelet;
  c.policy = *config.policy;
  if (!f.health_recovery.empty()) {
    StatusOr<std::chrono::milliseconds> d = ParseDurationFlag(f.health_recovery);
    if (!d.ok()) return PluginFail(kUsageError, "--health-recovery: " + d.status().message());
    if (d->count() <= 0) {
      return PluginFail(kUsageError, "--health-recovery must be a positive duration, got '" +
                                         f.health_recovery + "' (leave it out for no recovery)");
    }
    c.health_recovery = *d;
  }
  const char* disable = std::getenv(nvml::kDisableHealthChecksEnv);
  StatusOr<nvml::HealthChecks> checks = nvml::ParseDisableHealthChecks(disable ? disable : "");
  if (!checks.ok()) return PluginFail(kUsageError, checks.status().message());
  c.health_checks = *checks;

  // No NVML at all is the one failure users meet first: one line, exit 2.
  StatusOr<std::unique_ptr<nvml::Library>> library = nvml::Library::Load(c.library_path);
  if (!library.ok()) {
    if (library.status().code() == StatusCode::kNotFound) {
      return init_failed(kUsageError, library.status().message(), /*prefix=*/false);
    }
    return init_failed(kRuntimeError, library.status().message(), /*prefix=*/true);
  }
  StatusOr<std::unique_ptr<nvml::NvmlPlugin>> created =
      nvml::NvmlPlugin::Create(std::move(c), std::move(*library));
  if (!created.ok()) {
    return init_failed(kRuntimeError, created.status().message(), /*prefix=*/true);
  }
  std::unique_ptr<nvml::NvmlPlugin> plugin = std::move(*created);
  const std::string& resource = config.resource_name;
  RaiseFdLimit();
  if (Status s = plugin->Start(); !s.ok()) return PluginFail(kRuntimeError, s.message());
  std::cout << "ready plugin=" << resource << " socket=" << plugin->server().SocketPath()
            << " devices=" << plugin->node().gpus.size() << " source=nvml" << std::endl;
  const int sig = ServeUntilSignal(
      stop_signals, config, [&] { return plugin->server().RegistrationCount(); },
      [&] { return plugin->server().LastRegistrationError(); }, /*fault=*/"");
  spdlog::info("event=stopping resource={} signal={}", resource, SignalName(sig));
  plugin->Stop();
  spdlog::info("event=stopped resource={}", resource);
  return 0;
}

int RunPlugin(const PluginFlags& given) {
  StatusOr<PluginFlags> absolute = WithAbsolutePaths(given);
  if (!absolute.ok()) return PluginFail(kRuntimeError, absolute.status().message());
  PluginFlags f = *absolute;
  if (f.nvml && f.resource.empty()) f.resource = nvml::kNvidiaGpuResource;
  const bool plugin_dir_given = !f.plugin_dir.empty();

  // Before any thread exists (see StopSignals): the first SIGTERM/SIGINT
  // stops the plugin cleanly, a second one exits at once (130/143).
  StopSignals stop_signals("kdm plugin");

  fakes::PluginConfig config;
  NvidiaSettings nvidia;
  if (auto usage = CheckNvidiaFlags(&f, &nvidia)) return PluginFail(kUsageError, *usage);
  if (auto usage = CheckUsage(f, &config)) return PluginFail(kUsageError, *usage);
  // --health-recovery is checked here too: `kdm --dry-run plugin` stops below.
  if (!f.health_recovery.empty()) {
    StatusOr<std::chrono::milliseconds> d = ParseDurationFlag(f.health_recovery);
    if (!d.ok()) return PluginFail(kUsageError, "--health-recovery: " + d.status().message());
    if (d->count() <= 0) {
      return PluginFail(kUsageError, "--health-recovery must be a positive duration, got '" +
                                         f.health_recovery + "' (leave it out for no recovery)");
    }
  }
  if (f.nvml) {
    const char* disable = std::getenv(nvml::kDisableHealthChecksEnv);
    StatusOr<nvml::HealthChecks> checks = nvml::ParseDisableHealthChecks(disable ? disable : "");
    if (!checks.ok()) return PluginFail(kUsageError, checks.status().message());
  }
  config.register_with_kubelet = nvidia.register_with_kubelet;
  SetUpStderrLogging("kdm-plugin", LogLevelFor(f.verbosity, spdlog::level::info));
  // Both sockets in the plugin directory must fit a unix socket path: said
  // here, naming the flag that gave the directory.
  const char* dir_flag = !f.root.empty()    ? "--root"
                         : plugin_dir_given ? "--plugin-dir"
                                            : "--kubelet-socket";
  const std::string own_socket =
      f.socket_name.empty() ? plugin::DefaultSocketName(f.resource) : f.socket_name;
  for (const std::string& name : {std::string(pluginapi::kKubeletSocketName), own_socket}) {
    std::string socket = (std::filesystem::path(config.plugin_dir) / name).string();
    if (Status s = CheckSocketPathFlag(dir_flag, socket); !s.ok()) {
      return PluginFail(kRuntimeError, s.message());
    }
  }
  // `kdm --dry-run plugin`: every check above is pure; nothing below is.
  if (DryRun()) return kOk;
  if (!f.root.empty()) {
    // The agent may not have made its directory yet; the plugin waits for
    // kubelet.sock there either way.
    if (Status s = MakeDirectoryFlag("--root", config.plugin_dir); !s.ok()) {
      return PluginFail(kRuntimeError, s.message());
    }
  }
  // One plugin per socket: <socket>.lock beside it is held until this
  // process ends, however it ends. A second plugin on the same socket stops
  // here, naming the holder's pid, before it touches the first one's socket;
  // the agent's stale-socket sweep keeps a socket whose lock is held.
  const std::string socket_path = JoinPath(config.plugin_dir, own_socket);
  StatusOr<FileLock> socket_lock = FileLock::Acquire(SocketLockPath(socket_path));
  if (!socket_lock.ok()) {
    if (IsLockHeldError(socket_lock.status())) {
      return PluginFail(kRuntimeError, "socket " + socket_path + " is in use by another plugin: " +
                                           socket_lock.status().message());
    }
    return PluginFail(kRuntimeError, std::string(dir_flag) + ": " + socket_lock.status().message());
  }
  if (f.fault_given) return RunFaultyPlugin(f, config, stop_signals);
  if (f.nvml) return RunNvmlPlugin(f, config, nvidia, stop_signals);

  StatusOr<std::unique_ptr<fakes::FakeDevicePlugin>> created =
      fakes::FakeDevicePlugin::Create(config);
  if (!created.ok()) {
    // The flags' shape was checked above: what is left is files and paths.
    return PluginFail(kRuntimeError, created.status().message());
  }
  std::unique_ptr<fakes::FakeDevicePlugin> plugin = std::move(*created);
  const std::string& resource = config.resource_name;

  std::unique_ptr<fakes::HealthFileWatcher> watcher;
  if (!f.health_file.empty()) {
    fakes::FakeDevicePlugin* p = plugin.get();
    StatusOr<std::unique_ptr<fakes::HealthFileWatcher>> w = StartHealthFile(
        f.health_file, resource, [p](const fakes::HealthMap& h) { return p->ApplyHealth(h); });
    if (!w.ok()) return PluginFail(StatusExitCode(w.status()), w.status().message());
    watcher = std::move(*w);
  }

  RaiseFdLimit();
  if (Status s = plugin->Start(); !s.ok()) {
    if (watcher) watcher->Stop();
    return PluginFail(kRuntimeError, s.message());
  }
  std::cout << "ready plugin=" << resource << " socket=" << plugin->server().SocketPath()
            << " devices=" << plugin->topology().size() << std::endl;

  const int sig = ServeUntilSignal(
      stop_signals, config, [&] { return plugin->server().RegistrationCount(); },
      [&] { return plugin->server().LastRegistrationError(); }, /*fault=*/"");
  spdlog::info("event=stopping resource={} signal={}", resource, SignalName(sig));
  if (watcher) watcher->Stop();
  plugin->Stop();
  spdlog::info("event=stopped resource={}", resource);
  return 0;
}

}  // namespace

void AddPluginCommand(CLI::App& app, int& exit_code) {
  auto flags = std::make_shared<PluginFlags>();
  CLI::App* cmd = app.add_subcommand(
      "plugin", "Run a fake device plugin (GPU topologies, health fault injection)");
  cmd->add_option("--root", flags->root,
                  "The agent's root directory; the plugin directory is DIR/device-plugins");
  cmd->add_option("--plugin-dir", flags->plugin_dir,
                  "The device-plugin directory itself, e.g. /var/lib/kubelet/device-plugins");
  cmd->add_option("--resource", flags->resource, "Extended resource name, e.g. nvidia.com/gpu");
  cmd->add_option("--preset", flags->preset, "A built-in GPU topology (see 'kdm topo presets')");
  cmd->add_option("--topology", flags->topology_file,
                  "A topology file (nvidia-smi topo -m text or kdm JSON)");
  cmd->add_option("--count", flags->count, "N generic devices <name>-0 ... <name>-(N-1)");
  cmd->add_option(
      "--policy", flags->policy,
      "GetPreferredAllocation: packed, best-set, first-fit or none; default " + flags->policy);
  cmd->add_option("--socket-name", flags->socket_name,
                  "Socket file name in the plugin directory (default from the resource)");
  cmd->add_option("--health-file", flags->health_file,
                  "JSON object id -> \"Healthy\"/\"Unhealthy\", re-read when it changes");
  std::string fault_help =
      "Run a deliberately broken plugin that breaks one conformance check "
      "(docs/plugin.md, docs/conformance.md): ";
  for (size_t i = 0; i < fakes::FaultNames().size(); ++i) {
    fault_help += (i ? ", " : "") + fakes::FaultNames()[i];
  }
  CLI::Option* fault = cmd->add_option("--fault", flags->fault, fault_help);
  cmd->add_flag("--pre-start", flags->pre_start, "Offer PreStartContainer and log each call");
  cmd->add_flag("--cdi", flags->cdi, "Answer CDI device names <vendor>/<class>=<id>");
  cmd->add_flag("--nvml", flags->nvml,
                "Serve this node's NVIDIA GPUs from NVML (UUIDs, live topology, Xid health; "
                "docs/nvml.md); --resource defaults to nvidia.com/gpu");
  cmd->add_option("--nvml-library", flags->nvml_library,
                  "With --nvml: the NVML library (default libnvidia-ml.so.1 via the loader)");
  cmd->add_option("--sysfs-root", flags->sysfs_root,
                  "With --nvml: where sysfs is mounted, for NUMA nodes (default /sys)");
  cmd->add_option("--dev-root", flags->dev_root,
                  "With --nvml: where the host's /dev is seen, for the control nodes (default /)");
  cmd->add_option("--health-recovery", flags->health_recovery,
                  "With --nvml: mark a GPU healthy again after DURATION (e.g. 10m) without a new "
                  "critical event (default: never)")
      ->type_name("DURATION");
  // NVIDIA's plugin's flags under NVIDIA's names and environment variables
  // (docs/nvml.md, "NVIDIA's flags and variables"). CLI11 takes one
  // variable per option, so these are not also read as KDM_<FLAG>.
  struct NvidiaOption {
    const char* names;  // CLI11's spelling, first long name first
    const char* flag;   // the name messages use
    const char* env;
    std::string* value;
    bool is_bool;
    const char* help;
  };
  const NvidiaOption nvidia_options[] = {
      {"--mig-strategy", "--mig-strategy", "MIG_STRATEGY", &flags->mig_strategy, false,
       "With --nvml: MIG devices: none (single and mixed wait for MIG, issue 31)"},
      {"--fail-on-init-error", "--fail-on-init-error", "FAIL_ON_INIT_ERROR",
       &flags->fail_on_init_error, true,
       "With --nvml: exit when NVML cannot be loaded or initialised (default true); "
       "=false: log once and wait for SIGTERM instead (no crash loop on a node without a "
       "driver)"},
      {"--driver-root,--nvidia-driver-root", "--driver-root", "NVIDIA_DRIVER_ROOT",
       &flags->driver_root, false,
       "With --nvml: the driver's root on the host (/ or /run/nvidia/driver); the device "
       "nodes' host paths are under it unless --nvidia-dev-root is given"},
      {"--nvidia-dev-root", "--nvidia-dev-root", "NVIDIA_DEV_ROOT", &flags->nvidia_dev_root, false,
       "With --nvml: where the device nodes are on the host: the host path of /dev/nvidia0 is "
       "DIR/dev/nvidia0 (default: --driver-root, else /; not --dev-root, which is where this "
       "process sees the host's /dev)"},
      {"--pass-device-specs", "--pass-device-specs", "PASS_DEVICE_SPECS", &flags->pass_device_specs,
       true,
       "With --nvml: answer Allocate with the device nodes (default true; NVIDIA's default is "
       "false)"},
      {"--device-list-strategy", "--device-list-strategy", "DEVICE_LIST_STRATEGY",
       &flags->device_list_strategy, false,
       "With --nvml: how the runtime gets the GPUs, a comma list of envvar (default), "
       "volume-mounts, cdi-annotations, cdi-cri"},
      {"--device-id-strategy", "--device-id-strategy", "DEVICE_ID_STRATEGY",
       &flags->device_id_strategy, false,
       "With --nvml: the GPUs' names toward the runtime: uuid (default) or index"},
      {"--cdi-annotation-prefix", "--cdi-annotation-prefix", "CDI_ANNOTATION_PREFIX",
       &flags->cdi_annotation_prefix, false,
       "With --nvml and cdi-annotations: the annotation key's prefix (default cdi.k8s.io/)"},
      {"--config-file", "--config-file", "CONFIG_FILE", &flags->config_file, false,
       "With --nvml: NVIDIA's config file; refused until issue 31 brings its format"},
      {"--kubelet-socket", "--kubelet-socket", "KUBELET_SOCKET", &flags->kubelet_socket, false,
       "The kubelet's kubelet.sock (default DIR/kubelet.sock of --root or --plugin-dir; alone, "
       "it gives the plugin directory); \"\": serve without registering"},
  };
  auto nvidia_registered = std::make_shared<std::vector<std::pair<EnvBackedFlag, CLI::Option*>>>();
  for (const NvidiaOption& o : nvidia_options) {
    CLI::Option* opt = o.is_bool ? cmd->add_flag(o.names, *o.value, o.help)
                                 : cmd->add_option(o.names, *o.value, o.help);
    opt->envname(o.env);
    EnvBackedFlag e;
    e.flag = o.flag;
    e.env = o.env;
    nvidia_registered->push_back({e, opt});
  }
  AddVerbosityFlag(cmd, &flags->verbosity);
  cmd->callback([&exit_code, flags, fault, nvidia_registered] {
    flags->fault_given = fault->count() > 0;
    flags->nvidia_flags.clear();
    for (auto [e, opt] : *nvidia_registered) {
      using Source = EnvBackedFlag::Source;
      const char* env = std::getenv(e.env);
      // CLI11 fills an option from its variable only when the command line
      // did not give it, storing the variable's text as it is.
      const std::string value = opt->results().empty() ? "" : opt->results().back();
      e.source = opt->count() == 0                                  ? Source::kDefault
                 : (env != nullptr && *env != '\0' && value == env) ? Source::kEnv
                                                                    : Source::kFlag;
      flags->nvidia_flags.push_back(e);
    }
    exit_code = RunPlugin(*flags);
  });
}

}  // namespace kdm::cli
