#include "kdm/fakes/node_agent.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <utility>

#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/log_value.h"
#include "kdm/base/sync.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/metrics.h"
#include "kdm/fakes/admission_queue.h"
#include "kdm/fakes/manifest_watcher.h"
#include "kdm/fakes/pod_manifest.h"
#include "kdm/fakes/status_file.h"
#include "kdm/k8s/names.h"
#include "kdm/k8s/requirements.h"
#include "kdm/pluginapi/api_rules.h"

namespace kdm::fakes {
namespace {

namespace asio = boost::asio;
namespace dm = devicemanager;
using namespace std::chrono_literals;

constexpr auto kNodeRefreshInterval = 250ms;
// However fast health changes arrive, the node status is rewritten and the
// pods waiting for plugins are retried at most this often (latest state wins).
constexpr auto kHealthRefreshInterval = 100ms;
// `event=device_health` lines per resource per second; the rest are counted.
constexpr int kHealthLogBurst = 20;

Status MakeDir(const std::string& dir, mode_t mode) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return UnavailableError("cannot create directory " + dir + ": " + ec.message());
  if (!std::filesystem::is_directory(dir, ec)) {
    return FailedPreconditionError(dir + " exists and is not a directory");
  }
  ::chmod(dir.c_str(), mode);
  return OkStatus();
}

std::string DevicesText(const std::map<std::string, std::vector<std::string>>& devices) {
  std::string out;
  for (const auto& [resource, ids] : devices) {
    if (!out.empty()) out += ";";
    out += resource + "=";
    for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + ids[i];
  }
  return out;
}

// What an admission worker found out; handed to the io thread.
struct AdmissionResult {
  Status status;
  std::vector<ContainerStatus> containers;  // when status is OK
  // The pod asks for a resource that no plugin has registered (yet).
  bool unregistered = false;
  // The pod asks for a resource that is known but has no devices (restored
  // from the checkpoint; its plugin has not registered again yet).
  bool resource_without_devices = false;
};

class NodeAgentImpl final : public NodeAgent {
 public:
  explicit NodeAgentImpl(Options options) : options_(std::move(options)) {
    status_dir_ = options_.root + "/status";
    manifest_dir_ = options_.root + "/manifests";
  }
  ~NodeAgentImpl() override { Stop(); }

  Status Init();
  void Stop() override;
  int metrics_port() const override { return metrics_server_ ? metrics_server_->port() : 0; }
  const dm::Manager& manager() const override { return *manager_; }
  dm::Metrics* metrics() const override { return metrics_.get(); }
  std::vector<dm::ActivePod> ActivePods() const override {
    kdm::MutexLock lock(&active_mu_);
    std::vector<dm::ActivePod> out;
    for (const auto& [uid, pod] : active_) out.push_back(pod);
    return out;
  }

 private:
  enum class PodState {
    kAdmitted,
    kRejected,
    kRecovering,  // waiting for its plugins to register
    kAdmitting,   // an admission worker runs it now
    kPending,     // waits for another file's admission of the same uid to end
  };
  // One manifest file, as last acted on.
  struct FileEntry {
    size_t content_hash = 0;
    std::string status_file;     // file name under status/
    std::optional<dm::Pod> pod;  // set when the manifest parsed
    PodState state = PodState::kRejected;
    // Identifies the admission now running for this entry (kAdmitting).
    uint64_t generation = 0;
    bool waiting_logged = false;
  };
  // The admission running for a pod uid (at most one per uid at a time).
  struct InFlight {
    std::string file_name;
    uint64_t generation = 0;
  };

  std::set<std::string> ActiveUids() const {
    kdm::MutexLock lock(&active_mu_);
    std::set<std::string> out = startup_uids_;
    for (const auto& [uid, pod] : active_) out.insert(uid);
    return out;
  }
  void SetActive(const dm::Pod& pod) {
    kdm::MutexLock lock(&active_mu_);
    active_[pod.uid] = dm::ActivePodOf(pod);
  }
  void ClearActive(const std::string& uid) {
    kdm::MutexLock lock(&active_mu_);
    active_.erase(uid);
  }

  // Admission workers (no agent state touched: only the Manager, which is
  // thread-safe, and the pod copy they were given).
  AdmissionResult RunAdmission(const dm::Pod& pod);

  // All below run on the io thread.
  void OnManifestEvent(const ManifestWatcher::Event& e);
  void ForgetFile(const std::string& file_name, bool delete_status);
  // Hands the entry's pod to an admission worker (or parks it as kPending
  // while another admission of its uid runs).
  void AdmitFile(const std::string& file_name, FileEntry& entry);
  void OnAdmissionDone(const std::string& file_name, uint64_t generation, const std::string& uid,
                       bool recovering, AdmissionResult result);
  void FinishAdmission(const std::string& file_name, FileEntry& entry, bool recovering,
                       AdmissionResult result);
  // True when a file other than `except_file` has an entry for `uid` that
  // holds (or is being given) devices.
  bool UidHeldByOtherFile(const std::string& uid, const std::string& except_file) const;
  void RemovePodDevices(const std::string& uid);
  // At startup: the phase in the pod's status file when that file is not
  // older than its manifest (it then describes this manifest), else "".
  std::string PhaseAtStart(const std::string& manifest_path, const std::string& status_file) const;
  void WritePodStatus(const std::string& file_name, const PodStatus& status);
  void Reject(const std::string& file_name, FileEntry& entry, const char* reason,
              const std::string& message);
  void RetryRecovering();
  void RefreshNode();
  // Every device the Manager has, healthy or not (node.json "devices").
  std::vector<NodeDevice> NodeDevices();
  // The pods not judged yet (node.json "pending_pods").
  std::vector<PendingPod> PendingPods() const;
  void ScheduleNodeRefresh();
  // Health changes arrived: refresh the node and retry waiting pods once,
  // at most every kHealthRefreshInterval.
  void OnHealthChanged();
  void FlushHealthLog();
  void OnRegistrationGraceOver();
  void FinishStartup();

