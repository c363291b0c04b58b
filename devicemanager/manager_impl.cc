#include "kdm/devicemanager/manager_impl.h"

#include <algorithm>
#include <filesystem>
#include <set>
#include <string_view>
#include <utility>

#include "kdm/base/env.h"
#include "kdm/base/file_lock.h"
#include "kdm/base/file_system.h"
#include "kdm/base/log_value.h"
#include "kdm/devicemanager/device_snapshot.h"
#include "kdm/devicemanager/run_options.h"
#include "kdm/k8s/names.h"
#include "kdm/pluginapi/api_rules.h"
#include "kdm/pluginapi/constants.h"
#include "kdm/pluginapi/unix_target.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace kdm::devicemanager {

namespace {

// A list of outside values: joined with ',' and quoted and cut as one value.
std::string LogList(const std::vector<std::string>& items) {
  std::string joined;
  for (const std::string& item : items) {
    if (!joined.empty()) joined += ',';
    joined += item;
  }
  return QuoteLogValue(joined, kMaxLogValueBytes);
}

// Folds `later` into `into` as if `into` were applied first and `later`
// second. REQUIRES: `into` touches registered devices only (its removals
// and upserts are empty), so the pod part of `later` commutes with it; per
// resource, the later state (a healthy set, or the removal) wins.
void MergeChange(checkpoint::Change& into, const checkpoint::Change& later) {
  into.removed_pods.insert(into.removed_pods.end(), later.removed_pods.begin(),
                           later.removed_pods.end());
  into.removals.insert(into.removals.end(), later.removals.begin(), later.removals.end());
  into.upserts.insert(into.upserts.end(), later.upserts.begin(), later.upserts.end());
  for (const std::string& resource : later.removed_resources) {
    into.registered_devices.erase(resource);
    if (std::find(into.removed_resources.begin(), into.removed_resources.end(), resource) ==
        into.removed_resources.end()) {
      into.removed_resources.push_back(resource);
    }
  }
  for (const auto& [resource, ids] : later.registered_devices) {
    into.removed_resources.erase(
        std::remove(into.removed_resources.begin(), into.removed_resources.end(), resource),
        into.removed_resources.end());
    into.registered_devices[resource] = ids;
  }
}

bool TouchesRegisteredDevicesOnly(const checkpoint::Change& change) {
  return change.removed_pods.empty() && change.removals.empty() && change.upserts.empty();
}

// Health changes between two device lists of `resource` (ids that vanished
// count as turning unhealthy).
std::vector<DeviceHealthEvent> HealthChanges(const std::string& resource,
                                             const std::vector<LedgerDevice>& before,
                                             const std::vector<LedgerDevice>& after) {
  std::map<std::string, bool> old_health;
  for (const auto& d : before) old_health[d.id] = d.healthy;
  std::vector<DeviceHealthEvent> events;
  std::set<std::string> seen;
  for (const auto& d : after) {
    seen.insert(d.id);
    auto it = old_health.find(d.id);
    if (it == old_health.end() || it->second != d.healthy) {
      events.push_back({resource, d.id, d.healthy});
    }
  }
  for (const auto& [id, healthy] : old_health) {
    if (healthy && !seen.count(id)) events.push_back({resource, id, false});
  }
  return events;
}

std::set<std::string> ActivePods(const Manager::Options& options) {
  if (!options.active_pods) return {};
  return options.active_pods();
}

// The checkpoint was written in another boot than this one (both known).
bool IsReboot(const checkpoint::CheckpointData& data, const std::string& boot_id) {
  return !data.boot_id.empty() && !boot_id.empty() && data.boot_id != boot_id;
}

}  // namespace

// ---------------------------------------------------------------- Create

Status ValidateRestrictions(const std::map<std::string, std::set<std::string>>& restrictions) {
  for (const auto& [resource, namespaces] : restrictions) {
    if (!k8s::IsExtendedResourceName(resource)) {
      return InvalidArgumentError("Options.restrictions: \"" + resource +
                                  "\" is not an extended resource name (domain/name)");
    }
    if (namespaces.empty()) {
      return InvalidArgumentError("Options.restrictions: resource \"" + resource +
                                  "\" has an empty namespace list");
    }
    for (const std::string& ns : namespaces) {
      if (!k8s::IsDns1123Label(ns)) {
        return InvalidArgumentError("Options.restrictions: resource \"" + resource +
                                    "\": namespace \"" + ns +
                                    "\" is not a DNS-1123 label (lowercase letters, digits, "
                                    "'-', at most 63)");
      }
    }
  }
  return OkStatus();
}

Status CheckRestrictions(const std::map<std::string, std::set<std::string>>& restrictions,
                         const Pod& pod) {
  if (restrictions.empty()) return OkStatus();
  for (const auto* list : {&pod.init_containers, &pod.containers}) {
    for (const Container& c : *list) {
      for (const auto& [resource, limit] : c.limits) {
        auto it = restrictions.find(resource);
        if (it == restrictions.end() || limit.IsZero()) continue;
        if (it->second.count(pod.namespace_name)) continue;
        std::string allowed;
        for (const std::string& ns : it->second) allowed += (allowed.empty() ? "" : ", ") + ns;
        return PermissionDeniedError("resource \"" + resource + "\" is restricted to namespaces " +
                                     allowed + "; pod namespace \"" + pod.namespace_name +
                                     "\" is not allowed");
      }
    }
  }
  return OkStatus();
}

StatusOr<std::unique_ptr<Manager>> Manager::Create(Options options) {
  if (options.plugin_dir.empty()) {
    return InvalidArgumentError("Options.plugin_dir is empty");
  }
  // A relative directory is made absolute now, against the working
  // directory of today, and every socket path under it with it.
  StatusOr<std::string> socket =
      pluginapi::AbsoluteSocketPath(JoinPath(options.plugin_dir, pluginapi::kKubeletSocketName));
  if (!socket.ok()) return socket.status().WithPrefix("Options.plugin_dir");
  options.plugin_dir = std::filesystem::path(*socket).parent_path().string();
  auto positive = [](std::chrono::milliseconds d, const char* name) -> Status {
    if (d.count() <= 0) {
      return InvalidArgumentError(std::string("Options.") + name + " must be positive, got " +
                                  std::to_string(d.count()) + " ms");
    }
    return OkStatus();
  };
  KDM_RETURN_IF_ERROR(positive(options.registration_timeout, "registration_timeout"));
  KDM_RETURN_IF_ERROR(positive(options.rpc_timeout, "rpc_timeout"));
  KDM_RETURN_IF_ERROR(positive(options.pre_start_timeout, "pre_start_timeout"));
  KDM_RETURN_IF_ERROR(positive(options.grace_period, "grace_period"));
  if (options.max_plugin_message_bytes < 4096) {
    return InvalidArgumentError("Options.max_plugin_message_bytes must be at least 4096, got " +
                                std::to_string(options.max_plugin_message_bytes));
  }
  KDM_RETURN_IF_ERROR(ValidateRestrictions(options.restrictions));
  if (!options.store) options.store = checkpoint::NewMemoryStore();
  if (!options.clock) options.clock = NewRealClock();
  if (options.env == nullptr) return InvalidArgumentError("Options.env must not be null");
  if (!options.boot_id_provider) {
    options.boot_id_provider = [env = options.env] { return env->ReadBootId(); };
  }
  const int max_bytes = options.max_plugin_message_bytes;
  return std::unique_ptr<Manager>(new ManagerImpl(
      std::move(options), [max_bytes](const std::string& path, std::chrono::milliseconds timeout) {
        return DialPlugin(path, timeout, max_bytes);
      }));
}

