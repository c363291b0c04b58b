// The soak driver's shared parts (test/soak/): the run's flags, the model of
// the pods and plugins it made, and the `Soak` class whose work is split by
// concern over three files:
//   soak_supervision.cc  the processes: start, reap, restart, stop, and the
//                        run's log and violation counter;
//   soak_faults.cc       the fault schedule and each fault (pods made and
//                        removed, health flipped, processes killed);
//   soak_invariants.cc   the readers of the agent (pod-resources, checkpoint,
//                        status files, /proc) and the invariants over them;
// soak_main.cc parses the flags, runs the loop and prints the report. The
// file comment of soak_main.cc lists the faults and the invariants.
#ifndef KDM_TEST_SOAK_SOAK_H_
#define KDM_TEST_SOAK_SOAK_H_

#include <signal.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kdm/base/status.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/pod_resources_client.h"
#include "kdm/test/soak/child_process.h"
#include "kdm/test/soak/soak_extender.h"

namespace kdm::soak {

using Clock = std::chrono::steady_clock;

// Set by SIGINT / SIGTERM: the run stops at the next step.
extern volatile sig_atomic_t g_stop_signal;

// Upper bound of every wait for the agent to settle (a loaded 2-core
// machine: generous).
inline constexpr std::chrono::seconds kSettleBound{45};
// How much the kubelet's fds / threads may exceed its first settled sample.
inline constexpr int kFdSlack = 16;
inline constexpr int kThreadSlack = 8;

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

// The pod status file at `path`, parsed (nullopt: no file; phase
// "<unparsable>": a file that does not parse).
std::optional<PodStatusView> ReadPodStatus(const std::string& path);
// "{c1:res=id,id;res2=id c2:...}", for messages.
std::string DevicesText(const ContainerDevicesMap& m);

inline int64_t& Bump(std::map<std::string, int64_t>& m, const std::string& key) { return ++m[key]; }

class Soak {
 public:
  using PodList = std::vector<devicemanager::PodResources>;

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

  // A uniform pick in [0, n).
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  // The fault schedule: picks one fault at random and injects it; false
  // when the pick was a quiet step.
  bool InjectFault();
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
  StatusOr<std::vector<devicemanager::PodResources>> List();
  StatusOr<std::vector<devicemanager::ContainerDevices>> Allocatable();
  StatusOr<checkpoint::CheckpointData> ReadCheckpoint();
  std::string StatusPath(const PodRecord& p) const {
    return flags_.root + "/status/default_" + p.name + ".json";
  }
  bool KubeletServing();

  // Invariants. Each returns the problems found (empty: holds).
  std::vector<std::string> DoubleDevices(const PodList& list,
                                         const checkpoint::CheckpointData& ckpt);
  std::vector<std::string> HeldAllocations(const PodList& list,
                                           const checkpoint::CheckpointData& ckpt);
  std::vector<std::string> GonePods(const PodList& list, const checkpoint::CheckpointData& ckpt);
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

  // The cluster half: `kdm extender` under a hostile node and API server.
  std::unique_ptr<ExtenderUnderAttack> extender_;
  std::mt19937_64 extender_rng_{flags_.seed + 1};  // its own: node faults keep their order

  std::map<std::string, PodRecord> pods_;  // by name
  int next_pod_ = 0;

  std::map<std::string, int64_t> faults_;
  std::map<std::string, int64_t> checks_;
  std::map<std::string, int64_t> outcomes_;
  int64_t violations_ = 0;
};

}  // namespace kdm::soak

#endif  // KDM_TEST_SOAK_SOAK_H_