  const Options options_;
  std::string status_dir_;
  std::string manifest_dir_;

  std::shared_ptr<checkpoint::Store> store_;
  std::unique_ptr<dm::Manager> manager_;
  std::unique_ptr<dm::PodResourcesServer> pod_resources_;
  std::shared_ptr<dm::Metrics> metrics_;
  std::unique_ptr<dm::MetricsServer> metrics_server_;
  int64_t health_subscription_ = -1;
  // Feeds device_health_ from before the Manager starts, so that a device a
  // plugin lists as unhealthy from the start is known too.
  int64_t device_subscription_ = -1;

  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<ManifestWatcher> watcher_;
  std::unique_ptr<asio::steady_timer> node_timer_;
  std::unique_ptr<asio::steady_timer> health_timer_;
  std::unique_ptr<asio::steady_timer> grace_timer_;
  std::unique_ptr<AdmissionQueue> admissions_;
  std::thread io_thread_;
  bool stopped_ = false;

  // io thread only.
  std::map<std::string, FileEntry> files_;     // by manifest file name
  std::map<std::string, InFlight> in_flight_;  // by pod uid
  uint64_t next_generation_ = 0;
  std::set<std::string> recovered_uids_;  // held devices at start
  // Pods whose status file said Admitted at start; they wait for their
  // plugins until the registration grace is over.
  std::set<std::string> previously_admitted_;
  bool registration_grace_over_ = false;
  std::string last_node_json_;
  bool startup_done_ = false;
  bool health_timer_armed_ = false;
  std::chrono::steady_clock::time_point last_health_refresh_{};

  // Set by the health callback when it posts a refresh, cleared by the io
  // thread when it runs one: a flapping plugin posts one task, not thousands.
  std::atomic<bool> health_refresh_posted_{false};
  // Shared by the Manager's delivery thread (Admit) and the io thread (Flush).
  kdm::Mutex health_log_mu_;
  LogRateLimiter health_log_ ABSL_GUARDED_BY(health_log_mu_){kHealthLogBurst, 1s};

  // The latest health of every device a health event named: the Manager's
  // public API lists healthy devices only (GetAllocatableDevices). Written
  // by the Manager's delivery thread, read by the io thread.
  kdm::Mutex device_health_mu_;
  std::map<std::pair<std::string, std::string>, bool> device_health_
      ABSL_GUARDED_BY(device_health_mu_);
  // io thread only: NUMA nodes of devices last seen healthy, kept for when
  // they turn unhealthy.
  std::map<std::pair<std::string, std::string>, std::vector<int64_t>> last_numa_;

  mutable kdm::Mutex active_mu_;
  std::map<std::string, dm::ActivePod> active_ ABSL_GUARDED_BY(active_mu_);
  std::set<std::string> startup_uids_ ABSL_GUARDED_BY(active_mu_);
};

Status NodeAgentImpl::Init() {
  if (options_.root.empty()) return InvalidArgumentError("--root: empty directory");
  KDM_RETURN_IF_ERROR(MakeDir(options_.root, 0755));
  KDM_RETURN_IF_ERROR(MakeDir(manifest_dir_, 0755));
  KDM_RETURN_IF_ERROR(MakeDir(status_dir_, 0755));
  RemoveStaleTempFiles(status_dir_);  // a kill -9 mid-write leaves them

  auto opened = checkpoint::OpenStoreForRoot(options_.root, options_.checkpoint);
  if (!opened.ok()) return opened.status().WithPrefix("checkpoint");
  if (!opened->recovered.ok()) {
    spdlog::warn("event=checkpoint_quarantined path={} error={}",
                 QuoteLogValue(opened->quarantined_path, kMaxLogValueBytes),
                 QuoteLogValue(opened->recovered.message(), kMaxLogValueBytes));
  }
  for (const auto& path : opened->removed_temp_files) {
    spdlog::info("event=stale_temp_file_removed path={}", QuoteLogValue(path));
  }
  store_ = std::move(opened->store);

  // The pods of the manifests present now count as active while the
  // Manager starts (after a reboot it keeps only active pods' devices) and
  // until the first scan has admitted them.
  std::set<std::string> startup_uids;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(manifest_dir_, ec)) {
    std::string name = entry.path().filename().string();
    if (!IsManifestFileName(name)) continue;
    auto pod = LoadPodManifest(entry.path().string());
    if (pod.ok()) startup_uids.insert(pod->uid);
  }
  {
    kdm::MutexLock lock(&active_mu_);
    startup_uids_ = std::move(startup_uids);
  }

