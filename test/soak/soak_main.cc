// kdm_soak: random pod churn against a real `kdm kubelet` and three real
// `kdm plugin` processes while faults are injected, with the device
// manager's invariants checked continuously (`./run soak [SECONDS]`).
//
// Faults: pod manifests written (sometimes asking for more than exists) and
// deleted, device health flipped through the plugins' health files, plugins
// SIGKILLed and restarted after a short random delay, `kdm kubelet`
// SIGKILLed (or SIGTERMed) and restarted on the same root, and one plugin
// (example.com/nic) started with `--fault pref-not-subset`, so that every
// GetPreferredAllocation answer it gives is garbage. Two hostile plugins
// (kdm_hostile_plugin) join them: example.com/flappy flips one device's
// health every millisecond for 5 s after every (re)connect, and
// example.com/hung hangs in Allocate until the kubelet's deadline (a few
// pods ask for it). A duplicate-uid action writes a second manifest with
// the uid of an admitted pod: it must be rejected (DuplicatePod), and
// removing it must free nothing.
//
// Invariants, read through the pod-resources API (List,
// GetAllocatableResources), the SQLite checkpoint (read-only use of the
// store), the status files and /proc:
//   no-double-device   no device id in two containers (List, checkpoint);
//   allocation-kept    a pod whose manifest exists and whose status says
//                      Admitted holds exactly the devices it was first given
//                      (status file, List, checkpoint), across restarts;
//   gone-pod-freed     no device held by a pod whose manifest is gone;
//   capacity           allocatable ids and node capacity equal what the
//                      plugins report (their device lists and health files);
//   fds-threads        the kubelet's open fds and threads do not grow past
//                      the first settled sample after its start plus a slack.
// Checks that need the agent to settle poll with a bound; running out of it
// is a violation. Every violation is printed on stderr as it is found; the
// exit code is 0 only when there was none.
//
// Usage: kdm_soak --seconds N [--seed S] [--kdm PATH] [--hostile-plugin PATH]
//                 [--root DIR] [--keep] [--nic-fault NAME]
// Exit codes: 0 no violation, 1 violations (or interrupted, or the setup
// failed), 2 bad usage.
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/paths.h"
#include "kdm/fakes/status_file.h"
#include "kdm/pluginapi/unix_target.h"
#include "kdm/test/soak/child_process.h"
#include "podresources/v1/api.grpc.pb.h"