// ---------------------------------------------------------------- lifecycle

ManagerImpl::ManagerImpl(Options options, StubFactory stub_factory)
    : options_(std::move(options)),
      stub_factory_(std::move(stub_factory)),
      clock_(options_.clock ? options_.clock : NewRealClock()),
      store_(options_.store ? options_.store
                            : std::shared_ptr<checkpoint::Store>(checkpoint::NewMemoryStore())) {
  kdm::MutexLock lifecycle(&lifecycle_mu_);
  delivery_thread_ = std::thread([this] { DeliveryLoop(); });
}

ManagerImpl::~ManagerImpl() { Stop(); }

Status ManagerImpl::Start() {
  kdm::MutexLock lifecycle(&lifecycle_mu_);
  {
    kdm::MutexLock lock(&mu_);
    if (started_) return FailedPreconditionError("device manager already started");
    if (stopping_) return FailedPreconditionError("device manager was stopped");
    started_ = true;
  }
  const std::string& dir = options_.plugin_dir;
  KDM_RETURN_IF_ERROR(options_.env->CreateDirectories(dir, 0750));
  // An existing directory more open than 0750 is tightened: anyone who can
  // write there could plant sockets or symlinks for plugins to meet.
  if (StatusOr<unsigned> was = options_.env->TightenDirectoryMode(dir, 0750); !was.ok()) {
    spdlog::warn("event=plugin_dir_mode_not_restricted dir={} error=\"{}\"", dir,
                 was.status().message());
  } else if ((*was & ~0750u) != 0) {
    spdlog::warn("event=plugin_dir_mode_restricted dir={} old_mode={} new_mode={}", dir,
                 ModeText(*was), ModeText(*was & 0750u));
  }

  std::string boot_id;
  if (options_.boot_id_provider) {
    StatusOr<std::string> b = options_.boot_id_provider();
    if (b.ok()) {
      boot_id = *b;
    } else {
      spdlog::warn("event=boot_id_unknown error=\"{}\"", b.status().message());
    }
  }
  // After a reboot the embedder is asked which pods are still active. Its
  // callback may take the embedder's locks, so it runs between two critical
  // sections: the load, then the restore. Otherwise load and restore share one.
  std::optional<checkpoint::CheckpointData> data;
  bool ask_active_pods = false;
  {
    kdm::MutexLock lock(&mu_);
    StatusOr<checkpoint::CheckpointData> loaded = store_->Load();
    if (!loaded.ok()) {
      return loaded.status().WithPrefix("cannot load checkpoint " + store_->Describe());
    }
    data = std::move(*loaded);
    ask_active_pods = IsReboot(*data, boot_id) && options_.active_pods;
    if (!ask_active_pods) {
      KDM_RETURN_IF_ERROR(
          RestoreCheckpointLocked(*data, boot_id, /*active=*/{}, /*active_read=*/false));
    }
  }
  if (ask_active_pods) {
    const std::set<std::string> active = ActivePods(options_);
    kdm::MutexLock lock(&mu_);
    KDM_RETURN_IF_ERROR(RestoreCheckpointLocked(*data, boot_id, active, /*active_read=*/true));
  }
  // A socket whose lock file (<socket>.lock) is held has a live owner (kdm's
  // plugins hold one) and is kept; one without a lock file is removed as the
  // kubelet removes every socket but its own.
  KDM_ASSIGN_OR_RETURN(SocketSweep sweep,
                       RemoveUnlockedSockets(*options_.env, dir, pluginapi::kKubeletSocketName));
  for (const auto& name : sweep.removed) {
    spdlog::info("event=stale_socket_removed dir={} socket={}", dir,
                 QuoteLogValue(name, kMaxLogValueBytes));
  }
  for (const auto& [name, pid] : sweep.kept) {
    spdlog::info("event=live_socket_kept dir={} socket={} holder_pid={}", dir,
                 QuoteLogValue(name, kMaxLogValueBytes), pid);
  }
  KDM_ASSIGN_OR_RETURN(registration_,
                       RegistrationServer::Start(
                           dir,
                           [this](const std::string& resource, const std::string& socket) {
                             return RegisterPlugin(resource, socket);
                           },
                           [this](const Status&) {
                             UpdateStats([](ManagerStats& s) { s.registrations_rejected++; });
                           },
                           {.max_in_flight = options_.max_registrations_in_flight,
                            .max_waiting = options_.max_registrations_waiting,
                            .max_wait = options_.registration_wait}));
  return OkStatus();
}

Status ManagerImpl::RestoreCheckpointLocked(const checkpoint::CheckpointData& data,
                                            const std::string& boot_id,
                                            const std::set<std::string>& active, bool active_read) {
  const bool rebooted = IsReboot(data, boot_id);
  RestoreReport restored = ledger_.Restore(data);
  for (const SkippedCheckpointEntry& e : restored.skipped) {
    spdlog::warn(
        "event=checkpoint_entry_skipped pod={} container={} resource={} device={} "
        "held_by={} reason={}",
        QuoteLogValue(e.pod_uid, kMaxLogValueBytes),
        QuoteLogValue(e.container_name, kMaxLogValueBytes),
        QuoteLogValue(e.resource_name, kMaxLogValueBytes),
        QuoteLogValue(e.device_id, kMaxLogValueBytes),
        QuoteLogValue(e.held_by_pod_uid, kMaxLogValueBytes), QuoteLogValue(e.reason));
  }
  for (const auto& [resource, ids] : data.registered_devices) {
    ResourceState& state = resources_[resource];
    StartGraceTimerLocked(resource, state);
  }
  spdlog::info(
      "event=checkpoint_restored store=\"{}\" entries={} skipped={} resources={} "
      "boot_id={} previous_boot_id={}",
      store_->Describe(), data.entries.size(), restored.skipped.size(),
      data.registered_devices.size(), boot_id, data.boot_id);
  if (rebooted) {
    checkpoint::Change change = ledger_.RetainOnlyPods(active);
    spdlog::info("event=reboot_detected kept_active_pods={} dropped_pods={} callback={}",
                 active.size(), change.removed_pods.size(), active_read);
    KDM_RETURN_IF_ERROR(PersistLocked(change, "reboot cleanup"));
  }
  if (!boot_id.empty()) {
    if (Status s = store_->SetBootId(boot_id); !s.ok()) {
      return s.WithPrefix("cannot record boot id in " + store_->Describe());
    }
  }
  return OkStatus();
}