  dm::Manager::Options mo;
  mo.plugin_dir = options_.root + "/device-plugins";
  mo.store = store_;
  mo.rpc_timeout = options_.rpc_timeout;
  mo.registration_timeout = options_.rpc_timeout;
  mo.pre_start_timeout = options_.pre_start_timeout;
  mo.grace_period = options_.grace_period;
  mo.active_pods = [this] { return ActiveUids(); };
  mo.restrictions = options_.restrictions;
  // The Manager reports registrations, allocation and checkpoint latencies
  // as they happen, so the registry exists before it does.
  if (!options_.metrics_addr.empty()) {
    metrics_ = dm::Metrics::Create();
    mo.metrics = metrics_;
  }
  KDM_ASSIGN_OR_RETURN(manager_, dm::Manager::Create(std::move(mo)));
  device_subscription_ =
      manager_->Subscribe([this](const std::vector<dm::DeviceHealthEvent>& events) {
        kdm::MutexLock lock(&device_health_mu_);
        for (const auto& e : events) device_health_[{e.resource_name, e.device_id}] = e.healthy;
      });
  KDM_RETURN_IF_ERROR(manager_->Start().WithPrefix("device manager"));
  // An emptied or replaced checkpoint is otherwise silent: its pods are
  // admitted again, perhaps onto other devices.
  if (auto admitted = AdmittedStatusFilesWithDevices(status_dir_);
      !admitted.empty() && manager_->GetPodsWithDevices().empty()) {
    spdlog::warn(
        "event=checkpoint_state_missing admitted_status_files={} checkpoint={} "
        "first={} note=\"the checkpoint holds no allocation; these pods will be "
        "admitted again, perhaps with other devices\"",
        admitted.size(), QuoteLogValue(store_->Describe()), QuoteLogValue(admitted[0]));
  }
  // Devices of pods whose manifests went away while the agent was down are
  // collected before any pod is admitted, so that new pods can have them.
  if (Status gc = manager_->UpdateAllocatedDevices(); !gc.ok()) {
    spdlog::warn("event=gc_failed error={}", QuoteLogValue(gc.message(), kMaxLogValueBytes));
  }
  for (const auto& uid : manager_->GetPodsWithDevices()) recovered_uids_.insert(uid);
  spdlog::info("event=manager_started plugin_dir={}/device-plugins checkpoint={} recovered_pods={}",
               options_.root, checkpoint::StoreKindName(options_.checkpoint),
               recovered_uids_.size());

  dm::PodResourcesServer::Options po;
  po.socket_path = options_.root + "/pod-resources/kubelet.sock";
  po.manager = manager_.get();
  po.active_pods = [this] { return ActivePods(); };
  KDM_ASSIGN_OR_RETURN(pod_resources_, dm::PodResourcesServer::Start(std::move(po)));

  if (metrics_) {
    auto server = dm::MetricsServer::Start(options_.metrics_addr, metrics_, manager_.get());
    if (!server.ok()) return server.status().WithPrefix("--metrics-addr");
    metrics_server_ = std::move(*server);  // it logs event=metrics_serving
  }

  admissions_ = std::make_unique<AdmissionQueue>(std::max(1, options_.admission_threads));

  ManifestWatcher::Options wo;
  wo.dir = manifest_dir_;
  wo.debounce = options_.manifest_debounce;
  wo.on_event = [this](const ManifestWatcher::Event& e) { OnManifestEvent(e); };
  KDM_ASSIGN_OR_RETURN(watcher_, ManifestWatcher::Create(io_, std::move(wo)));
  KDM_RETURN_IF_ERROR(watcher_->Start());
  // Runs after the watcher's initial full scan (posted by Start, FIFO).
  asio::post(io_, [this] { FinishStartup(); });

  health_subscription_ =
      manager_->Subscribe([this](const std::vector<dm::DeviceHealthEvent>& events) {
        const auto now = std::chrono::steady_clock::now();
        {
          kdm::MutexLock lock(&health_log_mu_);
          for (const auto& e : events) {
            if (auto suppressed = health_log_.Admit(e.resource_name, now)) {
              spdlog::info("event=device_health resource={} device={} healthy={} suppressed={}",
                           QuoteLogValue(e.resource_name, kMaxLogValueBytes),
                           QuoteLogValue(e.device_id, kMaxLogValueBytes), e.healthy, *suppressed);
            }
          }
        }
        if (!health_refresh_posted_.exchange(true)) asio::post(io_, [this] { OnHealthChanged(); });
      });

  node_timer_ = std::make_unique<asio::steady_timer>(io_);
  health_timer_ = std::make_unique<asio::steady_timer>(io_);
  grace_timer_ = std::make_unique<asio::steady_timer>(io_);
  grace_timer_->expires_after(options_.registration_grace);
  grace_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (!ec) OnRegistrationGraceOver();
  });
  work_.emplace(asio::make_work_guard(io_));
  asio::post(io_, [this] { RefreshNode(); });
  ScheduleNodeRefresh();
  io_thread_ = std::thread([this] { io_.run(); });
  spdlog::info("event=agent_started root={} manifests={} status={}", options_.root, manifest_dir_,
               status_dir_);
  return OkStatus();
}

