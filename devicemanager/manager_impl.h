// kdm::devicemanager::ManagerImpl: the Manager (manager.h) behind one mutex:
// the pure Ledger, one Endpoint per registered plugin socket, the
// RegistrationServer, the checkpoint Store and the grace timers. Private
// header (not installed); tests construct it directly to inject a stub
// factory (gMock plugins) instead of real gRPC channels.
//
// Locking: mu_ guards the Ledger, the endpoint bookkeeping and the store. It
// is held only around Ledger work and the store write that persists it,
// never across a plugin RPC, an Endpoint::Stop() (which joins a thread) or a
// user callback. events_mu_ guards the health event queue; it is a leaf,
// taken with mu_ held (events are queued under mu_, so the queue has the
// Ledger's order) and with subscribers_mu_ held (Subscribe). subscribers_mu_
// is held while health callbacks run (so Unsubscribe can promise the
// callback is done); it is never taken with mu_ or events_mu_ held.
// stats_mu_ is a leaf.
//
// Threads: gRPC server threads run RegisterPlugin(); each Endpoint's reader
// thread runs OnEndpointUpdate()/OnEndpointStreamEnd(); the clock's thread
// runs OnGraceExpired(), the checkpoint retries and the log summaries. The
// delivery thread, started by the constructor and joined by Stop(), is the
// only one that calls Subscribe() callbacks. Endpoints whose stream ended are
// kept in retired_ and joined by the next RegisterPlugin(), grace expiry, GC
// or Stop().
//
// Checkpoint writes come in two kinds (docs/architecture.md "Error
// policy"): an allocation, a pod removal or a GC is rolled back when its
// write fails; a snapshot, a stream end or a grace expiry states facts about
// a plugin, so its change is kept pending (merged, per resource the latest
// state) and retried on the clock, 100 ms doubling to 5 s, until it lands.
// Every write first carries the pending change, in the same transaction, so
// the store never sees a later change before an earlier one.
//
// Example (tests):
//   ManagerImpl m(options, [&](const std::string&, auto) { return stub; });
//   ASSERT_TRUE(m.RegisterPlugin("vendor.com/gpu", "/tmp/x/gpu.sock").ok());
#ifndef KDM_DEVICEMANAGER_MANAGER_IMPL_H_
#define KDM_DEVICEMANAGER_MANAGER_IMPL_H_

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "deviceplugin/v1beta1/api.grpc.pb.h"
#include "kdm/base/log_rate_limiter.h"
#include "kdm/base/sync.h"
#include "kdm/devicemanager/endpoint.h"
#include "kdm/devicemanager/ledger.h"
#include "kdm/devicemanager/manager.h"
#include "kdm/devicemanager/registration_server.h"

namespace kdm::devicemanager {

// INVALID_ARGUMENT naming the first bad entry of Options::restrictions
// (a key that is not an extended resource name, an empty namespace list, a
// namespace that is not a DNS-1123 label).
Status ValidateRestrictions(const std::map<std::string, std::set<std::string>>& restrictions);

// PERMISSION_DENIED `resource "<r>" is restricted to namespaces <a>, <b>; pod
// namespace "<ns>" is not allowed` when a container of `pod` asks for a
// restricted resource (non-zero limit) and the pod's namespace is not listed.
Status CheckRestrictions(const std::map<std::string, std::set<std::string>>& restrictions,
                         const Pod& pod);

class ManagerImpl : public Manager {
 public:
  // Opens a client to the plugin socket at `socket_path` within `timeout`.
  using StubFactory = std::function<StatusOr<std::shared_ptr<v1beta1::DevicePlugin::StubInterface>>(
      const std::string& socket_path, std::chrono::milliseconds timeout)>;

  // Pending health events are coalesced (manager.h, Subscribe) once the
  // queue holds more than this many.
  static constexpr std::size_t kHealthEventsCoalesceAt = 1024;
  // Back-off of checkpoint write retries.
  static constexpr Clock::Duration kCheckpointRetryInitial = std::chrono::milliseconds(100);
  static constexpr Clock::Duration kCheckpointRetryMax = std::chrono::seconds(5);
  // `event=devices_updated` (and `event=snapshot_repaired`) lines let
  // through per resource per window; the rest are counted (`suppressed=N`).
  static constexpr int kSnapshotLogBurst = 20;
  static constexpr Clock::Duration kSnapshotLogWindow = std::chrono::seconds(1);