int ManagerImpl::CancelPluginCalls() {
  std::vector<std::shared_ptr<Endpoint>> endpoints;
  {
    kdm::MutexLock lock(&mu_);
    calls_cancelled_ = true;
    for (auto& [resource, state] : resources_) {
      for (auto& [path, ep] : state.endpoints) endpoints.push_back(ep);
      if (state.current) endpoints.push_back(state.current);
    }
    for (auto& ep : retired_) endpoints.push_back(ep);
    for (auto& ep : connecting_) endpoints.push_back(ep);
  }
  // An endpoint listed twice (live and current) answers 0 the second time:
  // its calls were cancelled by the first.
  int cancelled = 0;
  for (auto& ep : endpoints) cancelled += ep->CancelCalls();
  return cancelled;
}

void ManagerImpl::Stop() {
  kdm::MutexLock lifecycle(&lifecycle_mu_);
  Deferred deferred;
  bool was_started;
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    was_started = started_;
  }
  // Register calls in flight finish first; they see stopping_ and refuse.
  if (registration_) registration_->Stop();
  {
    kdm::MutexLock lock(&mu_);
    for (auto& [resource, state] : resources_) {
      for (auto& [path, ep] : state.endpoints) deferred.to_stop.push_back(ep);
      if (state.current) deferred.to_stop.push_back(state.current);
      if (state.grace_timer != 0) deferred.to_cancel.push_back(state.grace_timer);
      state.grace_timer = 0;
    }
    for (auto& ep : retired_) deferred.to_stop.push_back(ep);
    retired_.clear();
    for (Clock::TimerId* timer : {&retry_timer_, &log_flush_timer_}) {
      if (*timer != 0) deferred.to_cancel.push_back(*timer);
      *timer = 0;
    }
  }
  // Endpoints stopped and timers cancelled: nothing changes the Ledger now.
  RunDeferred(std::move(deferred));
  {
    kdm::MutexLock lock(&mu_);
    if (pending_change_) {
      // One last attempt; what still fails only described registered
      // devices, which every plugin reports again after a restart.
      checkpoint::Change none;
      if (!PersistLocked(none, "pending changes at stop").ok()) {
        spdlog::error("event=checkpoint_write_dropped store=\"{}\" reason=stopping",
                      store_->Describe());
      }
    }
    FlushLogLimitersLocked(/*all=*/true);
  }
  // Every event queued so far is delivered; then the thread ends.
  {
    kdm::MutexLock lock(&events_mu_);
    delivery_stop_ = true;
  }
  if (delivery_thread_.joinable()) delivery_thread_.join();
  if (was_started) spdlog::info("event=device_manager_stopped dir={}", options_.plugin_dir);
}

void ManagerImpl::RunDeferred(Deferred deferred, bool reap_retired) {
  std::vector<std::shared_ptr<Endpoint>> retired;
  if (reap_retired) {
    kdm::MutexLock lock(&mu_);
    retired.swap(retired_);
  }
  for (auto& ep : deferred.to_stop) ep->Stop();
  for (auto& ep : retired) ep->Stop();
  for (Clock::TimerId id : deferred.to_cancel) clock_->Cancel(id);
}

// ---------------------------------------------------------------- registration

std::optional<std::string> ManagerImpl::OtherResourceOfSocketLocked(
    const std::string& resource, const std::string& socket_path) const {
  for (const auto& [other, state] : resources_) {
    if (other == resource) continue;
    auto it = state.endpoints.find(socket_path);
    if (it != state.endpoints.end() && !it->second->stopped()) return other;
  }
  return std::nullopt;
}

Status ManagerImpl::RegisterPlugin(const std::string& resource, const std::string& socket_path) {
  auto refuse = [&](const Status& s) {
    UpdateStats([](ManagerStats& st) { st.registrations_rejected++; });
    spdlog::warn("event=plugin_refused resource={} socket={} error={}",
                 QuoteLogValue(resource, kMaxLogValueBytes),
                 QuoteLogValue(socket_path, kMaxLogValueBytes),
                 QuoteLogValue(s.message(), kMaxLogValueBytes));
    return s;
  };
  // A socket serves one resource: a second resource naming a socket that is
  // connected for another would make one plugin feed two resources.
  auto socket_taken = [&](const std::string& other) {
    return refuse(AlreadyExistsError("endpoint " + socket_path +
                                     " is already registered for "
                                     "resource \"" +
                                     other +
                                     "\"; a plugin socket serves one "
                                     "resource, so it cannot also serve \"" +
                                     resource + "\""));
  };
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_ || calls_cancelled_) return UnavailableError("device manager is stopping");
    if (auto other = OtherResourceOfSocketLocked(resource, socket_path)) {
      return socket_taken(*other);
    }
  }
  auto stub = stub_factory_(socket_path, options_.registration_timeout);
  if (!stub.ok()) return refuse(stub.status());

  Endpoint::Deadlines deadlines;
  deadlines.options = options_.registration_timeout;
  deadlines.first_snapshot = options_.registration_timeout;
  deadlines.rpc = options_.rpc_timeout;
  deadlines.pre_start = options_.pre_start_timeout;
  Endpoint::Callbacks callbacks;
  callbacks.on_update = [this](Endpoint* ep) { OnEndpointUpdate(ep); };
  callbacks.on_stream_end = [this](Endpoint* ep) { OnEndpointStreamEnd(ep); };
  callbacks.on_rpc_error = [this](const char* method) { CountRpcError(method); };
  callbacks.on_snapshot_refused = [this](Endpoint*, const Status&) {
    UpdateStats([](ManagerStats& st) { st.snapshots_refused++; });
  };
  // A Connect in flight is cancelled by CancelPluginCalls like any call.
  std::shared_ptr<Endpoint> connecting;
  auto on_created = [&](const std::shared_ptr<Endpoint>& created) {
    bool cancelled;
    {
      kdm::MutexLock lock(&mu_);
      connecting = created;
      connecting_.insert(created);
      cancelled = calls_cancelled_;
    }
    if (cancelled) created->CancelCalls();
  };
  auto ep = Endpoint::Connect(resource, socket_path, *stub, deadlines, std::move(callbacks), {},
                              on_created);
  if (connecting) {
    kdm::MutexLock lock(&mu_);
    connecting_.erase(connecting);
  }
  if (!ep.ok()) return refuse(ep.status());

  Deferred deferred;
  std::optional<std::string> taken_by;
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_ || calls_cancelled_) {
      deferred.to_stop.push_back(*ep);
    } else if ((taken_by = OtherResourceOfSocketLocked(resource, socket_path))) {
      // Another resource's registration of this socket won the race.
      deferred.to_stop.push_back(*ep);
    } else {
      ResourceState& state = resources_[resource];
      auto old = state.endpoints.find(socket_path);
      if (old != state.endpoints.end()) {
        // Same socket registered again: the new connection replaces the old.
        state.order.erase(old->second.get());
        deferred.to_stop.push_back(old->second);
      }
      if (state.current && state.current != *ep && state.current->stopped()) {
        deferred.to_stop.push_back(state.current);  // joins a finished reader
      }
      state.endpoints[socket_path] = *ep;
      state.order[ep->get()] = ++next_order_;
      state.current = *ep;
      state.applied_seq = 0;
      state.generation++;
      if (state.grace_timer != 0) {
        deferred.to_cancel.push_back(state.grace_timer);
        state.grace_timer = 0;
      }
      // Counted before the devices become visible, under the same lock: a
      // caller who sees the capacity also sees the registration counted.
      UpdateStats([](ManagerStats& st) { st.registrations_accepted++; });
      ApplySnapshotLocked(resource, state);
      // The stream may have ended before the endpoint was installed, when its
      // own callback found nothing to act on.
      if ((*ep)->stopped()) HandleStreamEndLocked(ep->get());
    }
  }
  bool refused_for_stop = deferred.to_stop.size() == 1 && deferred.to_stop[0] == *ep;
  RunDeferred(std::move(deferred));
  if (taken_by) return socket_taken(*taken_by);
  if (refused_for_stop) return refuse(UnavailableError("device manager is stopping"));
  if (options_.metrics) options_.metrics->ObserveRegistration(resource);
  spdlog::info(
      "event=plugin_registered resource={} socket={} pre_start_required={} "
      "get_preferred_allocation_available={}",
      QuoteLogValue(resource, kMaxLogValueBytes), QuoteLogValue(socket_path, kMaxLogValueBytes),
      (*ep)->options().pre_start_required(), (*ep)->options().get_preferred_allocation_available());
  return OkStatus();
}