namespace kdm::soak {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using nlohmann::json;

volatile sig_atomic_t g_stop_signal = 0;
extern "C" void OnStopSignal(int sig) { g_stop_signal = sig; }

// Upper bound of every wait for the agent to settle (a loaded 2-core
// machine: generous).
constexpr auto kSettleBound = 45s;
// How much the kubelet's fds / threads may exceed its first settled sample.
constexpr int kFdSlack = 16;
constexpr int kThreadSlack = 8;

// ------------------------------------------------------------------ flags

struct Flags {
  int64_t seconds = 60;
  uint64_t seed = 0;
  bool seed_given = false;
  std::string kdm;
  std::string hostile_plugin;
  std::string root;
  bool keep = false;
  std::string nic_fault = "pref-not-subset";
};

constexpr char kUsage[] =
    "usage: kdm_soak --seconds N [--seed S] [--kdm PATH] [--hostile-plugin PATH] [--root DIR] "
    "[--keep] [--nic-fault NAME|none]\n"
    "  --seconds N      how long to churn (1..86400; default 60)\n"
    "  --seed S         the random seed (default: from the clock; always printed)\n"
    "  --kdm PATH       the kdm binary (default: kdm beside kdm_soak)\n"
    "  --hostile-plugin PATH  kdm_hostile_plugin (default: beside kdm_soak)\n"
    "  --root DIR       the kubelet's root (must not exist or be empty; default:\n"
    "                   a fresh temporary directory, removed at the end)\n"
    "  --keep           keep the root (logs, checkpoint) at the end\n"
    "  --nic-fault NAME the example.com/nic plugin's --fault (default\n"
    "                   pref-not-subset; none: a healthy plugin)\n";

bool ParseInt(const std::string& text, int64_t* out) {
  if (text.empty()) return false;
  size_t pos = 0;
  try {
    long long v = std::stoll(text, &pos, 10);
    if (pos != text.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

bool ParseUint(const std::string& text, uint64_t* out) {
  if (text.empty() || text[0] == '-' || text[0] == '+') return false;
  size_t pos = 0;
  try {
    unsigned long long v = std::stoull(text, &pos, 10);
    if (pos != text.size()) return false;
    *out = v;
    return true;
  } catch (...) {
    return false;
  }
}

// The directory holding this executable ("" if unknown).
std::string SelfDir() {
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  return ec ? "" : self.parent_path().string();
}

// OK, or INVALID_ARGUMENT naming what was wrong.
Status ParseFlags(int argc, char** argv, Flags* flags, bool* help) {
  *help = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    bool has_value = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      has_value = true;
    }
    auto take = [&](std::string* out) -> Status {
      if (has_value) {
        *out = value;
        return OkStatus();
      }
      if (i + 1 >= argc) return InvalidArgumentError(arg + " needs a value");
      *out = argv[++i];
      return OkStatus();
    };
    std::string v;
    if (arg == "-h" || arg == "--help") {
      *help = true;
      return OkStatus();
    } else if (arg == "--keep") {
      if (has_value) return InvalidArgumentError("--keep takes no value");
      flags->keep = true;
    } else if (arg == "--seconds") {
      KDM_RETURN_IF_ERROR(take(&v));
      if (!ParseInt(v, &flags->seconds) || flags->seconds < 1 || flags->seconds > 86400) {
        return InvalidArgumentError("--seconds must be a whole number from 1 to 86400, got \"" + v +
                                    "\"");
      }
    } else if (arg == "--seed") {
      KDM_RETURN_IF_ERROR(take(&v));
      if (!ParseUint(v, &flags->seed)) {
        return InvalidArgumentError("--seed must be a non-negative whole number, got \"" + v +
                                    "\"");
      }
      flags->seed_given = true;
    } else if (arg == "--kdm") {
      KDM_RETURN_IF_ERROR(take(&flags->kdm));
    } else if (arg == "--hostile-plugin") {
      KDM_RETURN_IF_ERROR(take(&flags->hostile_plugin));
    } else if (arg == "--root") {
      KDM_RETURN_IF_ERROR(take(&flags->root));
      if (flags->root.empty()) return InvalidArgumentError("--root must not be empty");
    } else if (arg == "--nic-fault") {
      KDM_RETURN_IF_ERROR(take(&flags->nic_fault));
      if (flags->nic_fault.empty()) return InvalidArgumentError("--nic-fault must not be empty");
    } else {
      return InvalidArgumentError("unknown argument \"" + arg + "\"");
    }
  }
  if (flags->kdm.empty()) {
    std::string dir = SelfDir();
    flags->kdm = (dir.empty() ? std::string(".") : dir) + "/kdm";
  }
  struct stat st;
  if (::stat(flags->kdm.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(flags->kdm.c_str(), X_OK) != 0) {
    return InvalidArgumentError("--kdm: " + flags->kdm + " is not an executable file");
  }
  flags->kdm = fs::absolute(flags->kdm).lexically_normal().string();
  if (flags->hostile_plugin.empty()) {
    std::string dir = SelfDir();
    flags->hostile_plugin = (dir.empty() ? std::string(".") : dir) + "/kdm_hostile_plugin";
  }
  if (::stat(flags->hostile_plugin.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      ::access(flags->hostile_plugin.c_str(), X_OK) != 0) {
    return InvalidArgumentError("--hostile-plugin: " + flags->hostile_plugin +
                                " is not an executable file");
  }
  flags->hostile_plugin = fs::absolute(flags->hostile_plugin).lexically_normal().string();
  if (!flags->root.empty()) {
    std::error_code ec;
    if (fs::exists(flags->root, ec)) {
      if (!fs::is_directory(flags->root, ec)) {
        return InvalidArgumentError("--root: " + flags->root + " is not a directory");
      }
      if (!fs::is_empty(flags->root, ec)) {
        return InvalidArgumentError("--root: " + flags->root +
                                    " is not empty (the soak needs a fresh node)");
      }
    }
    flags->root = fs::absolute(flags->root).lexically_normal().string();
    // The plugin sockets live under DIR/device-plugins: keep them short.
    if (flags->root.size() > 60) {
      return InvalidArgumentError("--root: " + flags->root +
                                  " is too long for unix socket paths below it (60 bytes at most)");
    }
  }
  return OkStatus();
}

// ------------------------------------------------------------------ model

using Devices = std::map<std::string, std::vector<std::string>>;  // resource -> sorted ids
using ContainerDevicesMap = std::map<std::string, Devices>;       // container -> devices

struct ContainerSpec {
  std::string name;
  bool init = false;
  std::map<std::string, int> limits;
};

struct PodRecord {
  std::string name;
  std::string uid;
  std::vector<ContainerSpec> containers;  // init first
  bool manifest_present = true;
  bool status_seen = false;
  // Devices of every container as first admitted (empty: never admitted).
  std::optional<ContainerDevicesMap> first_devices;
  bool rejected_after_admission = false;
  std::string outcome;  // "admitted", "rejected" once known
};

struct Plugin {
  std::string resource;
  std::vector<std::string> ids;
  std::string health_file;  // empty: none
  std::set<std::string> unhealthy;
  std::unique_ptr<ChildProcess> child;
  std::optional<Clock::time_point> restart_at;
};

// A pod status file, parsed.
struct PodStatusView {
  std::string text;  // raw, to see whether it changed between two reads
  std::string phase;
  std::string message;
  ContainerDevicesMap devices;  // only containers with devices
};

std::optional<PodStatusView> ReadPodStatus(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  PodStatusView v;
  v.text = s.str();
  StatusOr<fakes::PodStatus> status = fakes::ParsePodStatus(v.text);
  if (!status.ok()) {
    v.phase = "<unparsable>";
    return v;
  }
  v.phase = status->phase;
  v.message = status->message;
  for (const fakes::ContainerStatus& c : status->containers) {
    Devices d;
    for (const auto& [resource, ids] : c.devices) {
      if (!ids.empty()) d[resource] = ids;  // sorted by the writer
    }
    if (!d.empty()) v.devices[c.name] = std::move(d);
  }
  return v;
}

std::string DevicesText(const ContainerDevicesMap& m) {
  std::string out = "{";
  for (const auto& [c, d] : m) {
    if (out.size() > 1) out += " ";
    out += c + ":";
    bool first = true;
    for (const auto& [r, ids] : d) {
      out += (first ? "" : ";") + r + "=";
      first = false;
      for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + ids[i];
    }
  }
  return out + "}";
}

// ------------------------------------------------------------------ driver

class Soak {
 public:
  explicit Soak(Flags flags) : flags_(std::move(flags)), rng_(flags_.seed) {}
  ~Soak() { Cleanup(); }

  int Run();

 private:
  // Setup and teardown.
  Status Setup();
  void Cleanup();
  void StartPlugin(Plugin& p);
  void StartKubelet();

  // The clock of the run, for messages.
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - started_).count(); }
  bool Stopping() const { return g_stop_signal != 0; }
  void Log(const std::string& line);
  void Violation(const std::string& kind, const std::string& detail);
  void Count(const std::string& check) { ++checks_[check]; }

  // Reaps children that exited on their own and runs due restarts.
  void Tick();
  // Sleeps `d` in small steps, ticking; false when asked to stop.
  bool Pause(std::chrono::milliseconds d);
  // Polls `pred` (ticking) until it holds or `bound` passes.
  bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds bound);

  // Actions.
  void CreatePod();
  void DeletePod();
  void FlipHealth();
  void KillPlugin();
  void KillKubelet(int sig);
  // Writes a second manifest with the uid of an admitted pod; it must be
  // rejected as DuplicatePod, and removing it must free nothing.
  void DuplicateUid();
  void WriteHealthFile(Plugin& p);

  // Reading the agent.
  StatusOr<v1::ListPodResourcesResponse> List();
  StatusOr<v1::AllocatableResourcesResponse> Allocatable();
  StatusOr<checkpoint::CheckpointData> ReadCheckpoint();
  std::string StatusPath(const PodRecord& p) const {
    return flags_.root + "/status/default_" + p.name + ".json";
  }
  bool KubeletServing();

  // Invariants. Each returns the problems found (empty: holds).
  std::vector<std::string> DoubleDevices(const v1::ListPodResourcesResponse& list,
                                         const checkpoint::CheckpointData& ckpt);
  std::vector<std::string> HeldAllocations(const v1::ListPodResourcesResponse& list,
                                           const checkpoint::CheckpointData& ckpt);
  std::vector<std::string> GonePods(const v1::ListPodResourcesResponse& list,
                                    const checkpoint::CheckpointData& ckpt);
  std::vector<std::string> CapacityProblems();
  // Checks no-double-device at once and allocation-kept / gone-pod-freed
  // with a bound. Skipped while the kubelet is down.
  void CheckPods();
  // Restarts everything pending, waits for the agent to settle, then checks
  // every invariant, capacity and fds/threads included.
  void Settle();
  void SampleFdsThreads();

  void PrintReport(bool interrupted);

  Flags flags_;
  std::mt19937_64 rng_;
  Clock::time_point started_ = Clock::now();
  bool own_root_ = false;
  std::ofstream log_;

  std::vector<Plugin> plugins_;
  std::unique_ptr<ChildProcess> kubelet_;
  std::optional<Clock::time_point> kubelet_restart_at_;
  bool kubelet_baseline_taken_ = false;
  int base_fds_ = 0, base_threads_ = 0;
  int min_fds_ = 1 << 30, max_fds_ = 0, min_threads_ = 1 << 30, max_threads_ = 0;

  std::map<std::string, PodRecord> pods_;  // by name
  int next_pod_ = 0;

  std::map<std::string, int64_t> faults_;
  std::map<std::string, int64_t> checks_;
  std::map<std::string, int64_t> outcomes_;
  int64_t violations_ = 0;
};

int64_t& Bump(std::map<std::string, int64_t>& m, const std::string& key) { return ++m[key]; }

void Soak::Log(const std::string& line) {
  char t[32];
  std::snprintf(t, sizeof t, "%8.3f ", Elapsed());
  log_ << t << line << "\n";
  log_.flush();
}

void Soak::Violation(const std::string& kind, const std::string& detail) {
  ++violations_;
  char t[32];
  std::snprintf(t, sizeof t, "%.1f", Elapsed());
  std::cerr << "kdm_soak: VIOLATION [" << kind << "] at " << t << " s: " << detail << std::endl;
  Log("VIOLATION [" + kind + "] " + detail);
}

Status Soak::Setup() {
  if (flags_.root.empty()) {
    char tmpl[] = "/tmp/kdm-soak-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return UnavailableError("cannot create a temporary directory");
    flags_.root = tmpl;
    own_root_ = true;
  }
  std::error_code ec;
  for (const char* dir : {"", "/manifests", "/health", "/logs"}) {
    fs::create_directories(flags_.root + dir, ec);
    if (ec) return UnavailableError("cannot create " + flags_.root + dir + ": " + ec.message());
  }
  log_.open(flags_.root + "/logs/soak.log", std::ios::app);

  auto make_ids = [](const std::string& prefix, int n) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) ids.push_back(prefix + std::to_string(i));
    return ids;
  };
  const std::string& kdm = flags_.kdm;
  const std::string& root = flags_.root;
  struct Def {
    std::string resource, short_name;
    std::vector<std::string> ids;
    std::vector<std::string> extra;
    bool health;
  };
  std::vector<Def> defs = {
      {"nvidia.com/gpu", "gpu", make_ids("GPU", 8), {"--preset", "dgx1-v100"}, true},
      {"example.com/fpga", "fpga", make_ids("fpga-", 4), {"--count", "4"}, true},
      {"example.com/nic", "nic", make_ids("nic-", 8), {"--count", "8"}, false},
  };
  if (flags_.nic_fault != "none") {
    defs[2].extra.insert(defs[2].extra.end(), {"--fault", flags_.nic_fault});
  }
  // The hostile plugins: no health file; each serves dev-0 ... dev-3 (the
  // flapping one ends each flap with every device healthy).
  struct HostileDef {
    std::string resource, short_name;
    std::vector<std::string> extra;
  };
  const std::vector<HostileDef> hostile = {
      {"example.com/flappy", "flappy", {"--flap-ms", "1", "--flap-for", "5"}},
      {"example.com/hung", "hung", {"--hang", "allocate"}},
  };
  for (const auto& h : hostile) {
    Plugin p;
    p.resource = h.resource;
    p.ids = make_ids("dev-", 4);
    std::vector<std::string> argv = {flags_.hostile_plugin, "--plugin-dir",
                                     root + "/device-plugins", "--resource", h.resource,
                                     // Outlives the run (the soak stops it).
                                     "--lifetime", std::to_string(flags_.seconds + 600)};
    argv.insert(argv.end(), h.extra.begin(), h.extra.end());
    p.child = std::make_unique<ChildProcess>("plugin " + h.resource, argv,
                                             root + "/logs/" + h.short_name + "-plugin.log");
    plugins_.push_back(std::move(p));
  }
  for (auto& d : defs) {
    Plugin p;
    p.resource = d.resource;
    p.ids = d.ids;
    std::vector<std::string> argv = {kdm, "plugin", "--root", root, "--resource", d.resource};
    argv.insert(argv.end(), d.extra.begin(), d.extra.end());
    if (d.health) {
      p.health_file = root + "/health/" + d.short_name + ".json";
      argv.insert(argv.end(), {"--health-file", p.health_file});
    }
    p.child = std::make_unique<ChildProcess>("plugin " + d.resource, argv,
                                             root + "/logs/" + d.short_name + "-plugin.log");
    plugins_.push_back(std::move(p));
  }
  for (auto& p : plugins_) {
    if (!p.health_file.empty()) WriteHealthFile(p);
  }
  kubelet_ = std::make_unique<ChildProcess>(
      // A short deadline: pods of the hung plugin are rejected in 3 s.
      "kubelet", std::vector<std::string>{kdm, "kubelet", "--root", root, "--rpc-timeout", "3s"},
      root + "/logs/kubelet.log");
  StartKubelet();
  for (auto& p : plugins_) StartPlugin(p);
  return OkStatus();
}