  // Starts the delivery thread. REQUIRES: options already validated (Create
  // does), store and clock set.
  ManagerImpl(Options options, StubFactory stub_factory);
  ~ManagerImpl() override;

  Status Start() override ABSL_LOCKS_EXCLUDED(mu_);
  void Stop() override ABSL_LOCKS_EXCLUDED(mu_);
  int CancelPluginCalls() override ABSL_LOCKS_EXCLUDED(mu_);
  Status Allocate(const Pod& pod, const std::string& container) override ABSL_LOCKS_EXCLUDED(mu_);
  StatusOr<RunContainerOptions> GetDeviceRunContainerOptions(const Pod& pod,
                                                             const std::string& container) override
      ABSL_LOCKS_EXCLUDED(mu_);
  StatusOr<ContainerAllocation> GetContainerAllocation(const Pod& pod,
                                                       const std::string& container) override
      ABSL_LOCKS_EXCLUDED(mu_);
  Status CheckResourcesRegistered(const Pod& pod) const override ABSL_LOCKS_EXCLUDED(mu_);
  CapacityReport GetCapacity() const override ABSL_LOCKS_EXCLUDED(mu_);
  Status UpdateAllocatedDevices() override ABSL_LOCKS_EXCLUDED(mu_);
  Status RemovePod(const std::string& pod_uid) override ABSL_LOCKS_EXCLUDED(mu_);
  StatusOr<TopologyHints> GetTopologyHints(const Pod& pod,
                                           const std::string& container) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  StatusOr<TopologyHints> GetPodTopologyHints(const Pod& pod) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ContainerDevices> GetAllocatableDevices() const override ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<ContainerDevices> GetDevices(const std::string& pod_uid,
                                           const std::string& container) const override
      ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<std::string> GetPodsWithDevices() const override ABSL_LOCKS_EXCLUDED(mu_);
  int64_t Subscribe(HealthCallback callback) override ABSL_LOCKS_EXCLUDED(subscribers_mu_);
  void Unsubscribe(int64_t id) override ABSL_LOCKS_EXCLUDED(subscribers_mu_);
  ManagerStats GetStats() const override ABSL_LOCKS_EXCLUDED(stats_mu_);

  // The RegistrationServer's handler (also called directly by tests): dials
  // the plugin, reads its options, opens ListAndWatch and installs the
  // endpoint as the newest one of `resource`. Counts accepted/rejected.
  Status RegisterPlugin(const std::string& resource, const std::string& socket_path)
      ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: Ledger::CheckInvariants() under the lock.
  Status CheckInvariantsForTest() const ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: number of live (not stopped) endpoints of `resource`.
  int LiveEndpointsForTest(const std::string& resource) const ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: the Ledger's state in checkpoint form (no boot id).
  checkpoint::CheckpointData LedgerCheckpointForTest() const ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: whether a failed checkpoint change waits for its retry.
  bool CheckpointPendingForTest() const ABSL_LOCKS_EXCLUDED(mu_);
  // For tests: health events queued and not yet handed to subscribers, now
  // and at most so far.
  std::size_t PendingHealthEventsForTest() const ABSL_LOCKS_EXCLUDED(events_mu_);
  std::size_t MaxPendingHealthEventsForTest() const ABSL_LOCKS_EXCLUDED(events_mu_);
  // For tests (a sync point): `hook` runs on the delivery thread with each
  // batch just before the subscribers get it, without any lock held.
  void SetBeforeHealthDeliveryForTest(
      std::function<void(const std::vector<DeviceHealthEvent>&)> hook)
      ABSL_LOCKS_EXCLUDED(events_mu_);

