#include "kdm/devicemanager/manager_impl.h"

#include <algorithm>
#include <set>
#include <utility>

#include "kdm/base/log_value.h"
#include "kdm/devicemanager/device_snapshot.h"
#include "kdm/devicemanager/os.h"
#include "kdm/pluginapi/constants.h"
#include "spdlog/fmt/ranges.h"
#include "spdlog/spdlog.h"

namespace kdm::devicemanager {

namespace {

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

bool IsDns1123Label(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(s.front()) || !alnum(s.back())) return false;
  for (char c : s) {
    if (!alnum(c) && c != '-') return false;
  }
  return true;
}

std::set<std::string> ActivePods(const Manager::Options& options) {
  if (!options.active_pods) return {};
  return options.active_pods();
}

}  // namespace

// ---------------------------------------------------------------- Create

Status ValidateRestrictions(const std::map<std::string, std::set<std::string>>& restrictions) {
  for (const auto& [resource, namespaces] : restrictions) {
    if (!IsExtendedResourceName(resource)) {
      return InvalidArgumentError("Options.restrictions: \"" + resource +
                                  "\" is not an extended resource name (domain/name)");
    }
    if (namespaces.empty()) {
      return InvalidArgumentError("Options.restrictions: resource \"" + resource +
                                  "\" has an empty namespace list");
    }
    for (const std::string& ns : namespaces) {
      if (!IsDns1123Label(ns)) {
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
  std::string socket = JoinPath(options.plugin_dir, pluginapi::kKubeletSocketName);
  if (socket.size() > pluginapi::kMaxUnixSocketPathLength) {
    return InvalidArgumentError("Options.plugin_dir: " + socket + " is longer than " +
                                std::to_string(pluginapi::kMaxUnixSocketPathLength) +
                                " bytes, the limit of a unix socket path");
  }
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
  if (!options.boot_id_provider) options.boot_id_provider = [] { return ReadBootId(); };
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
                            : std::shared_ptr<checkpoint::Store>(checkpoint::NewMemoryStore())) {}

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
  KDM_RETURN_IF_ERROR(EnsureDirectory(dir, 0750));
  // An existing directory more open than 0750 is tightened: anyone who can
  // write there could plant sockets or symlinks for plugins to meet.
  if (StatusOr<unsigned> was = TightenDirectoryMode(dir, 0750); !was.ok()) {
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
  std::set<std::string> active;
  bool active_read = false;
  {
    kdm::MutexLock lock(&mu_);
    StatusOr<checkpoint::CheckpointData> data = store_->Load();
    if (!data.ok()) return data.status().WithPrefix("cannot load checkpoint " + store_->Describe());
    bool rebooted = !data->boot_id.empty() && !boot_id.empty() && data->boot_id != boot_id;
    if (rebooted && options_.active_pods) {
      // The callback may take the embedder's locks: call it without ours.
      mu_.Unlock();
      active = ActivePods(options_);
      active_read = true;
      mu_.Lock();
    }
    RestoreReport restored = ledger_.Restore(*data);
    for (const SkippedCheckpointEntry& e : restored.skipped) {
      spdlog::warn("event=checkpoint_entry_skipped pod={} container={} resource={} device={} "
                   "held_by={} reason={}",
                   QuoteLogValue(e.pod_uid, kMaxLogValueBytes),
                   QuoteLogValue(e.container_name, kMaxLogValueBytes),
                   QuoteLogValue(e.resource_name, kMaxLogValueBytes),
                   QuoteLogValue(e.device_id, kMaxLogValueBytes),
                   QuoteLogValue(e.held_by_pod_uid, kMaxLogValueBytes), QuoteLogValue(e.reason));
    }
    for (const auto& [resource, ids] : data->registered_devices) {
      ResourceState& state = resources_[resource];
      StartGraceTimerLocked(resource, state);
    }
    spdlog::info("event=checkpoint_restored store=\"{}\" entries={} skipped={} resources={} "
                 "boot_id={} previous_boot_id={}",
                 store_->Describe(), data->entries.size(), restored.skipped.size(),
                 data->registered_devices.size(), boot_id, data->boot_id);
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
  }
  KDM_ASSIGN_OR_RETURN(std::vector<std::string> removed,
                       RemoveSocketsExcept(dir, pluginapi::kKubeletSocketName));
  for (const auto& name : removed) {
    spdlog::info("event=stale_socket_removed dir={} socket={}", dir, name);
  }
  KDM_ASSIGN_OR_RETURN(
      registration_,
      RegistrationServer::Start(
          dir,
          [this](const std::string& resource, const std::string& socket) {
            return RegisterPlugin(resource, socket);
          },
          [this](const Status&) { UpdateStats([](ManagerStats& s) { s.registrations_rejected++; }); },
          {.max_in_flight = options_.max_registrations_in_flight}));
  return OkStatus();
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
  }
  RunDeferred(std::move(deferred));
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
  if (!deferred.events.empty()) Notify(deferred.events);
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
    spdlog::warn("event=plugin_refused resource={} socket={} error=\"{}\"", resource, socket_path,
                 s.message());
    return s;
  };
  // A socket serves one resource: a second resource naming a socket that is
  // connected for another would make one plugin feed two resources.
  auto socket_taken = [&](const std::string& other) {
    return refuse(AlreadyExistsError("endpoint " + socket_path + " is already registered for "
                                     "resource \"" + other + "\"; a plugin socket serves one "
                                     "resource, so it cannot also serve \"" + resource + "\""));
  };
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_) return UnavailableError("device manager is stopping");
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
  auto ep = Endpoint::Connect(resource, socket_path, *stub, deadlines, std::move(callbacks));
  if (!ep.ok()) return refuse(ep.status());

  Deferred deferred;
  std::optional<std::string> taken_by;
  {
    kdm::MutexLock lock(&mu_);
    if (stopping_) {
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
      ApplySnapshotLocked(resource, state, deferred);
      // The stream may have ended before the endpoint was installed, when its
      // own callback found nothing to act on.
      if ((*ep)->stopped()) HandleStreamEndLocked(ep->get(), deferred);
    }
  }
  bool refused_for_stop = deferred.to_stop.size() == 1 && deferred.to_stop[0] == *ep;
  RunDeferred(std::move(deferred));
  if (taken_by) return socket_taken(*taken_by);
  if (refused_for_stop) return refuse(UnavailableError("device manager is stopping"));
  UpdateStats([](ManagerStats& st) { st.registrations_accepted++; });
  if (options_.metrics) options_.metrics->ObserveRegistration(resource);
  spdlog::info("event=plugin_registered resource={} socket={} pre_start_required={} "
               "get_preferred_allocation_available={}",
               resource, socket_path, (*ep)->options().pre_start_required(),
               (*ep)->options().get_preferred_allocation_available());
  return OkStatus();
}