void ManagerImpl::OnEndpointUpdate(Endpoint* ep) {
  kdm::MutexLock lock(&mu_);
  auto it = resources_.find(ep->resource());
  if (it == resources_.end() || it->second.current.get() != ep) return;  // not the newest
  ApplySnapshotLocked(ep->resource(), it->second);
}

void ManagerImpl::ApplySnapshotLocked(const std::string& resource, ResourceState& state) {
  if (!state.current) return;
  Endpoint::Snapshot snap = state.current->Latest();
  if (snap.seq <= state.applied_seq) return;
  state.applied_seq = snap.seq;
  std::vector<LedgerDevice> devices = ToLedgerDevices(*snap.devices);
  StatusOr<SnapshotReport> report = ledger_.SetDevices(resource, devices);
  if (!report.ok()) {
    spdlog::error("event=snapshot_refused resource={} error={}",
                  QuoteLogValue(resource, kMaxLogValueBytes),
                  QuoteLogValue(report.status().message(), kMaxLogValueBytes));
    return;
  }
  // A flapping plugin sends a snapshot every millisecond: both lines are
  // rate-limited per resource, and what they leave out is counted.
  const Clock::TimePoint now = clock_->Now();
  bool held_back = false;
  if (!report->duplicate_ids.empty() || report->empty_ids > 0) {
    if (std::optional<int64_t> suppressed = repaired_log_.Admit(resource, now)) {
      spdlog::warn(
          "event=snapshot_repaired resource={} duplicate_ids={} empty_ids={} "
          "suppressed={}",
          QuoteLogValue(resource, kMaxLogValueBytes), LogList(report->duplicate_ids),
          report->empty_ids, *suppressed);
    } else {
      held_back = true;
    }
  }
  PersistOrRetryLocked(report->change, "device snapshot");
  // The Ledger found the health changes while taking the snapshot in (no
  // copies of the before and after device lists: they cost as much as the
  // rest of a 10,000-device snapshot).
  const size_t healthy = report->change.registered_devices[resource].size();
  if (std::optional<int64_t> suppressed = devices_log_.Admit(resource, now)) {
    spdlog::info(
        "event=devices_updated resource={} seq={} devices={} healthy={} changes={} "
        "suppressed={}",
        QuoteLogValue(resource, kMaxLogValueBytes), snap.seq, devices.size(), healthy,
        report->health_changes.size(), *suppressed);
  } else {
    held_back = true;
  }
  if (held_back) {
    log_held_back_ = true;
    ScheduleLogFlushLocked();
  }
  std::vector<DeviceHealthEvent> events;
  events.reserve(report->health_changes.size());
  for (LedgerDevice& d : report->health_changes) {
    events.push_back({resource, std::move(d.id), d.healthy});
  }
  QueueHealthEventsLocked(std::move(events));
}

void ManagerImpl::FlushLogLimitersLocked(bool all) {
  // With `all`, every window counts as over.
  const Clock::TimePoint now = clock_->Now() + (all ? kSnapshotLogWindow : Clock::Duration(0));
  for (const auto& [resource, n] : devices_log_.Flush(now)) {
    spdlog::info("event=devices_updated_suppressed resource={} suppressed={}",
                 QuoteLogValue(resource, kMaxLogValueBytes), n);
  }
  for (const auto& [resource, n] : repaired_log_.Flush(now)) {
    spdlog::warn("event=snapshot_repaired_suppressed resource={} suppressed={}",
                 QuoteLogValue(resource, kMaxLogValueBytes), n);
  }
}

void ManagerImpl::ScheduleLogFlushLocked() {
  if (log_flush_timer_ != 0 || stopping_) return;
  log_flush_timer_ = clock_->ScheduleAfter(kSnapshotLogWindow, [this] { OnLogFlush(); });
}

void ManagerImpl::OnLogFlush() {
  kdm::MutexLock lock(&mu_);
  log_flush_timer_ = 0;
  if (stopping_) return;
  FlushLogLimitersLocked(/*all=*/false);
  // Every window that held a line back before now is over one window later:
  // the count of a flood's last lines goes out even when no snapshot follows.
  if (std::exchange(log_held_back_, false)) ScheduleLogFlushLocked();
}

void ManagerImpl::OnEndpointStreamEnd(Endpoint* ep) {
  // On the endpoint's own reader thread: the endpoint goes to retired_, to
  // be joined by another thread (joining here would join this very thread).
  kdm::MutexLock lock(&mu_);
  HandleStreamEndLocked(ep);
}