 private:
  struct ResourceState {
    // Live endpoints by socket path.
    std::map<std::string, std::shared_ptr<Endpoint>> endpoints;
    // Registration order of each live endpoint (higher = newer).
    std::map<const Endpoint*, uint64_t> order;
    // The endpoint whose snapshots count and whose RPCs are used: the newest
    // live one, or the last one after it stopped, or null (restored from the
    // checkpoint, or removed after the grace period).
    std::shared_ptr<Endpoint> current;
    // Sequence number of current's last applied snapshot.
    uint64_t applied_seq = 0;
    Clock::TimerId grace_timer = 0;
    // Bumped by every registration; a grace timer only acts on its own.
    uint64_t generation = 0;
  };

  // What a locked step leaves to do once the lock is released.
  struct Deferred {
    std::vector<std::shared_ptr<Endpoint>> to_stop;
    std::vector<Clock::TimerId> to_cancel;
  };

  // The other resource whose live endpoint uses `socket_path`, if any.
  std::optional<std::string> OtherResourceOfSocketLocked(const std::string& resource,
                                                         const std::string& socket_path) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Status AllocateResource(const Pod& pod, const std::string& container, const std::string& resource,
                          int64_t count) ABSL_LOCKS_EXCLUDED(mu_);

  void OnEndpointUpdate(Endpoint* ep) ABSL_LOCKS_EXCLUDED(mu_);
  void OnEndpointStreamEnd(Endpoint* ep) ABSL_LOCKS_EXCLUDED(mu_);
  void OnGraceExpired(const std::string& resource, uint64_t generation) ABSL_LOCKS_EXCLUDED(mu_);