void ManagerImpl::OnEndpointUpdate(Endpoint* ep) {
  Deferred deferred;
  {
    kdm::MutexLock lock(&mu_);
    auto it = resources_.find(ep->resource());
    if (it == resources_.end() || it->second.current.get() != ep) return;  // not the newest
    ApplySnapshotLocked(ep->resource(), it->second, deferred);
  }
  // On the endpoint's own reader thread: joining retired endpoints here could
  // mean joining this very thread.
  RunDeferred(std::move(deferred), /*reap_retired=*/false);
}

void ManagerImpl::ApplySnapshotLocked(const std::string& resource, ResourceState& state,
                                      Deferred& deferred) {
  if (!state.current) return;
  Endpoint::Snapshot snap = state.current->Latest();
  if (snap.seq <= state.applied_seq) return;
  state.applied_seq = snap.seq;
  std::vector<LedgerDevice> devices = ToLedgerDevices(*snap.devices);
  StatusOr<SnapshotReport> report = ledger_.SetDevices(resource, devices);
  if (!report.ok()) {
    spdlog::error("event=snapshot_refused resource={} error=\"{}\"", resource,
                  report.status().message());
    return;
  }
  if (!report->duplicate_ids.empty() || report->empty_ids > 0) {
    spdlog::warn("event=snapshot_repaired resource={} duplicate_ids=[{}] empty_ids={}", resource,
                 fmt::join(report->duplicate_ids, ","), report->empty_ids);
  }
  (void)PersistLocked(report->change, "device snapshot");
  // The Ledger found the health changes while taking the snapshot in (no
  // copies of the before and after device lists: they cost as much as the
  // rest of a 10,000-device snapshot).
  const size_t healthy = report->change.registered_devices[resource].size();
  spdlog::info("event=devices_updated resource={} seq={} devices={} healthy={} changes={}",
               resource, snap.seq, devices.size(), healthy, report->health_changes.size());
  deferred.events.reserve(deferred.events.size() + report->health_changes.size());
  for (LedgerDevice& d : report->health_changes) {
    deferred.events.push_back({resource, std::move(d.id), d.healthy});
  }
}

void ManagerImpl::OnEndpointStreamEnd(Endpoint* ep) {
  Deferred deferred;
  {
    kdm::MutexLock lock(&mu_);
    HandleStreamEndLocked(ep, deferred);
  }
  RunDeferred(std::move(deferred), /*reap_retired=*/false);  // see OnEndpointUpdate
}