void ManagerImpl::HandleStreamEndLocked(Endpoint* ep) {
  auto rit = resources_.find(ep->resource());
  if (rit == resources_.end()) return;
  ResourceState& state = rit->second;
  auto it = state.endpoints.find(ep->socket_path());
  if (it == state.endpoints.end() || it->second.get() != ep) return;  // already replaced
  // The reader thread cannot join itself: someone else joins it later.
  retired_.push_back(it->second);
  state.endpoints.erase(it);
  state.order.erase(ep);
  const std::string& resource = ep->resource();
  if (state.current.get() != ep) {
    spdlog::info("event=endpoint_closed resource={} socket={} current=false",
                 QuoteLogValue(resource, kMaxLogValueBytes),
                 QuoteLogValue(ep->socket_path(), kMaxLogValueBytes));
    return;  // an older endpoint of a rolling update went away
  }
  if (!state.endpoints.empty()) {
    // Fall back to the newest remaining endpoint.
    auto newest = std::max_element(
        state.endpoints.begin(), state.endpoints.end(), [&](const auto& a, const auto& b) {
          return state.order[a.second.get()] < state.order[b.second.get()];
        });
    state.current = newest->second;
    state.applied_seq = 0;
    spdlog::info("event=endpoint_closed resource={} socket={} fallback={}",
                 QuoteLogValue(resource, kMaxLogValueBytes),
                 QuoteLogValue(ep->socket_path(), kMaxLogValueBytes),
                 QuoteLogValue(state.current->socket_path(), kMaxLogValueBytes));
    ApplySnapshotLocked(resource, state);
    return;
  }
  std::vector<LedgerDevice> before = ledger_.Devices(resource);
  checkpoint::Change change = ledger_.MarkAllUnhealthy(resource);
  PersistOrRetryLocked(change, "endpoint stopped");
  QueueHealthEventsLocked(HealthChanges(resource, before, ledger_.Devices(resource)));
  StartGraceTimerLocked(resource, state);
  spdlog::warn("event=endpoint_stopped resource={} socket={} grace_ms={}",
               QuoteLogValue(resource, kMaxLogValueBytes),
               QuoteLogValue(ep->socket_path(), kMaxLogValueBytes), options_.grace_period.count());
}

void ManagerImpl::StartGraceTimerLocked(const std::string& resource, ResourceState& state) {
  if (stopping_) return;
  // A previous timer is not cancelled here (Cancel may wait for a running
  // callback that waits for mu_); the new generation makes it a no-op.
  uint64_t generation = ++state.generation;
  state.grace_timer = clock_->ScheduleAfter(options_.grace_period, [this, resource, generation] {
    OnGraceExpired(resource, generation);
  });
}

void ManagerImpl::OnGraceExpired(const std::string& resource, uint64_t generation) {
  Deferred deferred;
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_) return;
    auto it = resources_.find(resource);
    if (it == resources_.end()) return;
    ResourceState& state = it->second;
    if (state.generation != generation || !state.endpoints.empty()) return;
    state.grace_timer = 0;
    if (state.current) deferred.to_stop.push_back(state.current);
    state.current.reset();
    state.applied_seq = 0;
    checkpoint::Change change = ledger_.RemoveResource(resource);
    PersistOrRetryLocked(change, "grace period expired");
    spdlog::warn("event=resource_removed resource={} reason=grace_period_expired",
                 QuoteLogValue(resource, kMaxLogValueBytes));
  }
  RunDeferred(std::move(deferred));
}

// ---------------------------------------------------------------- allocation

Status ManagerImpl::Allocate(const Pod& pod, const std::string& container) {
  const Container* c = pod.FindContainer(container);
  if (c == nullptr) {
    return NotFoundError("pod \"" + pod.uid + "\" has no container \"" + container + "\"");
  }
  if (Status allowed = CheckRestrictions(options_.restrictions, pod); !allowed.ok()) {
    UpdateStats([](ManagerStats& s) {
      s.allocation_failures++;
      s.restricted_rejections++;
    });
    spdlog::warn("event=allocate_restricted pod={} namespace={} container={} error={}",
                 QuoteLogValue(pod.uid, kMaxLogValueBytes),
                 QuoteLogValue(pod.namespace_name, kMaxLogValueBytes),
                 QuoteLogValue(container, kMaxLogValueBytes),
                 QuoteLogValue(allowed.message(), kMaxLogValueBytes));
    return allowed;
  }
  std::map<std::string, int64_t> requests;
  {
    kdm::MutexLock lock(&mu_);
    StatusOr<std::map<std::string, int64_t>> r = ledger_.ContainerRequests(*c);
    if (!r.ok()) {
      UpdateStats([](ManagerStats& s) { s.allocation_failures++; });
      return r.status();
    }
    requests = std::move(*r);
  }
  // Resource-name order, as the Ledger's map gives it: deterministic.
  for (const auto& [resource, count] : requests) {
    Status s = AllocateResource(pod, container, resource, count);
    if (!s.ok()) {
      UpdateStats([](ManagerStats& st) { st.allocation_failures++; });
      spdlog::warn("event=allocate_failed pod={} container={} resource={} count={} error={}",
                   QuoteLogValue(pod.uid, kMaxLogValueBytes),
                   QuoteLogValue(container, kMaxLogValueBytes),
                   QuoteLogValue(resource, kMaxLogValueBytes), count,
                   QuoteLogValue(s.message(), kMaxLogValueBytes));
      return s;
    }
  }
  return OkStatus();
}

namespace {
// The preferred hint with the fewest NUMA nodes, then the lowest ones; none
// when there is no preference or no preferred hint.
std::optional<NumaHint> BestHint(const ResourceHints& hints) {
  if (!hints) return std::nullopt;
  std::optional<NumaHint> best;
  for (const NumaHint& h : *hints) {
    if (!h.preferred) continue;
    if (!best || h.nodes.size() < best->nodes.size() ||
        (h.nodes.size() == best->nodes.size() && h.nodes < best->nodes)) {
      best = h;
    }
  }
  return best;
}
}  // namespace