void NodeAgentImpl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (manager_ && health_subscription_ >= 0) manager_->Unsubscribe(health_subscription_);
  if (manager_ && device_subscription_ >= 0) manager_->Unsubscribe(device_subscription_);
  // Stop means stop: the io thread ends first (after the handler it may be
  // running), so no admission result, manifest event or status write is
  // acted on from here; results still posted to io_ are dropped with it.
  work_.reset();
  io_.stop();
  if (io_thread_.joinable()) io_thread_.join();
  // Then the plugin RPCs in flight are cancelled rather than waited for (a
  // hung plugin would hold the stop until its deadline), and the admissions
  // end at once. A pod whose admission was cut short keeps the status file
  // it had before the stop; its manifest is admitted again at the next start.
  const int cancelled_calls = manager_ ? manager_->CancelPluginCalls() : 0;
  for (const auto& [uid, flight] : in_flight_) {
    auto file = files_.find(flight.file_name);
    const bool named = file != files_.end() && file->second.pod;
    spdlog::info("event=admission_cancelled file={} pod={}/{} uid={}",
                 QuoteLogValue(flight.file_name, kMaxLogValueBytes),
                 named ? file->second.pod->namespace_name : "", named ? file->second.pod->name : "",
                 QuoteLogValue(uid, kMaxLogValueBytes));
  }
  if (!in_flight_.empty() || cancelled_calls > 0) {
    spdlog::info("event=admissions_cancelled admissions={} plugin_calls={}", in_flight_.size(),
                 cancelled_calls);
  }
  if (admissions_) admissions_->Stop();
  if (watcher_) watcher_->Stop();
  node_timer_.reset();
  health_timer_.reset();
  grace_timer_.reset();
  if (metrics_server_) metrics_server_->Stop();
  if (pod_resources_) pod_resources_->Stop();
  if (manager_) manager_->Stop();
  spdlog::info("event=agent_stopped root={}", options_.root);
}

void NodeAgentImpl::ScheduleNodeRefresh() {
  node_timer_->expires_after(kNodeRefreshInterval);
  node_timer_->async_wait([this](const boost::system::error_code& ec) {
    if (ec) return;
    RefreshNode();
    FlushHealthLog();
    ScheduleNodeRefresh();
  });
}

void NodeAgentImpl::OnHealthChanged() {
  if (health_timer_armed_) return;
  health_timer_armed_ = true;
  const auto now = std::chrono::steady_clock::now();
  const auto due = last_health_refresh_ + kHealthRefreshInterval;
  health_timer_->expires_after(due > now ? due - now : std::chrono::steady_clock::duration::zero());
  health_timer_->async_wait([this](const boost::system::error_code& ec) {
    health_timer_armed_ = false;
    if (ec) return;
    // Changes after this point post a new refresh.
    health_refresh_posted_.store(false);
    last_health_refresh_ = std::chrono::steady_clock::now();
    RefreshNode();
    RetryRecovering();
  });
}

void NodeAgentImpl::FlushHealthLog() {
  std::vector<std::pair<std::string, int64_t>> flushed;
  {
    kdm::MutexLock lock(&health_log_mu_);
    flushed = health_log_.Flush(std::chrono::steady_clock::now());
  }
  for (const auto& [resource, n] : flushed) {
    spdlog::info("event=device_health_suppressed resource={} suppressed={}",
                 QuoteLogValue(resource, kMaxLogValueBytes), n);
  }
}

void NodeAgentImpl::OnRegistrationGraceOver() {
  registration_grace_over_ = true;
  if (!previously_admitted_.empty()) {
    spdlog::info("event=registration_grace_over waiting_pods={}", previously_admitted_.size());
  }
  RetryRecovering();
}

void NodeAgentImpl::FinishStartup() {
  startup_done_ = true;
  {
    kdm::MutexLock lock(&active_mu_);
    startup_uids_.clear();
  }
  // Pods whose manifests went away while the agent was down.
  if (Status s = manager_->UpdateAllocatedDevices(); !s.ok()) {
    spdlog::warn("event=gc_failed error={}", QuoteLogValue(s.message(), kMaxLogValueBytes));
  }
  // Status files of pods whose manifests went away while the agent was down.
  std::set<std::string> owned = {"node.json"};
  for (const auto& [name, entry] : files_) owned.insert(entry.status_file);
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(status_dir_, ec)) {
    std::string name = e.path().filename().string();
    if (name.size() > 5 && name.ends_with(".json") && name.front() != '.' && !owned.count(name)) {
      std::filesystem::remove(e.path(), ec);
      spdlog::info("event=stale_status_removed file={}", QuoteLogValue(name, kMaxLogValueBytes));
    }
  }
  RefreshNode();
  spdlog::info("event=initial_scan_done pods={}", files_.size());
}

std::vector<NodeDevice> NodeAgentImpl::NodeDevices() {
  std::map<std::pair<std::string, std::string>, NodeDevice> devices;
  for (const dm::ContainerDevices& d : manager_->GetAllocatableDevices()) {
    for (const std::string& id : d.device_ids) {
      NodeDevice& device = devices[{d.resource_name, id}];
      device.healthy = true;
      if (d.numa_node) device.numa_nodes.push_back(*d.numa_node);
    }
  }
  // Unhealthy: named unhealthy by the last health event and still counted
  // in the resource's capacity (a resource whose grace expired is gone).
  const dm::CapacityReport capacity = manager_->GetCapacity();
  {
    kdm::MutexLock lock(&device_health_mu_);
    for (const auto& [key, healthy] : device_health_) {
      auto r = capacity.resources.find(key.first);
      if (healthy || r == capacity.resources.end() || r->second.capacity == 0) continue;
      if (devices.count(key)) continue;
      NodeDevice& device = devices[key];
      auto numa = last_numa_.find(key);
      if (numa != last_numa_.end()) device.numa_nodes = numa->second;
    }
  }
  std::vector<NodeDevice> out;
  for (auto& [key, device] : devices) {
    device.resource = key.first;
    device.id = key.second;
    std::sort(device.numa_nodes.begin(), device.numa_nodes.end());
    device.numa_nodes.erase(std::unique(device.numa_nodes.begin(), device.numa_nodes.end()),
                            device.numa_nodes.end());
    if (device.healthy) last_numa_[key] = device.numa_nodes;
    auto attributes = options_.attributes.find(key.first);
    if (attributes != options_.attributes.end() && attributes->second.model) {
      device.model = *attributes->second.model;
    }
    if (auto r = options_.gpu_indexes.find(key.first); r != options_.gpu_indexes.end()) {
      if (auto i = r->second.find(key.second); i != r->second.end()) device.index = i->second;
    }
    out.push_back(std::move(device));
  }
  return out;
}