void ManagerImpl::HandleStreamEndLocked(Endpoint* ep, Deferred& deferred) {
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
    spdlog::info("event=endpoint_closed resource={} socket={} current=false", resource,
                 ep->socket_path());
    return;  // an older endpoint of a rolling update went away
  }
  if (!state.endpoints.empty()) {
    // Fall back to the newest remaining endpoint.
    auto newest = std::max_element(state.endpoints.begin(), state.endpoints.end(),
                                   [&](const auto& a, const auto& b) {
                                     return state.order[a.second.get()] <
                                            state.order[b.second.get()];
                                   });
    state.current = newest->second;
    state.applied_seq = 0;
    spdlog::info("event=endpoint_closed resource={} socket={} fallback={}", resource,
                 ep->socket_path(), state.current->socket_path());
    ApplySnapshotLocked(resource, state, deferred);
    return;
  }
  std::vector<LedgerDevice> before = ledger_.Devices(resource);
  checkpoint::Change change = ledger_.MarkAllUnhealthy(resource);
  (void)PersistLocked(change, "endpoint stopped");
  auto events = HealthChanges(resource, before, ledger_.Devices(resource));
  deferred.events.insert(deferred.events.end(), events.begin(), events.end());
  StartGraceTimerLocked(resource, state);
  spdlog::warn("event=endpoint_stopped resource={} socket={} grace_ms={}", resource,
               ep->socket_path(), options_.grace_period.count());
}