void Soak::StartKubelet() {
  kubelet_restart_at_.reset();
  kubelet_baseline_taken_ = false;
  if (Status s = kubelet_->Start(); !s.ok()) {
    Violation("setup", "cannot start the kubelet: " + s.message());
    return;
  }
  Log("start kubelet pid=" + std::to_string(kubelet_->pid()));
}

void Soak::StartPlugin(Plugin& p) {
  p.restart_at.reset();
  if (Status s = p.child->Start(); !s.ok()) {
    Violation("setup", "cannot start the " + p.resource + " plugin: " + s.message());
    return;
  }
  Log("start plugin " + p.resource + " pid=" + std::to_string(p.child->pid()));
}

void Soak::Cleanup() {
  for (auto& p : plugins_) {
    if (p.child) (void)p.child->Stop(SIGKILL, 10s);
  }
  if (kubelet_) (void)kubelet_->Stop(SIGKILL, 10s);
  if (own_root_ && !flags_.keep && violations_ == 0 && !flags_.root.empty()) {
    std::error_code ec;
    fs::remove_all(flags_.root, ec);
    own_root_ = false;
  }
}

void Soak::Tick() {
  int status = 0;
  if (kubelet_->Reap(&status)) {
    Violation("process", "kdm kubelet exited on its own (" + DescribeWaitStatus(status) +
                             "); see " + flags_.root + "/logs/kubelet.log");
    kubelet_restart_at_ = Clock::now();
  }
  for (auto& p : plugins_) {
    if (p.child->Reap(&status)) {
      Violation("process", "the " + p.resource + " plugin exited on its own (" +
                               DescribeWaitStatus(status) + ")");
      p.restart_at = Clock::now();
    }
  }
  auto now = Clock::now();
  if (kubelet_restart_at_ && *kubelet_restart_at_ <= now) StartKubelet();
  for (auto& p : plugins_) {
    if (p.restart_at && *p.restart_at <= now) StartPlugin(p);
  }
}