std::vector<PendingPod> NodeAgentImpl::PendingPods() const {
  std::vector<PendingPod> out;
  for (const auto& [file, entry] : files_) {
    if (!entry.pod) continue;
    const char* reason = nullptr;
    switch (entry.state) {
      case PodState::kRecovering:
        reason = kReasonWaitingForPlugins;
        break;
      case PodState::kAdmitting:
        reason = kReasonAdmitting;
        break;
      case PodState::kPending:
        reason = kReasonWaitingForOtherAdmission;
        break;
      default:
        break;
    }
    if (reason) out.push_back({entry.pod->namespace_name, entry.pod->name, reason});
  }
  std::sort(out.begin(), out.end(), [](const PendingPod& a, const PendingPod& b) {
    return std::tie(a.namespace_name, a.name) < std::tie(b.namespace_name, b.name);
  });
  return out;
}

void NodeAgentImpl::RefreshNode() {
  NodeStatus node;
  node.capacity = manager_->GetCapacity();
  node.registrations = manager_->GetStats().registrations_accepted;
  node.devices = NodeDevices();
  node.pending_pods = PendingPods();
  std::string text = RenderNodeStatus(node);
  if (text == last_node_json_) return;
  if (Status s = WriteFileAtomically(status_dir_ + "/node.json", text); !s.ok()) {
    spdlog::error("event=status_write_failed file=node.json error={}",
                  QuoteLogValue(s.message(), kMaxLogValueBytes));
    return;
  }
  last_node_json_ = std::move(text);
  for (const auto& [resource, amounts] : node.capacity.resources) {
    spdlog::debug("event=node_status resource={} capacity={} allocatable={}", resource,
                  amounts.capacity, amounts.allocatable);
  }
}

void NodeAgentImpl::WritePodStatus(const std::string& file_name, const PodStatus& status) {
  if (Status s = WriteFileAtomically(status_dir_ + "/" + file_name, RenderPodStatus(status));
      !s.ok()) {
    spdlog::error("event=status_write_failed file={} error={}",
                  QuoteLogValue(file_name, kMaxLogValueBytes),
                  QuoteLogValue(s.message(), kMaxLogValueBytes));
  }
}

void NodeAgentImpl::OnManifestEvent(const ManifestWatcher::Event& e) {
  if (e.kind == ManifestWatcher::EventKind::kGone) {
    spdlog::info("event=manifest_removed file={}", QuoteLogValue(e.file_name, kMaxLogValueBytes));
    ForgetFile(e.file_name, /*delete_status=*/true);
    if (Status s = manager_->UpdateAllocatedDevices(); !s.ok()) {
      spdlog::warn("event=gc_failed error={}", QuoteLogValue(s.message(), kMaxLogValueBytes));
    }
    RefreshNode();
    return;
  }
  auto bytes = ReadManifestBytes(e.path);
  if (!bytes.ok()) {
    if (bytes.status().code() == StatusCode::kNotFound) return;  // gone again; its event follows
    spdlog::warn("event=manifest_unreadable file={} error={}",
                 QuoteLogValue(e.file_name, kMaxLogValueBytes),
                 QuoteLogValue(bytes.status().message(), kMaxLogValueBytes));
    return;
  }
  size_t hash = std::hash<std::string>{}(*bytes);
  auto it = files_.find(e.file_name);
  if (it != files_.end() && it->second.content_hash == hash) {
    spdlog::debug("event=manifest_unchanged file={}",
                  QuoteLogValue(e.file_name, kMaxLogValueBytes));
    return;
  }
  std::string old_status_file;
  if (it != files_.end()) {
    spdlog::info("event=manifest_changed file={}", QuoteLogValue(e.file_name, kMaxLogValueBytes));
    old_status_file = it->second.status_file;
    ForgetFile(e.file_name, /*delete_status=*/false);
  } else {
    spdlog::info("event=manifest_added file={}", QuoteLogValue(e.file_name, kMaxLogValueBytes));
  }
  FileEntry& entry = files_[e.file_name];
  entry.content_hash = hash;
  PodIdentity identity;
  auto pod = ParsePodManifest(*bytes, e.file_name, &identity);
  entry.status_file = identity.name.empty()
                          ? ManifestStatusFileName(e.file_name)
                          : PodStatusFileName(identity.namespace_name, identity.name);
  if (!old_status_file.empty() && old_status_file != entry.status_file) {
    // The edit renamed the pod (or made it unreadable): its old status goes.
    ::unlink((status_dir_ + "/" + old_status_file).c_str());
  }
  if (!pod.ok()) {
    Reject(e.file_name, entry, kReasonInvalidManifest, pod.status().message());
    return;
  }
  // A pod (by namespace/name, and by uid: the Manager keys devices by uid)
  // belongs to one manifest. The second one is refused before it touches
  // any device, so removing either file can never free the other's.
  for (const auto& [other_name, other] : files_) {
    if (other_name == e.file_name || !other.pod || other.state == PodState::kRejected) continue;
    std::string why;
    if (other.pod->namespace_name == pod->namespace_name && other.pod->name == pod->name) {
      why = "pod " + pod->namespace_name + "/" + pod->name + " is already defined by " + other_name;
    } else if (other.pod->uid == pod->uid) {
      why = "pod uid \"" + pod->uid + "\" (pod " + pod->namespace_name + "/" + pod->name +
            ") is already used by " + other_name + " (pod " + other.pod->namespace_name + "/" +
            other.pod->name + ")";
    } else {
      continue;
    }
    entry.status_file = ManifestStatusFileName(e.file_name);
    Reject(e.file_name, entry, kReasonDuplicatePod, e.file_name + ": " + why);
    return;
  }
  entry.pod = std::move(*pod);
  // Before any device is given: a container the node's devices cannot run
  // is refused as a whole pod, like any other admission failure.
  if (Status req = CheckDeviceRequirements(*entry.pod, options_.attributes); !req.ok()) {
    // Devices restored for this uid at start (nobody else holds the uid:
    // duplicates were refused above) are freed with it.
    // An admission of its previous version still running frees its own.
    if (!UidHeldByOtherFile(entry.pod->uid, e.file_name) && !in_flight_.count(entry.pod->uid)) {
      RemovePodDevices(entry.pod->uid);
    }
    Reject(e.file_name, entry, kReasonUnmetDeviceRequirement, req.message());
    return;
  }
  if (!startup_done_) {
    const std::string phase = PhaseAtStart(e.path, entry.status_file);
    if (phase == kPhaseRejected) {
      entry.state = PodState::kRejected;
      spdlog::info("event=pod_still_rejected file={} pod={}/{} status={}",
                   QuoteLogValue(e.file_name, kMaxLogValueBytes), entry.pod->namespace_name,
                   entry.pod->name, QuoteLogValue(entry.status_file, kMaxLogValueBytes));
      return;
    }
    if (phase == kPhaseAdmitted && !registration_grace_over_) {
      previously_admitted_.insert(entry.pod->uid);
    }
  }
  AdmitFile(e.file_name, entry);
}