Status ManagerImpl::AllocateResource(const Pod& pod, const std::string& container,
                                     const std::string& resource, int64_t count) {
  AllocationPlan plan;
  std::vector<std::string> choice;
  std::shared_ptr<Endpoint> ep;
  {
    kdm::MutexLock lock(&mu_);
    std::optional<NumaHint> hint;
    if (options_.align_numa)
      hint = BestHint(ledger_.TopologyHints(pod, container, resource, count));
    if (calls_cancelled_) {
      return CancelledError("allocation of " + resource + " cancelled: shutting down");
    }
    KDM_ASSIGN_OR_RETURN(plan, ledger_.Plan(pod, container, resource, count, hint));
    if (plan.reuse) return OkStatus();
    auto it = resources_.find(resource);
    if (it != resources_.end()) ep = it->second.current;
    if (!ep) return UnavailableError("endpoint " + resource + " has been stopped");
    choice = ledger_.DefaultChoice(plan);
    KDM_RETURN_IF_ERROR(ledger_.Reserve(plan, choice));
  }
  // From here every failure path releases the reservation.
  auto release = [&](Status s) {
    kdm::MutexLock lock(&mu_);
    ledger_.ReleaseReservation(plan.key);
    return s;
  };

  if (ep->options().get_preferred_allocation_available() && plan.real_choice) {
    std::vector<std::string> available = plan.must_include;
    available.insert(available.end(), plan.candidates.begin(), plan.candidates.end());
    StatusOr<std::vector<std::string>> answer =
        ep->GetPreferredAllocation(available, plan.must_include, static_cast<int>(plan.size));
    bool cancelled = false;
    if (!answer.ok()) {
      kdm::MutexLock lock(&mu_);
      cancelled = calls_cancelled_;
    }
    if (cancelled) {
      // Stopping: no fallback to the default choice, no Allocate.
      return release(answer.status());
    } else if (!answer.ok()) {
      UpdateStats([](ManagerStats& s) { s.preferred_rpc_error++; });
      spdlog::warn(
          "event=preferred_allocation_fallback resource={} pod={} container={} "
          "reason=rpc_error error={}",
          QuoteLogValue(resource, kMaxLogValueBytes), QuoteLogValue(pod.uid, kMaxLogValueBytes),
          QuoteLogValue(container, kMaxLogValueBytes),
          QuoteLogValue(answer.status().message(), kMaxLogValueBytes));
    } else {
      kdm::MutexLock lock(&mu_);
      Status valid = ledger_.ValidatePreferred(plan, *answer);
      if (!valid.ok()) {
        UpdateStats([](ManagerStats& s) { s.preferred_invalid++; });
        spdlog::warn(
            "event=preferred_allocation_fallback resource={} pod={} container={} "
            "reason=invalid_answer answer={} error={}",
            QuoteLogValue(resource, kMaxLogValueBytes), QuoteLogValue(pod.uid, kMaxLogValueBytes),
            QuoteLogValue(container, kMaxLogValueBytes), LogList(*answer),
            QuoteLogValue(valid.message(), kMaxLogValueBytes));
      } else if (Status r = ledger_.Reserve(plan, *answer); !r.ok()) {
        // Another admission took one of the preferred devices meanwhile; the
        // default choice is still reserved (Reserve changes nothing on error).
        UpdateStats([](ManagerStats& s) { s.preferred_taken++; });
        spdlog::warn(
            "event=preferred_allocation_fallback resource={} pod={} container={} "
            "reason=taken error={}",
            QuoteLogValue(resource, kMaxLogValueBytes), QuoteLogValue(pod.uid, kMaxLogValueBytes),
            QuoteLogValue(container, kMaxLogValueBytes),
            QuoteLogValue(r.message(), kMaxLogValueBytes));
      } else {
        choice = *answer;
        UpdateStats([](ManagerStats& s) { s.preferred_ok++; });
      }
    }
  } else {
    UpdateStats([](ManagerStats& s) { s.preferred_not_asked++; });
  }

  const auto allocate_start = std::chrono::steady_clock::now();
  StatusOr<v1beta1::ContainerAllocateResponse> response = ep->Allocate(choice);
  if (options_.metrics) {
    options_.metrics->ObserveAllocation(
        resource,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - allocate_start).count());
  }
  if (!response.ok()) return release(response.status());
  std::string bytes;
  if (!response->SerializeToString(&bytes)) {
    return release(InternalError("cannot serialize the Allocate response of " + resource));
  }

  kdm::MutexLock lock(&mu_);
  StatusOr<checkpoint::Change> change = ledger_.Commit(plan.key, bytes);
  if (!change.ok()) {
    ledger_.ReleaseReservation(plan.key);
    return change.status();
  }
  if (Status s = PersistLocked(*change, "allocation"); !s.ok()) {
    (void)ledger_.UndoCommit(plan.key);
    ledger_.ReleaseReservation(plan.key);
    return s;
  }
  UpdateStats([](ManagerStats& s) { s.allocations++; });
  spdlog::info("event=allocated pod={} container={} resource={} devices={}",
               QuoteLogValue(pod.uid, kMaxLogValueBytes),
               QuoteLogValue(container, kMaxLogValueBytes),
               QuoteLogValue(resource, kMaxLogValueBytes), LogList(choice));
  return OkStatus();
}

Status ManagerImpl::PersistLocked(const checkpoint::Change& change, const char* what) {
  // The pending change goes first, in the same transaction: the store never
  // sees a later change without the earlier ones.
  checkpoint::Change merged;
  const checkpoint::Change* write = &change;
  if (pending_change_) {
    merged = *pending_change_;
    MergeChange(merged, change);
    write = &merged;
  }
  if (write->empty()) return OkStatus();
  const auto write_start = std::chrono::steady_clock::now();
  Status s = store_->Apply(*write);
  if (options_.metrics) {
    options_.metrics->ObserveCheckpointWrite(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count());
  }
  if (!s.ok()) {
    UpdateStats([](ManagerStats& st) { st.checkpoint_errors++; });
    spdlog::error("event=checkpoint_write_failed what=\"{}\" store=\"{}\" pending={} error={}",
                  what, store_->Describe(), pending_change_.has_value(),
                  QuoteLogValue(s.message(), kMaxLogValueBytes));
    return s.WithPrefix(std::string("cannot write checkpoint (") + what + ")");
  }
  if (pending_change_) {
    spdlog::info("event=checkpoint_pending_written what=\"{}\"", what);
    pending_change_.reset();
    retry_backoff_ = kCheckpointRetryInitial;
  }
  return OkStatus();
}

void ManagerImpl::PersistOrRetryLocked(const checkpoint::Change& change, const char* what) {
  if (PersistLocked(change, what).ok()) return;
  // A fact about a plugin cannot be rolled back: keep it until it lands.
  if (!TouchesRegisteredDevicesOnly(change)) {
    // Not reachable: snapshots, stream ends and grace expiries change only
    // registered devices. A pending pod change could not merge in order.
    spdlog::error("event=checkpoint_change_not_retryable what=\"{}\"", what);
    return;
  }
  if (!pending_change_) pending_change_.emplace();
  MergeChange(*pending_change_, change);
  ScheduleCheckpointRetryLocked();
}

void ManagerImpl::ScheduleCheckpointRetryLocked() {
  if (retry_timer_ != 0 || stopping_) return;
  retry_timer_ = clock_->ScheduleAfter(retry_backoff_, [this] { OnCheckpointRetry(); });
}

void ManagerImpl::OnCheckpointRetry() {
  kdm::MutexLock lock(&mu_);
  retry_timer_ = 0;
  if (stopping_ || !pending_change_) return;
  UpdateStats([](ManagerStats& st) { st.checkpoint_retries++; });
  spdlog::warn("event=checkpoint_write_retry store=\"{}\" backoff_ms={}", store_->Describe(),
               std::chrono::duration_cast<std::chrono::milliseconds>(retry_backoff_).count());
  checkpoint::Change none;
  if (PersistLocked(none, "retry").ok()) return;
  retry_backoff_ = std::min<Clock::Duration>(retry_backoff_ * 2, kCheckpointRetryMax);
  ScheduleCheckpointRetryLocked();
}

// ---------------------------------------------------------------- run options

StatusOr<RunContainerOptions> ManagerImpl::GetDeviceRunContainerOptions(
    const Pod& pod, const std::string& container) {
  KDM_ASSIGN_OR_RETURN(ContainerAllocation allocation, GetContainerAllocation(pod, container));
  return std::move(allocation.run);
}