  // Applies current's newest snapshot to the Ledger, persists it (or keeps
  // it pending) and queues its health changes.
  void ApplySnapshotLocked(const std::string& resource, ResourceState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `ep` (a live endpoint of its resource) ended: forget it; if it was the
  // last, mark the devices unhealthy and start the grace timer.
  void HandleStreamEndLocked(Endpoint* ep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartGraceTimerLocked(const std::string& resource, ResourceState& state)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Start(): the loaded checkpoint into the Ledger (grace timers for its
  // resources, the boot id recorded); after a reboot only the pods in
  // `active` keep their devices (`active_read`: whether the embedder's
  // callback supplied them, for the log).
  Status RestoreCheckpointLocked(const checkpoint::CheckpointData& data, const std::string& boot_id,
                                 const std::set<std::string>& active, bool active_read)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the pending change (if any) and `change` in one transaction; logs
  // and counts a failure. For changes the caller rolls back on error: the
  // pending change stays pending, `change` is not kept.
  Status PersistLocked(const checkpoint::Change& change, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // For facts (snapshot, stream end, grace expiry): as PersistLocked, but on
  // error `change` joins the pending change and a retry is scheduled.
  // REQUIRES: `change` touches registered devices only.
  void PersistOrRetryLocked(const checkpoint::Change& change, const char* what)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleCheckpointRetryLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnCheckpointRetry() ABSL_LOCKS_EXCLUDED(mu_);
  // Logs the suppressed-line counts of windows that are over; with `all`,
  // of every window (Stop).
  void FlushLogLimitersLocked(bool all) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ScheduleLogFlushLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnLogFlush() ABSL_LOCKS_EXCLUDED(mu_);
  // Stops endpoints, cancels timers, and (unless on an endpoint's reader
  // thread) stops and joins the retired endpoints.
  void RunDeferred(Deferred deferred, bool reap_retired = true) ABSL_LOCKS_EXCLUDED(mu_);

  // Appends `events` to the delivery queue (under mu_: the queue keeps the
  // order in which the Ledger produced them) and wakes the delivery thread.
  void QueueHealthEventsLocked(std::vector<DeviceHealthEvent> events)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) ABSL_LOCKS_EXCLUDED(events_mu_);
  // Collapses pending events of the same (resource, device) to the latest.
  void CoalesceEventsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(events_mu_);
  bool HasEventsOrStopLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(events_mu_);
  // The delivery thread: pops every pending event as one batch and calls
  // the subscribers with it, until Stop() and the queue is empty.
  void DeliveryLoop() ABSL_LOCKS_EXCLUDED(events_mu_, subscribers_mu_);

  void CountRpcError(const char* method) ABSL_LOCKS_EXCLUDED(stats_mu_);
  template <typename F>
  void UpdateStats(F f) ABSL_LOCKS_EXCLUDED(stats_mu_) {
    kdm::MutexLock lock(&stats_mu_);
    f(stats_);
  }

  const Options options_;
  const StubFactory stub_factory_;
  const std::shared_ptr<Clock> clock_;

  mutable kdm::Mutex mu_;
  Ledger ledger_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ResourceState> resources_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<Endpoint>> retired_ ABSL_GUARDED_BY(mu_);
  // Endpoints whose Connect runs now (RegisterPlugin), for CancelPluginCalls.
  std::set<std::shared_ptr<Endpoint>> connecting_ ABSL_GUARDED_BY(mu_);
  // A Store is not thread-safe: used only with mu_ held (not expressible as
  // an annotation on a shared_ptr).
  const std::shared_ptr<checkpoint::Store> store_;
  uint64_t next_order_ ABSL_GUARDED_BY(mu_) = 0;
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Set by CancelPluginCalls(): no plugin RPC is started any more.
  bool calls_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Facts whose write failed, merged (registered devices only), waiting for
  // the retry timer or the next write to carry them.
  std::optional<checkpoint::Change> pending_change_ ABSL_GUARDED_BY(mu_);
  Clock::TimerId retry_timer_ ABSL_GUARDED_BY(mu_) = 0;
  Clock::Duration retry_backoff_ ABSL_GUARDED_BY(mu_) = kCheckpointRetryInitial;
  // Per resource: event=devices_updated and event=snapshot_repaired lines.
  kdm::LogRateLimiter devices_log_ ABSL_GUARDED_BY(mu_){kSnapshotLogBurst, kSnapshotLogWindow};
  kdm::LogRateLimiter repaired_log_ ABSL_GUARDED_BY(mu_){kSnapshotLogBurst, kSnapshotLogWindow};
  Clock::TimerId log_flush_timer_ ABSL_GUARDED_BY(mu_) = 0;
  // A line was held back since the flush timer was last scheduled.
  bool log_held_back_ ABSL_GUARDED_BY(mu_) = false;

  // Owned by Start()/Stop() (the embedder's thread), never touched elsewhere.
  kdm::Mutex lifecycle_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<RegistrationServer> registration_ ABSL_GUARDED_BY(lifecycle_mu_);
  // Started by the constructor, joined by Stop() (with lifecycle_mu_ held).
  std::thread delivery_thread_ ABSL_GUARDED_BY(lifecycle_mu_);

  // The health event queue (see QueueHealthEventsLocked).
  mutable kdm::Mutex events_mu_ ABSL_ACQUIRED_AFTER(mu_, subscribers_mu_);
  std::vector<DeviceHealthEvent> pending_events_ ABSL_GUARDED_BY(events_mu_);
  // The sequence number of each pending event (of its latest state), and
  // the next one to give: a subscriber gets the events numbered from the
  // value next_event_seq_ had when it subscribed.
  std::vector<uint64_t> pending_seqs_ ABSL_GUARDED_BY(events_mu_);
  uint64_t next_event_seq_ ABSL_GUARDED_BY(events_mu_) = 0;
  // Coalesce once pending_events_ grows past this (kHealthEventsCoalesceAt,
  // or twice what the last coalescing kept: amortised linear work).
  std::size_t coalesce_at_ ABSL_GUARDED_BY(events_mu_) = kHealthEventsCoalesceAt;
  std::size_t max_pending_events_ ABSL_GUARDED_BY(events_mu_) = 0;
  bool delivery_stop_ ABSL_GUARDED_BY(events_mu_) = false;
  std::function<void(const std::vector<DeviceHealthEvent>&)> before_delivery_for_test_
      ABSL_GUARDED_BY(events_mu_);

  kdm::Mutex subscribers_mu_;
  struct Subscriber {
    HealthCallback callback;
    uint64_t from_seq = 0;  // the first event sequence number it gets
  };
  std::map<int64_t, Subscriber> subscribers_ ABSL_GUARDED_BY(subscribers_mu_);
  int64_t next_subscriber_ ABSL_GUARDED_BY(subscribers_mu_) = 0;

  mutable kdm::Mutex stats_mu_;
  ManagerStats stats_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace kdm::devicemanager

#endif  // KDM_DEVICEMANAGER_MANAGER_IMPL_H_