bool Soak::Pause(std::chrono::milliseconds d) {
  auto end = Clock::now() + d;
  while (Clock::now() < end) {
    if (Stopping()) return false;
    Tick();
    std::this_thread::sleep_for(std::min<std::chrono::milliseconds>(
        20ms, std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()) + 1ms));
  }
  return !Stopping();
}

bool Soak::WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds bound) {
  auto end = Clock::now() + bound;
  while (!pred()) {
    if (Stopping() || Clock::now() > end) return false;
    Tick();
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

// ------------------------------------------------------------------ reading

std::unique_ptr<v1::PodResourcesLister::Stub> NewStub(const std::string& root) {
  // A fresh channel per call: after a kubelet restart an old channel would
  // sit in its reconnect back-off.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // --root may be relative: the wire layer's target reads it as a path.
  StatusOr<std::string> target = pluginapi::UnixSocketTarget(root + "/pod-resources/kubelet.sock");
  return v1::PodResourcesLister::NewStub(grpc::CreateCustomChannel(
      target.ok() ? *target : "unix:/nonexistent", grpc::InsecureChannelCredentials(), args));
}

StatusOr<v1::ListPodResourcesResponse> Soak::List() {
  auto stub = NewStub(flags_.root);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::ListPodResourcesResponse response;
  grpc::Status s = stub->List(&ctx, v1::ListPodResourcesRequest(), &response);
  if (!s.ok()) return UnavailableError("List: " + s.error_message());
  return response;
}

StatusOr<v1::AllocatableResourcesResponse> Soak::Allocatable() {
  auto stub = NewStub(flags_.root);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + 5s);
  v1::AllocatableResourcesResponse response;
  grpc::Status s =
      stub->GetAllocatableResources(&ctx, v1::AllocatableResourcesRequest(), &response);
  if (!s.ok()) return UnavailableError("GetAllocatableResources: " + s.error_message());
  return response;
}

StatusOr<checkpoint::CheckpointData> Soak::ReadCheckpoint() {
  KDM_ASSIGN_OR_RETURN(
      checkpoint::OpenResult opened,
      checkpoint::OpenStoreForRoot(
          flags_.root, checkpoint::StoreKind::kSqlite,
          {.create_if_missing = false, .quarantine_corrupt = false, .synchronous_full = false}));
  return opened.store->Load();
}

bool Soak::KubeletServing() { return kubelet_->running() && List().ok(); }

// ------------------------------------------------------------------ actions

std::string ManifestJson(const PodRecord& pod) {
  json init = json::array(), apps = json::array();
  for (const auto& c : pod.containers) {
    json limits = json::object();
    for (const auto& [r, n] : c.limits) limits[r] = n;
    json container = {{"name", c.name}, {"image", "soak"}, {"resources", {{"limits", limits}}}};
    (c.init ? init : apps).push_back(container);
  }
  json spec = {{"containers", apps}};
  if (!init.empty()) spec["initContainers"] = init;
  json j = {{"apiVersion", "v1"},
            {"kind", "Pod"},
            {"metadata", {{"name", pod.name}, {"uid", pod.uid}}},
            {"spec", spec}};
  return j.dump(2);
}

// Writes beside and renames in, so the agent never reads half a file.
bool WriteFileAtomically(const std::string& dir, const std::string& name, const std::string& text) {
  std::string tmp = dir + "/." + name + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << text;
    if (!out) return false;
  }
  std::error_code ec;
  fs::rename(tmp, dir + "/" + name, ec);
  return !ec;
}

void Soak::CreatePod() {
  PodRecord pod;
  pod.name = "pod-" + std::to_string(next_pod_++);
  pod.uid = "soak-" + std::to_string(flags_.seed) + "-" + pod.name;
  auto chance = [&](int percent) {
    return std::uniform_int_distribution<int>(0, 99)(rng_) < percent;
  };
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); };
  auto random_limits = [&] {
    std::map<std::string, int> limits;
    if (chance(55)) limits["nvidia.com/gpu"] = chance(5) ? 9 : pick(1, 4);
    if (chance(35)) limits["example.com/fpga"] = chance(5) ? 5 : pick(1, 2);
    if (chance(45)) limits["example.com/nic"] = chance(5) ? 9 : pick(1, 3);
    if (chance(8)) limits["example.com/flappy"] = pick(1, 2);
    if (chance(3)) limits["example.com/hung"] = 1;
    if (limits.empty()) limits["example.com/nic"] = pick(1, 2);
    return limits;
  };
  if (chance(20)) {
    ContainerSpec init{"init", true, {}};
    if (chance(50)) {
      init.limits["nvidia.com/gpu"] = pick(1, 2);
    } else {
      init.limits["example.com/nic"] = pick(1, 2);
    }
    pod.containers.push_back(init);
  }
  pod.containers.push_back({"main", false, random_limits()});
  if (chance(30)) pod.containers.push_back({"side", false, random_limits()});

  if (!WriteFileAtomically(flags_.root + "/manifests", pod.name + ".json", ManifestJson(pod))) {
    Violation("setup", "cannot write the manifest of " + pod.name);
    return;
  }
  Bump(faults_, "pod creates");
  std::string what;
  for (const auto& c : pod.containers) {
    what += " " + c.name + ":";
    for (const auto& [r, n] : c.limits) what += r + "=" + std::to_string(n) + ",";
  }
  Log("create " + pod.name + what);
  const std::string name = pod.name;
  pods_[name] = std::move(pod);
  // Wait for the admission result while the agent runs (a pod waiting for
  // a restarted plugin gets it once the plugin is back: bounded).
  if (kubelet_->running()) {
    PodRecord& p = pods_[name];
    bool seen =
        WaitFor([&] { return fs::exists(StatusPath(p)) || !kubelet_->running(); }, kSettleBound);
    if (!seen && !Stopping()) {
      Violation("admission",
                name + ": no status file within " + std::to_string(kSettleBound.count()) + " s");
    }
  }
}