std::string NodeAgentImpl::PhaseAtStart(const std::string& manifest_path,
                                        const std::string& status_file) const {
  const std::string status_path = status_dir_ + "/" + status_file;
  struct stat manifest_st, status_st;
  if (::stat(manifest_path.c_str(), &manifest_st) != 0 ||
      ::stat(status_path.c_str(), &status_st) != 0) {
    return "";
  }
  auto ns = [](const struct timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; };
  if (ns(status_st.st_mtim) < ns(manifest_st.st_mtim)) return "";
  auto bytes = ReadManifestBytes(status_path);
  if (!bytes.ok()) return "";
  for (const char* phase : {kPhaseRejected, kPhaseAdmitted}) {
    if (bytes->find(std::string("\"phase\": \"") + phase + "\"") != std::string::npos) return phase;
  }
  return "";
}

void NodeAgentImpl::Reject(const std::string& file_name, FileEntry& entry, const char* reason,
                           const std::string& message) {
  entry.state = PodState::kRejected;
  if (entry.pod) {
    if (!UidHeldByOtherFile(entry.pod->uid, file_name)) ClearActive(entry.pod->uid);
    recovered_uids_.erase(entry.pod->uid);
    previously_admitted_.erase(entry.pod->uid);
  }
  spdlog::warn("event=pod_rejected file={} status={} reason={} message={}",
               QuoteLogValue(file_name, kMaxLogValueBytes),
               QuoteLogValue(entry.status_file, kMaxLogValueBytes), reason,
               QuoteLogValue(message, kMaxLogValueBytes));
  PodStatus status;
  status.phase = kPhaseRejected;
  status.reason = reason;
  status.message = message;
  WritePodStatus(entry.status_file, status);
}

bool NodeAgentImpl::UidHeldByOtherFile(const std::string& uid,
                                       const std::string& except_file) const {
  for (const auto& [name, entry] : files_) {
    if (name == except_file || !entry.pod || entry.pod->uid != uid) continue;
    if (entry.state == PodState::kAdmitted || entry.state == PodState::kRecovering ||
        entry.state == PodState::kAdmitting) {
      return true;
    }
  }
  return false;
}

void NodeAgentImpl::RemovePodDevices(const std::string& uid) {
  if (Status s = manager_->RemovePod(uid); !s.ok()) {
    spdlog::warn("event=pod_remove_failed uid={} error={}", QuoteLogValue(uid, kMaxLogValueBytes),
                 QuoteLogValue(s.message(), kMaxLogValueBytes));
  }
}