StatusOr<ContainerAllocation> ManagerImpl::GetContainerAllocation(const Pod& pod,
                                                                  const std::string& container) {
  struct PreStart {
    std::shared_ptr<Endpoint> ep;
    std::vector<std::string> ids;
  };
  std::vector<checkpoint::PodDevicesEntry> entries;
  std::vector<PreStart> pre_starts;
  {
    kdm::MutexLock lock(&mu_);
    entries = ledger_.ContainerEntries(pod.uid, container);
    for (const auto& e : entries) {
      auto it = resources_.find(e.resource_name);
      if (it == resources_.end()) {
        return NotFoundError("endpoint not found in cache for a registered resource: " +
                             e.resource_name);
      }
      const std::shared_ptr<Endpoint>& ep = it->second.current;
      if (!ep) continue;  // restored, plugin not back yet: options unknown
      if (ep->options().pre_start_required()) {
        pre_starts.push_back({ep, FlattenDeviceIds(e.device_ids)});
      }
    }
  }
  for (const auto& p : pre_starts) {
    if (Status s = p.ep->PreStartContainer(p.ids); !s.ok()) {
      spdlog::warn("event=pre_start_failed pod={} container={} resource={} error={}",
                   QuoteLogValue(pod.uid, kMaxLogValueBytes),
                   QuoteLogValue(container, kMaxLogValueBytes),
                   QuoteLogValue(p.ep->resource(), kMaxLogValueBytes),
                   QuoteLogValue(s.message(), kMaxLogValueBytes));
      return s;
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.resource_name < b.resource_name; });
  std::vector<ResourceRunOptions> responses;
  responses.reserve(entries.size());
  for (const auto& e : entries) {
    v1beta1::ContainerAllocateResponse r;
    if (!r.ParseFromString(e.alloc_response)) {
      return DataLossError("stored allocate response of pod \"" + pod.uid + "\" container \"" +
                           container + "\" resource " + e.resource_name + " does not parse");
    }
    responses.push_back({e.resource_name, std::move(r)});
  }
  std::vector<RunOptionsConflict> conflicts;
  RunContainerOptions out = MergeRunOptions(std::move(responses), &conflicts);
  for (const RunOptionsConflict& c : conflicts) {
    spdlog::warn(
        "event=run_options_conflict pod={} container={} what={} kept={} ignored={}",
        QuoteLogValue(pod.uid, kMaxLogValueBytes), QuoteLogValue(container, kMaxLogValueBytes),
        QuoteLogValue(c.what, kMaxLogValueBytes), QuoteLogValue(c.kept_by, kMaxLogValueBytes),
        QuoteLogValue(c.ignored_from, kMaxLogValueBytes));
  }
  ContainerAllocation allocation;
  for (const auto& e : entries) {
    std::vector<std::string>& ids = allocation.devices[e.resource_name];
    std::vector<std::string> flat = FlattenDeviceIds(e.device_ids);
    ids.insert(ids.end(), flat.begin(), flat.end());
  }
  for (auto& [resource, ids] : allocation.devices) std::sort(ids.begin(), ids.end());
  allocation.run = std::move(out);
  return allocation;
}

Status ManagerImpl::CheckResourcesRegistered(const Pod& pod) const {
  const std::set<std::string> asked = ExtendedResourcesOf(pod);
  kdm::MutexLock lock(&mu_);
  for (const std::string& resource : asked) KDM_RETURN_IF_ERROR(ledger_.CheckRegistered(resource));
  return OkStatus();
}

// ---------------------------------------------------------------- queries

CapacityReport ManagerImpl::GetCapacity() const {
  kdm::MutexLock lock(&mu_);
  Capacity c = ledger_.GetCapacity();
  CapacityReport out;
  for (const auto& [name, rc] : c.resources) out.resources[name] = {rc.capacity, rc.allocatable};
  out.deleted = c.deleted;
  return out;
}

Status ManagerImpl::UpdateAllocatedDevices() {
  if (!options_.active_pods) {
    return FailedPreconditionError(
        "UpdateAllocatedDevices needs Options.active_pods; without it no pod is known active");
  }
  std::set<std::string> active = options_.active_pods();
  Deferred deferred;
  Status result;
  {
    kdm::MutexLock lock(&mu_);
    Ledger before = ledger_;
    checkpoint::Change change = ledger_.RetainOnlyPods(active);
    result = PersistLocked(change, "garbage collection");
    if (!result.ok()) {
      ledger_ = std::move(before);
    } else if (!change.removed_pods.empty()) {
      spdlog::info("event=pods_garbage_collected pods={}", LogList(change.removed_pods));
    }
  }
  RunDeferred(std::move(deferred));  // joins retired endpoints
  return result;
}

Status ManagerImpl::RemovePod(const std::string& pod_uid) {
  kdm::MutexLock lock(&mu_);
  Ledger before = ledger_;
  checkpoint::Change change = ledger_.RemovePod(pod_uid);
  Status s = PersistLocked(change, "pod removal");
  if (!s.ok()) {
    ledger_ = std::move(before);
    return s;
  }
  if (!change.empty())
    spdlog::info("event=pod_removed pod={}", QuoteLogValue(pod_uid, kMaxLogValueBytes));
  return OkStatus();
}

namespace {

TopologyHints ToTopologyHints(const std::map<std::string, ResourceHints>& in) {
  TopologyHints out;
  for (const auto& [resource, hints] : in) {
    if (!hints) {
      out[resource] = std::nullopt;
      continue;
    }
    std::vector<TopologyHint> v;
    for (const auto& h : *hints) v.push_back({h.nodes, h.preferred});
    out[resource] = std::move(v);
  }
  return out;
}

}  // namespace

StatusOr<TopologyHints> ManagerImpl::GetTopologyHints(const Pod& pod,
                                                      const std::string& container) const {
  kdm::MutexLock lock(&mu_);
  KDM_ASSIGN_OR_RETURN(auto hints, ledger_.ContainerTopologyHints(pod, container));
  return ToTopologyHints(hints);
}

StatusOr<TopologyHints> ManagerImpl::GetPodTopologyHints(const Pod& pod) const {
  kdm::MutexLock lock(&mu_);
  KDM_ASSIGN_OR_RETURN(auto hints, ledger_.PodTopologyHints(pod));
  return ToTopologyHints(hints);
}

std::vector<ContainerDevices> ManagerImpl::GetAllocatableDevices() const {
  kdm::MutexLock lock(&mu_);
  std::vector<ContainerDevices> out;
  for (const std::string& resource : ledger_.Resources()) {
    for (const LedgerDevice& d : ledger_.Devices(resource)) {
      if (!d.healthy) continue;
      if (d.numa_nodes.empty()) {
        out.push_back({resource, {d.id}, std::nullopt});
        continue;
      }
      for (int64_t node : d.numa_nodes) out.push_back({resource, {d.id}, node});
    }
  }
  return out;
}