void ManagerImpl::StartGraceTimerLocked(const std::string& resource, ResourceState& state) {
  if (stopping_) return;
  // A previous timer is not cancelled here (Cancel may wait for a running
  // callback that waits for mu_); the new generation makes it a no-op.
  uint64_t generation = ++state.generation;
  state.grace_timer = clock_->ScheduleAfter(
      options_.grace_period,
      [this, resource, generation] { OnGraceExpired(resource, generation); });
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
    (void)PersistLocked(change, "grace period expired");
    spdlog::warn("event=resource_removed resource={} reason=grace_period_expired", resource);
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
    spdlog::warn("event=allocate_restricted pod={} namespace={} container={} error=\"{}\"",
                 pod.uid, pod.namespace_name, container, allowed.message());
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
      spdlog::warn("event=allocate_failed pod={} container={} resource={} count={} error=\"{}\"",
                   pod.uid, container, resource, count, s.message());
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
    if (options_.align_numa) hint = BestHint(ledger_.TopologyHints(pod, container, resource, count));
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
    StatusOr<std::vector<std::string>> answer = ep->GetPreferredAllocation(
        available, plan.must_include, static_cast<int>(plan.size));
    if (!answer.ok()) {
      UpdateStats([](ManagerStats& s) { s.preferred_rpc_error++; });
      spdlog::warn("event=preferred_allocation_fallback resource={} pod={} container={} "
                   "reason=rpc_error error=\"{}\"",
                   resource, pod.uid, container, answer.status().message());
    } else {
      kdm::MutexLock lock(&mu_);
      Status valid = ledger_.ValidatePreferred(plan, *answer);
      if (!valid.ok()) {
        UpdateStats([](ManagerStats& s) { s.preferred_invalid++; });
        spdlog::warn("event=preferred_allocation_fallback resource={} pod={} container={} "
                     "reason=invalid_answer answer=[{}] error=\"{}\"",
                     resource, pod.uid, container, fmt::join(*answer, ","), valid.message());
      } else if (Status r = ledger_.Reserve(plan, *answer); !r.ok()) {
        // Another admission took one of the preferred devices meanwhile; the
        // default choice is still reserved (Reserve changes nothing on error).
        UpdateStats([](ManagerStats& s) { s.preferred_taken++; });
        spdlog::warn("event=preferred_allocation_fallback resource={} pod={} container={} "
                     "reason=taken error=\"{}\"",
                     resource, pod.uid, container, r.message());
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
  spdlog::info("event=allocated pod={} container={} resource={} devices=[{}]", pod.uid, container,
               resource, fmt::join(choice, ","));
  return OkStatus();
}

Status ManagerImpl::PersistLocked(const checkpoint::Change& change, const char* what) {
  if (change.empty()) return OkStatus();
  const auto write_start = std::chrono::steady_clock::now();
  Status s = store_->Apply(change);
  if (options_.metrics) {
    options_.metrics->ObserveCheckpointWrite(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count());
  }
  if (!s.ok()) {
    UpdateStats([](ManagerStats& st) { st.checkpoint_errors++; });
    spdlog::error("event=checkpoint_write_failed what=\"{}\" store=\"{}\" error=\"{}\"", what,
                  store_->Describe(), s.message());
    return s.WithPrefix(std::string("cannot write checkpoint (") + what + ")");
  }
  return OkStatus();
}

// ---------------------------------------------------------------- run options

StatusOr<RunContainerOptions> ManagerImpl::GetDeviceRunContainerOptions(
    const Pod& pod, const std::string& container) {
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
      spdlog::warn("event=pre_start_failed pod={} container={} resource={} error=\"{}\"", pod.uid,
                   container, p.ep->resource(), s.message());
      return s;
    }
  }
  std::sort(entries.begin(), entries.end(),
            [](const auto& a, const auto& b) { return a.resource_name < b.resource_name; });
  RunContainerOptions out;
  std::map<std::string, std::string> env_owner, annotation_owner;
  std::map<std::string, std::pair<Mount, std::string>> mounts;
  std::map<std::string, std::pair<DeviceSpec, std::string>> devices;
  std::set<std::string> cdi_seen;
  auto conflict = [&](const std::string& what, const std::string& kept_by,
                      const std::string& ignored_from) {
    out.conflicts.push_back(what + ": " + ignored_from + "'s value ignored, " + kept_by +
                            "'s kept");
    spdlog::warn("event=run_options_conflict pod={} container={} what=\"{}\" kept={} ignored={}",
                 pod.uid, container, what, kept_by, ignored_from);
  };
  for (const auto& e : entries) {
    v1beta1::ContainerAllocateResponse r;
    if (!r.ParseFromString(e.alloc_response)) {
      return DataLossError("stored allocate response of pod \"" + pod.uid + "\" container \"" +
                           container + "\" resource " + e.resource_name + " does not parse");
    }
    const std::string& res = e.resource_name;
    for (const auto& [k, v] : r.envs()) {
      auto [it, inserted] = out.envs.emplace(k, v);
      if (inserted) {
        env_owner[k] = res;
      } else if (it->second != v) {
        conflict("env \"" + k + "\"", env_owner[k], res);
      }
    }
    for (const auto& m : r.mounts()) {
      Mount mm{m.container_path(), m.host_path(), m.read_only()};
      auto [it, inserted] = mounts.emplace(m.container_path(), std::make_pair(mm, res));
      if (!inserted && !(it->second.first == mm)) {
        conflict("mount \"" + m.container_path() + "\"", it->second.second, res);
      }
    }
    for (const auto& d : r.devices()) {
      DeviceSpec dd{d.container_path(), d.host_path(), d.permissions()};
      auto [it, inserted] = devices.emplace(d.container_path(), std::make_pair(dd, res));
      if (!inserted && !(it->second.first == dd)) {
        conflict("device \"" + d.container_path() + "\"", it->second.second, res);
      }
    }
    for (const auto& [k, v] : r.annotations()) {
      auto [it, inserted] = out.annotations.emplace(k, v);
      if (inserted) {
        annotation_owner[k] = res;
      } else if (it->second != v) {
        conflict("annotation \"" + k + "\"", annotation_owner[k], res);
      }
    }
    for (const auto& cdi : r.cdi_devices()) {
      if (cdi_seen.insert(cdi.name()).second) out.cdi_devices.push_back(cdi.name());
    }
  }
  for (auto& [path, m] : mounts) out.mounts.push_back(m.first);
  for (auto& [path, d] : devices) out.devices.push_back(d.first);
  return out;
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
      spdlog::info("event=pods_garbage_collected pods=[{}]", fmt::join(change.removed_pods, ","));
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
  if (!change.empty()) spdlog::info("event=pod_removed pod={}", pod_uid);
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
  subscribers_[id] = std::move(callback);
  return id;
}

void ManagerImpl::Unsubscribe(int64_t id) {
  kdm::MutexLock lock(&subscribers_mu_);
  subscribers_.erase(id);
}

void ManagerImpl::Notify(const std::vector<DeviceHealthEvent>& events) {
  kdm::MutexLock lock(&subscribers_mu_);
  for (const auto& [id, callback] : subscribers_) callback(events);
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

int ManagerImpl::LiveEndpointsForTest(const std::string& resource) const {
  kdm::MutexLock lock(&mu_);
  auto it = resources_.find(resource);
  if (it == resources_.end()) return 0;
  int n = 0;
  for (const auto& [path, ep] : it->second.endpoints) n += ep->stopped() ? 0 : 1;
  return n;
}

}  // namespace kdm::devicemanager