void NodeAgentImpl::ForgetFile(const std::string& file_name, bool delete_status) {
  auto it = files_.find(file_name);
  if (it == files_.end()) return;
  FileEntry& entry = it->second;
  if (entry.pod && entry.state != PodState::kRejected && entry.state != PodState::kPending) {
    const dm::Pod& pod = *entry.pod;
    recovered_uids_.erase(pod.uid);
    previously_admitted_.erase(pod.uid);
    // Never free what a pod of another file holds (the duplicate checks keep
    // a uid to one file; this holds even if they were bypassed).
    const bool shared = UidHeldByOtherFile(pod.uid, file_name);
    if (!shared) ClearActive(pod.uid);
    if (entry.state == PodState::kAdmitting) {
      // Its worker may still be allocating: OnAdmissionDone frees what it got.
      spdlog::info("event=pod_deleted_while_admitting file={} pod={}/{} uid={}",
                   QuoteLogValue(file_name, kMaxLogValueBytes), pod.namespace_name, pod.name,
                   QuoteLogValue(pod.uid, kMaxLogValueBytes));
    } else {
      if (!shared) RemovePodDevices(pod.uid);
      spdlog::info("event=pod_deleted file={} pod={}/{} uid={}",
                   QuoteLogValue(file_name, kMaxLogValueBytes), pod.namespace_name, pod.name,
                   QuoteLogValue(pod.uid, kMaxLogValueBytes));
    }
  }
  if (delete_status && !entry.status_file.empty()) {
    ::unlink((status_dir_ + "/" + entry.status_file).c_str());
  }
  files_.erase(it);
}

AdmissionResult NodeAgentImpl::RunAdmission(const dm::Pod& pod) {
  AdmissionResult result;
  // The Manager's Allocate skips resources no plugin ever registered (like
  // the kubelet's device manager); the kubelet then rejects the pod for lack
  // of the resource. This agent has no such node-level check: the Manager
  // says which resource is missing, in the device manager's words.
  result.status = manager_->CheckResourcesRegistered(pod);
  if (!result.status.ok()) {
    result.unregistered = true;
    return result;
  }
  dm::CapacityReport capacity = manager_->GetCapacity();
  for (const std::string& resource : dm::ExtendedResourcesOf(pod)) {
    auto it = capacity.resources.find(resource);
    if (it != capacity.resources.end() && it->second.capacity == 0) {
      result.resource_without_devices = true;
    }
  }
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const auto& c : *list) {
      result.status = manager_->Allocate(pod, c.name);
      if (!result.status.ok()) return result;
    }
  }
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const auto& c : *list) {
      auto allocation = manager_->GetContainerAllocation(pod, c.name);
      if (!allocation.ok()) {
        result.status = allocation.status();
        result.containers.clear();
        return result;
      }
      ContainerStatus cs;
      cs.name = c.name;
      cs.devices = std::move(allocation->devices);
      cs.run = std::move(allocation->run);
      result.containers.push_back(std::move(cs));
    }
  }
  return result;
}

void NodeAgentImpl::AdmitFile(const std::string& file_name, FileEntry& entry) {
  const dm::Pod& pod = *entry.pod;
  if (in_flight_.count(pod.uid)) {
    // The previous version of this pod (a changed or removed file) is still
    // being admitted: this one starts when that one is done and undone.
    entry.state = PodState::kPending;
    spdlog::info("event=pod_admission_deferred file={} uid={} reason=\"same uid in flight\"",
                 QuoteLogValue(file_name, kMaxLogValueBytes),
                 QuoteLogValue(pod.uid, kMaxLogValueBytes));
    return;
  }
  const bool recovering = recovered_uids_.count(pod.uid) > 0;
  entry.state = PodState::kAdmitting;
  entry.generation = ++next_generation_;
  // Active while admitting, so that no garbage collection drops devices the
  // pod is being given (or held before a restart).
  SetActive(pod);
  in_flight_[pod.uid] = {file_name, entry.generation};
  const uint64_t generation = entry.generation;
  // Keyed by the pod's device resources: pods that share one are admitted
  // in order.
  bool queued = admissions_->Submit(
      dm::ExtendedResourcesOf(pod), [this, file_name, generation, recovering, pod = pod] {
        AdmissionResult result = RunAdmission(pod);
        asio::post(io_, [this, file_name, generation, recovering, uid = pod.uid,
                         result = std::move(result)]() mutable {
          OnAdmissionDone(file_name, generation, uid, recovering, std::move(result));
        });
      });
  if (!queued) in_flight_.erase(pod.uid);  // stopping
}

void NodeAgentImpl::OnAdmissionDone(const std::string& file_name, uint64_t generation,
                                    const std::string& uid, bool recovering,
                                    AdmissionResult result) {
  in_flight_.erase(uid);
  auto it = files_.find(file_name);
  const bool current = it != files_.end() && it->second.generation == generation &&
                       it->second.state == PodState::kAdmitting;
  if (current) {
    FinishAdmission(file_name, it->second, recovering, std::move(result));
  } else {
    // The manifest was removed or changed while its pod was being admitted:
    // free what the admission got, unless another file's pod holds the uid.
    if (!UidHeldByOtherFile(uid, "")) {
      ClearActive(uid);
      RemovePodDevices(uid);
    }
    spdlog::info("event=admission_superseded file={} uid={}",
                 QuoteLogValue(file_name, kMaxLogValueBytes),
                 QuoteLogValue(uid, kMaxLogValueBytes));
  }
  // Entries that waited for this uid's admission to end.
  for (auto& [name, entry] : files_) {
    if (entry.state == PodState::kPending && entry.pod && entry.pod->uid == uid) {
      AdmitFile(name, entry);
      break;  // one admission per uid at a time; the rest wait for this one
    }
  }
}