std::vector<ContainerDevices> ManagerImpl::GetDevices(const std::string& pod_uid,
                                                      const std::string& container) const {
  kdm::MutexLock lock(&mu_);
  std::vector<ContainerDevices> out;
  for (const auto& e : ledger_.ContainerEntries(pod_uid, container)) {
    for (const auto& [node, ids] : e.device_ids) {
      std::optional<int64_t> numa;
      if (node != checkpoint::kNoNumaNode) numa = node;
      out.push_back({e.resource_name, ids, numa});
    }
  }
  return out;
}

std::vector<std::string> ManagerImpl::GetPodsWithDevices() const {
  kdm::MutexLock lock(&mu_);
  std::set<std::string> pods;
  for (const auto& e : ledger_.AllEntries()) pods.insert(e.pod_uid);
  return {pods.begin(), pods.end()};
}

// ---------------------------------------------------------------- health subscription

int64_t ManagerImpl::Subscribe(HealthCallback callback) {
  kdm::MutexLock lock(&subscribers_mu_);
  int64_t id = ++next_subscriber_;
  uint64_t from_seq;
  {
    // Changes taken in before now are not this subscriber's.
    kdm::MutexLock events(&events_mu_);
    from_seq = next_event_seq_;
  }
  subscribers_[id] = Subscriber{std::move(callback), from_seq};
  return id;
}

void ManagerImpl::Unsubscribe(int64_t id) {
  kdm::MutexLock lock(&subscribers_mu_);
  subscribers_.erase(id);
}

void ManagerImpl::QueueHealthEventsLocked(std::vector<DeviceHealthEvent> events) {
  if (events.empty()) return;
  kdm::MutexLock lock(&events_mu_);
  if (delivery_stop_) return;  // after Stop(): nobody is left to deliver them
  if (pending_events_.empty()) {
    pending_events_ = std::move(events);
  } else {
    pending_events_.insert(pending_events_.end(), std::make_move_iterator(events.begin()),
                           std::make_move_iterator(events.end()));
  }
  while (pending_seqs_.size() < pending_events_.size()) pending_seqs_.push_back(next_event_seq_++);
  if (pending_events_.size() > coalesce_at_) CoalesceEventsLocked();
  max_pending_events_ = std::max(max_pending_events_, pending_events_.size());
}

void ManagerImpl::CoalesceEventsLocked() {
  // Latest state wins; an event keeps the place of its device's first one.
  // The sequence number is the latest one's: the state is the latest's.
  std::map<std::pair<std::string_view, std::string_view>, size_t> slot;
  std::vector<DeviceHealthEvent> kept;
  std::vector<uint64_t> kept_seqs;
  for (size_t i = 0; i < pending_events_.size(); ++i) {
    const DeviceHealthEvent& e = pending_events_[i];
    auto [it, inserted] = slot.try_emplace({e.resource_name, e.device_id}, kept.size());
    if (inserted) {
      kept.push_back(e);
      kept_seqs.push_back(pending_seqs_[i]);
    } else {
      kept[it->second].healthy = e.healthy;
      kept_seqs[it->second] = pending_seqs_[i];
    }
  }
  slot.clear();  // its keys view pending_events_
  const size_t before = pending_events_.size();
  pending_events_ = std::move(kept);
  pending_seqs_ = std::move(kept_seqs);
  // Amortised: the next coalescing needs at least as many new events.
  coalesce_at_ = std::max(kHealthEventsCoalesceAt, 2 * pending_events_.size());
  spdlog::debug("event=health_events_coalesced before={} after={}", before, pending_events_.size());
}

bool ManagerImpl::HasEventsOrStopLocked() const {
  return !pending_events_.empty() || delivery_stop_;
}

void ManagerImpl::DeliveryLoop() {
  for (;;) {
    std::vector<DeviceHealthEvent> batch;
    std::vector<uint64_t> seqs;
    std::function<void(const std::vector<DeviceHealthEvent>&)> hook;
    {
      // Idle until there is work; Stop() sets delivery_stop_ and ends this.
      kdm::MutexLock lock(&events_mu_, kdm::Condition(this, &ManagerImpl::HasEventsOrStopLocked));
      if (pending_events_.empty()) return;  // stopping, and everything delivered
      batch.swap(pending_events_);
      seqs.swap(pending_seqs_);
      coalesce_at_ = kHealthEventsCoalesceAt;
      hook = before_delivery_for_test_;
    }
    if (hook) hook(batch);
    const uint64_t oldest = *std::min_element(seqs.begin(), seqs.end());
    kdm::MutexLock lock(&subscribers_mu_);
    for (const auto& [id, subscriber] : subscribers_) {
      if (subscriber.from_seq <= oldest) {
        subscriber.callback(batch);
        continue;
      }
      // Subscribed while this batch was on its way: only the later changes.
      std::vector<DeviceHealthEvent> later;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (seqs[i] >= subscriber.from_seq) later.push_back(batch[i]);
      }
      if (!later.empty()) subscriber.callback(later);
    }
  }
}

// ---------------------------------------------------------------- stats, tests

void ManagerImpl::CountRpcError(const char* method) {
  UpdateStats([method](ManagerStats& s) { s.rpc_errors[method]++; });
}

ManagerStats ManagerImpl::GetStats() const {
  std::map<std::string, int64_t> endpoints = {{"connected", 0}, {"stopped", 0}};
  {
    kdm::MutexLock lock(&mu_);
    for (const auto& [resource, state] : resources_) {
      endpoints["connected"] += static_cast<int64_t>(state.endpoints.size());
      if (state.endpoints.empty() && state.current) endpoints["stopped"]++;
    }
  }
  kdm::MutexLock lock(&stats_mu_);
  ManagerStats out = stats_;
  out.endpoints_by_state = std::move(endpoints);
  return out;
}

Status ManagerImpl::CheckInvariantsForTest() const {
  kdm::MutexLock lock(&mu_);
  return ledger_.CheckInvariants();
}

checkpoint::CheckpointData ManagerImpl::LedgerCheckpointForTest() const {
  kdm::MutexLock lock(&mu_);
  return ledger_.ToCheckpointData();
}

bool ManagerImpl::CheckpointPendingForTest() const {
  kdm::MutexLock lock(&mu_);
  return pending_change_.has_value();
}

std::size_t ManagerImpl::PendingHealthEventsForTest() const {
  kdm::MutexLock lock(&events_mu_);
  return pending_events_.size();
}

std::size_t ManagerImpl::MaxPendingHealthEventsForTest() const {
  kdm::MutexLock lock(&events_mu_);
  return max_pending_events_;
}

void ManagerImpl::SetBeforeHealthDeliveryForTest(
    std::function<void(const std::vector<DeviceHealthEvent>&)> hook) {
  kdm::MutexLock lock(&events_mu_);
  before_delivery_for_test_ = std::move(hook);
}

int ManagerImpl::LiveEndpointsForTest(const std::string& resource) const {
  kdm::MutexLock lock(&mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return 0;
  int n = 0;
  for (const auto& [path, ep] : it->second.endpoints) n += ep->stopped() ? 0 : 1;
  return n;
}

}  // namespace kdm::devicemanager