void Soak::DeletePod() {
  std::vector<std::string> present;
  for (const auto& [name, p] : pods_) {
    if (p.manifest_present) present.push_back(name);
  }
  if (present.empty()) return;
  const std::string name =
      present[std::uniform_int_distribution<size_t>(0, present.size() - 1)(rng_)];
  PodRecord& p = pods_[name];
  std::error_code ec;
  fs::remove(flags_.root + "/manifests/" + name + ".json", ec);
  p.manifest_present = false;
  Bump(faults_, "pod deletes");
  Log("delete " + name);
  if (kubelet_->running()) {
    bool gone =
        WaitFor([&] { return !fs::exists(StatusPath(p)) || !kubelet_->running(); }, kSettleBound);
    if (!gone && !Stopping()) {
      Violation("gone-pod-freed", name + ": status file still there " +
                                      std::to_string(kSettleBound.count()) +
                                      " s after its manifest was removed");
    }
  }
}

void Soak::DuplicateUid() {
  if (!kubelet_->running()) return;
  std::vector<std::string> admitted;
  for (const auto& [name, p] : pods_) {
    if (p.manifest_present && p.outcome == "admitted" && !p.rejected_after_admission) {
      admitted.push_back(name);
    }
  }
  if (admitted.empty()) return;
  const PodRecord& original =
      pods_[admitted[std::uniform_int_distribution<size_t>(0, admitted.size() - 1)(rng_)]];
  PodRecord dup = original;
  dup.name = "dup-" + std::to_string(next_pod_++);
  const std::string file = dup.name + ".json";
  const std::string status = flags_.root + "/status/manifest_" + file + ".json";
  if (!WriteFileAtomically(flags_.root + "/manifests", file, ManifestJson(dup))) {
    Violation("setup", "cannot write the manifest of " + dup.name);
    return;
  }
  Bump(faults_, "duplicate-uid manifests");
  Log("duplicate " + dup.name + " uid=" + dup.uid + " (of " + original.name + ")");
  std::string reason;
  bool judged = WaitFor(
      [&] {
        if (!kubelet_->running()) return true;
        StatusOr<fakes::PodStatus> judged = fakes::ReadPodStatusFile(status);
        if (!judged.ok()) return false;
        reason = judged->reason;
        return true;
      },
      kSettleBound);
  if (kubelet_->running() && !Stopping()) {
    if (!judged) {
      Violation("duplicate-uid", dup.name + ": no status file within " +
                                     std::to_string(kSettleBound.count()) + " s");
    } else if (reason != "DuplicatePod") {
      Violation("duplicate-uid", dup.name + " (uid of " + original.name +
                                     ") was not rejected as DuplicatePod: reason \"" + reason +
                                     "\"");
    }
    if (fs::exists(flags_.root + "/status/default_" + dup.name + ".json")) {
      Violation("duplicate-uid", dup.name + " got a pod status of its own (admitted?)");
    }
  }
  std::error_code ec;
  fs::remove(flags_.root + "/manifests/" + file, ec);
  if (kubelet_->running()) {
    WaitFor([&] { return !fs::exists(status) || !kubelet_->running(); }, kSettleBound);
  }
  // CheckPods (after every action) finds any device the removal freed.
}

void Soak::WriteHealthFile(Plugin& p) {
  json j = json::object();
  for (const auto& id : p.unhealthy) j[id] = "Unhealthy";
  std::string name = fs::path(p.health_file).filename().string();
  if (!WriteFileAtomically(flags_.root + "/health", name, j.dump())) {
    Violation("setup", "cannot write " + p.health_file);
  }
}

void Soak::FlipHealth() {
  std::vector<Plugin*> with_health;
  for (auto& p : plugins_) {
    if (!p.health_file.empty()) with_health.push_back(&p);
  }
  Plugin& p = *with_health[std::uniform_int_distribution<size_t>(0, with_health.size() - 1)(rng_)];
  std::string what;
  if (!p.unhealthy.empty() && std::uniform_int_distribution<int>(0, 9)(rng_) == 0) {
    p.unhealthy.clear();
    what = "all healthy";
  } else {
    const std::string& id = p.ids[std::uniform_int_distribution<size_t>(0, p.ids.size() - 1)(rng_)];
    if (p.unhealthy.erase(id)) {
      what = id + " healthy";
    } else {
      p.unhealthy.insert(id);
      what = id + " unhealthy";
    }
  }
  WriteHealthFile(p);
  Bump(faults_, "health flips");
  Log("health " + p.resource + ": " + what);
}

void Soak::KillPlugin() {
  std::vector<Plugin*> up;
  for (auto& p : plugins_) {
    if (p.child->running()) up.push_back(&p);
  }
  if (up.empty()) return;
  Plugin& p = *up[std::uniform_int_distribution<size_t>(0, up.size() - 1)(rng_)];
  (void)p.child->Stop(SIGKILL, 10s);
  auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(100, 3000)(rng_));
  p.restart_at = Clock::now() + delay;
  Bump(faults_, "plugin SIGKILLs");
  Log("SIGKILL plugin " + p.resource + ", restart in " + std::to_string(delay.count()) + " ms");
}

void Soak::KillKubelet(int sig) {
  if (!kubelet_->running()) return;
  const pid_t pid = kubelet_->pid();
  int status = kubelet_->Stop(sig, sig == SIGKILL ? 10s : 30s);
  if (sig == SIGKILL) {
    Bump(faults_, "kubelet SIGKILLs");
  } else {
    Bump(faults_, "kubelet SIGTERMs");
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      Violation("process", "kdm kubelet (pid " + std::to_string(pid) + ") after SIGTERM: " +
                               DescribeWaitStatus(status) + " (expected exit 0)");
    }
  }
  auto delay = std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 1500)(rng_));
  kubelet_restart_at_ = Clock::now() + delay;
  Log(std::string(sig == SIGKILL ? "SIGKILL" : "SIGTERM") + " kubelet pid=" + std::to_string(pid) +
      " (" + DescribeWaitStatus(status) + "), restart in " + std::to_string(delay.count()) + " ms");
}

// ------------------------------------------------------------------ invariants

// Devices of every container of every pod in `list`, by pod name.
std::map<std::string, ContainerDevicesMap> ListDevices(const v1::ListPodResourcesResponse& list) {
  std::map<std::string, ContainerDevicesMap> out;
  for (const auto& pod : list.pod_resources()) {
    ContainerDevicesMap& m = out[pod.name()];
    for (const auto& c : pod.containers()) {
      for (const auto& d : c.devices()) {
        auto& ids = m[c.name()][d.resource_name()];
        ids.insert(ids.end(), d.device_ids().begin(), d.device_ids().end());
      }
    }
    for (auto& [c, d] : m) {
      for (auto& [r, ids] : d) {
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      }
    }
  }
  return out;
}

// Devices of every container of every pod in the checkpoint, by pod uid.
std::map<std::string, ContainerDevicesMap> CheckpointDevices(const checkpoint::CheckpointData& c) {
  std::map<std::string, ContainerDevicesMap> out;
  for (const auto& e : c.entries) {
    auto& ids = out[e.pod_uid][e.container_name][e.resource_name];
    for (const auto& [numa, v] : e.device_ids) ids.insert(ids.end(), v.begin(), v.end());
    std::sort(ids.begin(), ids.end());
  }
  return out;
}