void NodeAgentImpl::FinishAdmission(const std::string& file_name, FileEntry& entry, bool recovering,
                                    AdmissionResult result) {
  const dm::Pod& pod = *entry.pod;
  Status s = std::move(result.status);
  // After a restart the resources come back from the checkpoint with no
  // devices until their plugins register again. A pod that held devices, or
  // that asks for such a resource, waits for the plugin instead of being
  // rejected (the kubelet rejects it: a known kubelet restart race). If the
  // plugin never returns, the resource is deleted after the grace period and
  // the retry rejects the pod as unregistered. A pod that was admitted
  // before the restart but whose devices were not restored (lost
  // checkpoint) waits the same way, up to the registration grace.
  const bool waits_for_registration =
      !registration_grace_over_ && previously_admitted_.count(pod.uid) > 0;
  const bool wait =
      !s.ok() &&
      ((s.code() == StatusCode::kUnavailable && (recovering || result.resource_without_devices)) ||
       (waits_for_registration && (result.unregistered || result.resource_without_devices ||
                                   s.code() == StatusCode::kUnavailable)));
  if (wait) {
    if (!entry.waiting_logged) {
      spdlog::info("event=pod_waiting_for_plugins file={} pod={}/{} uid={} reason={}",
                   QuoteLogValue(file_name, kMaxLogValueBytes), pod.namespace_name, pod.name,
                   QuoteLogValue(pod.uid, kMaxLogValueBytes),
                   QuoteLogValue(s.message(), kMaxLogValueBytes));
      entry.waiting_logged = true;
    }
    entry.state = PodState::kRecovering;
    return;
  }
  recovered_uids_.erase(pod.uid);
  previously_admitted_.erase(pod.uid);
  if (!s.ok()) {
    RemovePodDevices(pod.uid);
    if (s.code() == StatusCode::kPermissionDenied) {
      // An administrator's rule (--restrict), not an unexpected failure.
      Reject(file_name, entry, kReasonRestrictedResource, s.message());
    } else {
      Reject(file_name, entry, kReasonUnexpectedAdmissionError,
             AdmissionFailureMessage(s.message()));
    }
    return;
  }
  PodStatus status;
  status.containers = std::move(result.containers);
  entry.state = PodState::kAdmitted;
  status.phase = kPhaseAdmitted;
  WritePodStatus(entry.status_file, status);
  std::map<std::string, std::vector<std::string>> all;
  for (const auto& c : status.containers) {
    for (const auto& [resource, ids] : c.devices) {
      all[c.name + ":" + resource] = ids;
    }
  }
  spdlog::info("event=pod_admitted file={} pod={}/{} uid={} recovered={} devices={}",
               QuoteLogValue(file_name, kMaxLogValueBytes), pod.namespace_name, pod.name,
               QuoteLogValue(pod.uid, kMaxLogValueBytes), recovering,
               QuoteLogValue(DevicesText(all), kMaxLogValueBytes));
}

void NodeAgentImpl::RetryRecovering() {
  for (auto& [file_name, entry] : files_) {
    if (entry.state == PodState::kRecovering && entry.pod) AdmitFile(file_name, entry);
  }
}

}  // namespace

StatusOr<std::unique_ptr<NodeAgent>> NodeAgent::Start(Options options) {
  auto agent = std::make_unique<NodeAgentImpl>(std::move(options));
  if (Status s = agent->Init(); !s.ok()) {
    agent->Stop();
    return s;
  }
  return std::unique_ptr<NodeAgent>(std::move(agent));
}

Status CheckDeviceRequirements(const dm::Pod& pod,
                               const std::map<std::string, k8s::DeviceAttributes>& attributes) {
  if (attributes.empty()) return OkStatus();
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const dm::Container& c : *list) {
      std::optional<k8s::RequirementSet> set;
      for (const auto& [resource, limit] : c.limits) {
        auto attrs = attributes.find(resource);
        if (attrs == attributes.end() || limit.IsZero()) continue;
        const std::string where = "container " + c.name + ", resource " + resource + ": ";
        if (!set) {
          StatusOr<k8s::RequirementSet> parsed = k8s::ParseRequirementEnv(c.env);
          if (!parsed.ok()) return parsed.status().WithPrefix("container " + c.name);
          set = *std::move(parsed);
        }
        Status s = k8s::CheckRequirements(*set, attrs->second);
        if (!s.ok()) return Status(s.code(), where + s.message());
      }
    }
  }
  return OkStatus();
}

StatusOr<std::map<std::string, std::set<std::string>>> ParseRestrictions(
    const std::vector<std::string>& values) {
  std::map<std::string, std::set<std::string>> out;
  for (const std::string& value : values) {
    auto bad = [&](const std::string& why) {
      return InvalidArgumentError("\"" + value + "\": " + why +
                                  " (expected RESOURCE=NAMESPACE[,NAMESPACE...], e.g. "
                                  "nvidia.com/gpu=ml,research)");
    };
    size_t eq = value.find('=');
    if (eq == std::string::npos) return bad("no '='");
    std::string resource = value.substr(0, eq);
    std::string list = value.substr(eq + 1);
    if (!k8s::IsExtendedResourceName(resource)) {
      return bad("\"" + resource + "\" is not an extended resource name (domain/name)");
    }
    if (out.count(resource)) return bad("resource \"" + resource + "\" is restricted twice");
    if (list.empty()) return bad("the namespace list is empty");
    std::set<std::string> namespaces;
    size_t start = 0;
    while (true) {
      size_t comma = list.find(',', start);
      std::string ns =
          list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
      if (ns.empty()) return bad("an empty namespace name");
      if (!k8s::IsDns1123Label(ns)) {
        return bad("namespace \"" + ns +
                   "\" is not a DNS-1123 label (lowercase letters, digits, '-', at most 63)");
      }
      namespaces.insert(ns);
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
    out[resource] = std::move(namespaces);
  }
  return out;
}

}  // namespace kdm::fakes