ContainerDevicesMap AppContainersOnly(const ContainerDevicesMap& all, const PodRecord& pod) {
  ContainerDevicesMap out;
  for (const auto& c : pod.containers) {
    auto it = all.find(c.name);
    if (!c.init && it != all.end() && !it->second.empty()) out[c.name] = it->second;
  }
  return out;
}

std::vector<std::string> Soak::DoubleDevices(const v1::ListPodResourcesResponse& list,
                                             const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  std::map<std::string, std::set<std::string>> known;
  for (const auto& p : plugins_) known[p.resource] = {p.ids.begin(), p.ids.end()};
  // pod-resources: one holder per device (it reports app containers only).
  std::map<std::string, std::string> holder;
  for (const auto& pod : list.pod_resources()) {
    for (const auto& c : pod.containers()) {
      std::set<std::string> in_container;
      for (const auto& d : c.devices()) {
        for (const auto& id : d.device_ids()) {
          std::string key = d.resource_name() + "/" + id;
          if (!known[d.resource_name()].count(id)) {
            problems.push_back("List: " + pod.name() + "/" + c.name() + " holds " + key +
                               ", which no plugin has");
          }
          if (!in_container.insert(key).second) continue;  // one entry per NUMA node
          std::string who = pod.name() + "/" + c.name();
          auto [it, inserted] = holder.emplace(key, who);
          if (!inserted)
            problems.push_back("List: " + key + " held by " + it->second + " and " + who);
        }
      }
    }
  }
  // checkpoint: one pod per device, and within a pod one app container
  // (a finished init container's devices are handed on to app containers).
  std::map<std::string, const PodRecord*> by_uid;
  for (const auto& [name, p] : pods_) by_uid[p.uid] = &p;
  std::map<std::string, std::pair<std::string, std::string>>
      ckpt_holder;  // key -> (uid, app container)
  for (const auto& e : ckpt.entries) {
    auto pit = by_uid.find(e.pod_uid);
    bool init = false;
    if (pit != by_uid.end()) {
      for (const auto& c : pit->second->containers) {
        if (c.name == e.container_name) init = c.init;
      }
    }
    for (const auto& [numa, ids] : e.device_ids) {
      for (const auto& id : ids) {
        std::string key = e.resource_name + "/" + id;
        auto it = ckpt_holder.find(key);
        if (it == ckpt_holder.end()) {
          ckpt_holder[key] = {e.pod_uid, init ? "" : e.container_name};
          continue;
        }
        if (it->second.first != e.pod_uid) {
          problems.push_back("checkpoint: " + key + " held by pods " + it->second.first + " and " +
                             e.pod_uid);
        } else if (!init && !it->second.second.empty() && it->second.second != e.container_name) {
          problems.push_back("checkpoint: " + key + " held by containers " + it->second.second +
                             " and " + e.container_name + " of pod " + e.pod_uid);
        } else if (!init) {
          it->second.second = e.container_name;
        }
      }
    }
  }
  return problems;
}

std::vector<std::string> Soak::HeldAllocations(const v1::ListPodResourcesResponse& list,
                                               const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  auto listed = ListDevices(list);
  auto stored = CheckpointDevices(ckpt);
  for (auto& [name, pod] : pods_) {
    if (!pod.manifest_present || !pod.first_devices) continue;
    const ContainerDevicesMap& first = *pod.first_devices;
    ContainerDevicesMap want_listed = AppContainersOnly(first, pod);
    auto lit = listed.find(name);
    ContainerDevicesMap got_listed;
    if (lit != listed.end()) got_listed = AppContainersOnly(lit->second, pod);
    if (lit == listed.end() && !want_listed.empty()) {
      problems.push_back(name + " is Admitted but not in List (first given " +
                         DevicesText(want_listed) + ")");
    } else if (got_listed != want_listed) {
      problems.push_back(name + ": List shows " + DevicesText(got_listed) + ", first given " +
                         DevicesText(want_listed));
    }
    auto sit = stored.find(pod.uid);
    ContainerDevicesMap got_stored = sit == stored.end() ? ContainerDevicesMap{} : sit->second;
    if (got_stored != first) {
      problems.push_back(name + ": checkpoint holds " + DevicesText(got_stored) + ", first given " +
                         DevicesText(first));
    }
  }
  return problems;
}

std::vector<std::string> Soak::GonePods(const v1::ListPodResourcesResponse& list,
                                        const checkpoint::CheckpointData& ckpt) {
  std::vector<std::string> problems;
  std::map<std::string, const PodRecord*> by_uid;
  for (const auto& [name, p] : pods_) by_uid[p.uid] = &p;
  for (const auto& pod : list.pod_resources()) {
    auto it = pods_.find(pod.name());
    if (it == pods_.end()) {
      problems.push_back("List shows a pod the soak never made: " + pod.name());
    } else if (!it->second.manifest_present) {
      bool holds = false;
      for (const auto& c : pod.containers()) holds = holds || c.devices_size() > 0;
      if (holds) problems.push_back("List: " + pod.name() + " holds devices, its manifest is gone");
    }
  }
  std::set<std::string> reported;
  for (const auto& e : ckpt.entries) {
    if (!reported.insert(e.pod_uid).second) continue;
    auto it = by_uid.find(e.pod_uid);
    if (it == by_uid.end()) {
      problems.push_back("checkpoint holds devices of an unknown pod uid " + e.pod_uid);
    } else if (!it->second->manifest_present) {
      problems.push_back("checkpoint: " + it->second->name +
                         " holds devices, its manifest is gone");
    }
  }
  return problems;
}

void Soak::CheckPods() {
  if (!kubelet_->running()) return;
  auto end = Clock::now() + kSettleBound;
  std::vector<std::string> held_problems, gone_problems, read_problems;
  bool held_ok = false, gone_ok = false;
  while (true) {
    // Status files before and after the reads: a pod whose status changed
    // meanwhile is judged on the next round.
    std::map<std::string, std::optional<PodStatusView>> before;
    for (const auto& [name, p] : pods_) {
      if (p.manifest_present) before[name] = ReadPodStatus(StatusPath(p));
    }
    auto list = List();
    auto ckpt = list.ok() ? ReadCheckpoint() : StatusOr<checkpoint::CheckpointData>(list.status());
    read_problems.clear();
    if (!list.ok() || !ckpt.ok()) {
      read_problems.push_back(!list.ok() ? list.status().message() : ckpt.status().message());
    } else {
      bool stable = true;
      for (auto& [name, view] : before) {
        PodRecord& p = pods_[name];
        auto after = ReadPodStatus(StatusPath(p));
        if (view.has_value() != after.has_value() || (view && view->text != after->text)) {
          stable = false;
          continue;
        }
        if (!view) continue;
        p.status_seen = true;
        if (view->phase == "Admitted") {
          if (!p.first_devices) {
            p.first_devices = view->devices;
            p.outcome = "admitted";
            Bump(outcomes_, "pods admitted");
          } else if (view->devices != *p.first_devices) {
            Violation("allocation-kept", name + ": status now says " + DevicesText(view->devices) +
                                             ", first given " + DevicesText(*p.first_devices));
            p.first_devices = view->devices;
          }
        } else if (view->phase == "Rejected") {
          if (p.outcome.empty()) {
            p.outcome = "rejected";
            Bump(outcomes_, "pods rejected");
          }
          if (p.first_devices && !p.rejected_after_admission) {
            p.rejected_after_admission = true;
            // After a restart the kubelet re-admits each pod; devices that
            // turned unhealthy meanwhile make that fail
            // (docs/kubelet-rules.md#allocation, step 2).
            if (view->message.find("no longer healthy") != std::string::npos) {
              Bump(outcomes_, "re-admissions refused (devices unhealthy)");
            } else {
              Violation("allocation-kept", name + " was Admitted with " +
                                               DevicesText(*p.first_devices) +
                                               ", then Rejected: " + view->message);
            }
          }
          if (p.first_devices) p.first_devices.reset();
        }
      }
      std::vector<std::string> doubles = DoubleDevices(*list, *ckpt);
      Count("no-double-device");
      if (!doubles.empty()) {
        // A transient view of List (pods listed one by one) is confirmed
        // with a second read before it counts.
        auto list2 = List();
        auto ckpt2 = ReadCheckpoint();
        if (list2.ok() && ckpt2.ok()) doubles = DoubleDevices(*list2, *ckpt2);
        for (const auto& d : doubles) Violation("no-double-device", d);
      }
      if (stable) {
        held_problems = HeldAllocations(*list, *ckpt);
        held_ok = held_ok || held_problems.empty();
      }
      gone_problems = GonePods(*list, *ckpt);
      gone_ok = gone_ok || gone_problems.empty();
    }
    if (held_ok && gone_ok) break;
    if (Stopping() || !kubelet_->running()) return;
    if (Clock::now() > end) break;
    Tick();
    std::this_thread::sleep_for(100ms);
  }
  Count("allocation-kept");
  Count("gone-pod-freed");
  if (!read_problems.empty() && (!held_ok || !gone_ok)) {
    Violation("read", "cannot read the agent for " + std::to_string(kSettleBound.count()) +
                          " s: " + read_problems.front());
    return;
  }
  if (!held_ok) {
    for (const auto& p : held_problems) Violation("allocation-kept", p);
    if (held_problems.empty()) Violation("allocation-kept", "status files never stable");
  }
  if (!gone_ok) {
    for (const auto& p : gone_problems) Violation("gone-pod-freed", p);
  }
}

std::vector<std::string> Soak::CapacityProblems() {
  std::vector<std::string> problems;
  auto alloc = Allocatable();
  if (!alloc.ok()) return {alloc.status().message()};
  std::map<std::string, std::set<std::string>> got;
  for (const auto& d : alloc->devices()) {
    got[d.resource_name()].insert(d.device_ids().begin(), d.device_ids().end());
  }
  StatusOr<fakes::NodeStatus> node = fakes::ReadNodeStatusFile(flags_.root + "/status/node.json");
  for (const auto& p : plugins_) {
    std::set<std::string> want;
    for (const auto& id : p.ids) {
      if (!p.unhealthy.count(id)) want.insert(id);
    }
    if (got[p.resource] != want) {
      std::string g, w;
      for (const auto& id : got[p.resource]) g += id + ",";
      for (const auto& id : want) w += id + ",";
      problems.push_back(p.resource + ": allocatable ids [" + g +
                         "], the plugin reports healthy [" + w + "]");
    }
    int64_t capacity = -1, allocatable = -1;
    if (node.ok()) {
      auto it = node->capacity.resources.find(p.resource);
      if (it != node->capacity.resources.end()) {
        capacity = it->second.capacity;
        allocatable = it->second.allocatable;
      }
    }
    if (capacity != static_cast<int64_t>(p.ids.size()) ||
        allocatable != static_cast<int64_t>(want.size())) {
      problems.push_back(p.resource + ": node.json capacity " + std::to_string(capacity) +
                         " allocatable " + std::to_string(allocatable) + ", the plugin reports " +
                         std::to_string(p.ids.size()) + " devices, " + std::to_string(want.size()) +
                         " healthy");
    }
  }
  for (const auto& [resource, ids] : got) {
    bool known = false;
    for (const auto& p : plugins_) known = known || p.resource == resource;
    if (!known && !ids.empty())
      problems.push_back("allocatable lists unknown resource " + resource);
  }
  return problems;
}

int CountDir(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return -1;
  int n = 0;
  while (struct dirent* e = ::readdir(d)) {
    if (e->d_name[0] != '.') ++n;
  }
  ::closedir(d);
  return n;
}

void Soak::SampleFdsThreads() {
  if (!kubelet_->running()) return;
  const std::string proc = "/proc/" + std::to_string(kubelet_->pid());
  int fds = CountDir(proc + "/fd"), threads = CountDir(proc + "/task");
  if (fds < 0 || threads < 0) return;
  min_fds_ = std::min(min_fds_, fds);
  max_fds_ = std::max(max_fds_, fds);
  min_threads_ = std::min(min_threads_, threads);
  max_threads_ = std::max(max_threads_, threads);
  Count("fds-threads");
  Log("kubelet fds=" + std::to_string(fds) + " threads=" + std::to_string(threads));
  if (!kubelet_baseline_taken_) {
    kubelet_baseline_taken_ = true;
    base_fds_ = fds;
    base_threads_ = threads;
    return;
  }
  if (fds > base_fds_ + kFdSlack) {
    Violation("fds-threads", "kubelet pid " + std::to_string(kubelet_->pid()) + " has " +
                                 std::to_string(fds) + " open fds, " + std::to_string(base_fds_) +
                                 " when it first settled (slack " + std::to_string(kFdSlack) + ")");
    base_fds_ = fds;  // report growth once per step
  }
  if (threads > base_threads_ + kThreadSlack) {
    Violation("fds-threads", "kubelet pid " + std::to_string(kubelet_->pid()) + " has " +
                                 std::to_string(threads) + " threads, " +
                                 std::to_string(base_threads_) + " when it first settled (slack " +
                                 std::to_string(kThreadSlack) + ")");
    base_threads_ = threads;
  }
}

void Soak::Settle() {
  if (kubelet_restart_at_) kubelet_restart_at_ = Clock::now();
  for (auto& p : plugins_) {
    if (p.restart_at) p.restart_at = Clock::now();
  }
  Tick();
  if (!WaitFor([&] { return KubeletServing(); }, kSettleBound)) {
    if (!Stopping()) Violation("read", "the pod-resources API does not answer");
    return;
  }
  // Every manifest has its status, every removed one lost it.
  bool statuses = WaitFor(
      [&] {
        for (const auto& [name, p] : pods_) {
          if (fs::exists(StatusPath(p)) != p.manifest_present) return false;
        }
        return true;
      },
      kSettleBound);
  if (Stopping()) return;
  if (!statuses) {
    for (const auto& [name, p] : pods_) {
      if (fs::exists(StatusPath(p)) != p.manifest_present) {
        Violation(p.manifest_present ? "admission" : "gone-pod-freed",
                  name + (p.manifest_present ? ": no status file" : ": status file not removed") +
                      " " + std::to_string(kSettleBound.count()) + " s after settling began");
      }
    }
  }
  std::vector<std::string> capacity;
  bool ok = WaitFor(
      [&] {
        capacity = CapacityProblems();
        return capacity.empty();
      },
      kSettleBound);
  if (Stopping()) return;
  Count("capacity");
  if (!ok) {
    for (const auto& c : capacity) Violation("capacity", c);
  }
  CheckPods();
  SampleFdsThreads();
}

// ------------------------------------------------------------------ run

void Soak::PrintReport(bool interrupted) {
  // Garbage preferred answers, as the kubelet logged its fallbacks.
  int64_t garbage = 0, fallbacks = 0;
  {
    std::ifstream in(flags_.root + "/logs/kubelet.log");
    std::string line;
    while (std::getline(in, line)) {
      if (line.find("event=preferred_allocation_fallback") == std::string::npos) continue;
      ++fallbacks;
      if (line.find("reason=invalid_answer") != std::string::npos) ++garbage;
    }
  }
  faults_["garbage preferred answers (kubelet fell back)"] = garbage;
  faults_["preferred fallbacks, all reasons"] = fallbacks;
  faults_["kubelet starts"] = kubelet_->starts();
  int64_t plugin_starts = 0;
  for (const auto& p : plugins_) plugin_starts += p.child->starts();
  faults_["plugin starts"] = plugin_starts;

  auto row = [](const std::string& k, int64_t v) {
    std::printf("  %-48s %10lld\n", k.c_str(), static_cast<long long>(v));
  };
  std::printf("\nkdm_soak: %.1f s, seed %llu%s\n", Elapsed(),
              static_cast<unsigned long long>(flags_.seed), interrupted ? " (interrupted)" : "");
  std::printf("faults injected\n");
  for (const auto& [k, v] : faults_) row(k, v);
  std::printf("outcomes\n");
  for (const auto& [k, v] : outcomes_) row(k, v);
  std::printf("invariants checked\n");
  int64_t total = 0;
  for (const auto& [k, v] : checks_) {
    row(k, v);
    total += v;
  }
  row("total", total);
  std::printf(
      "kubelet fds %d..%d, threads %d..%d (slack %d / %d over each start's first "
      "settled sample)\n",
      max_fds_ ? min_fds_ : 0, max_fds_, max_threads_ ? min_threads_ : 0, max_threads_, kFdSlack,
      kThreadSlack);
  std::printf("violations: %lld\n", static_cast<long long>(violations_));
  if (violations_ > 0 || flags_.keep || !own_root_) {
    std::printf("root kept: %s (logs in logs/)\n", flags_.root.c_str());
  }
  std::fflush(stdout);
}

int Soak::Run() {
  std::printf("kdm_soak: seed %llu, %lld s, kdm %s\n", static_cast<unsigned long long>(flags_.seed),
              static_cast<long long>(flags_.seconds), flags_.kdm.c_str());
  std::fflush(stdout);
  if (Status s = Setup(); !s.ok()) {
    std::cerr << "kdm_soak: " << s.message() << "\n";
    return 1;
  }
  std::printf("kdm_soak: root %s\n", flags_.root.c_str());
  std::fflush(stdout);
  Settle();
  const auto deadline = started_ + std::chrono::seconds(flags_.seconds);
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); };
  int since_settle = 0;
  while (Clock::now() < deadline && !Stopping()) {
    int present = 0;
    for (const auto& [name, p] : pods_) present += p.manifest_present;
    int roll = pick(100);
    // More deletes when many pods are there, so that churn goes on.
    int create = present > 8 ? 20 : 38;
    if (roll < create) {
      CreatePod();
    } else if (roll < 62) {
      DeletePod();
    } else if (roll < 75) {
      FlipHealth();
    } else if (roll < 85) {
      KillPlugin();
    } else if (roll < 90) {
      KillKubelet(SIGKILL);
    } else if (roll < 92) {
      KillKubelet(SIGTERM);
    } else if (roll < 95) {
      DuplicateUid();
    } else {
      ++since_settle;  // quiet: a pause below
    }
    if (Stopping()) break;
    CheckPods();
    if (++since_settle >= 10 || pick(100) < 8) {
      Settle();
      since_settle = 0;
    }
    if (!Pause(std::chrono::milliseconds(pick(300)))) break;
  }
  const bool interrupted = Stopping();
  if (!interrupted) Settle();
  // A clean stop: SIGTERM must end the kubelet with exit 0.
  if (!interrupted && kubelet_->running()) {
    int status = kubelet_->Stop(SIGTERM, 30s);
    if (!(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      Violation("process", "kdm kubelet at the end, after SIGTERM: " + DescribeWaitStatus(status));
    }
  }
  for (auto& p : plugins_) {
    if (p.child->running()) {
      int status = p.child->Stop(SIGTERM, 30s);
      if (!interrupted && !(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        Violation("process",
                  "the " + p.resource + " plugin after SIGTERM: " + DescribeWaitStatus(status));
      }
    }
  }
  PrintReport(interrupted);
  if (interrupted) std::cerr << "kdm_soak: interrupted by signal " << g_stop_signal << "\n";
  return (violations_ == 0 && !interrupted) ? 0 : 1;
}

}  // namespace
}  // namespace kdm::soak

int main(int argc, char** argv) {
  using namespace kdm::soak;
  Flags flags;
  bool help = false;
  if (kdm::Status s = ParseFlags(argc, argv, &flags, &help); !s.ok()) {
    std::cerr << "kdm_soak: " << s.message() << "\n" << kUsage;
    return 2;
  }
  if (help) {
    std::cout << kUsage;
    return 0;
  }
  if (!flags.seed_given) {
    flags.seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count());
  }
  struct sigaction sa = {};
  sa.sa_handler = OnStopSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  Soak soak(std::move(flags));
  return soak.Run();
}
