#include "kdm/fakes/fault_handlers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "kdm/base/log_value.h"
#include "kdm/fakes/faulty_plugin.h"
#include "kdm/pluginapi/constants.h"

namespace kdm::fakes {
namespace {

using plugin::CallContext;
using plugin::DevicePluginHandler;
using plugin::ForwardingHandler;
using plugin::ForwardingStream;
using plugin::ListAndWatchStream;
using plugin::WaitResult;
using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

// lw-delta-updates: one single-device message this often.
constexpr milliseconds kDeltaInterval{200};
// alloc-not-concurrent holds each call this long, so that overlap is certain.
constexpr milliseconds kAllocateHold{20};
// pref-slow never holds a call longer than this.
constexpr milliseconds kSlowBound{60'000};

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

template <typename Repeated>
std::vector<std::string> Strings(const Repeated& r) {
  return std::vector<std::string>(r.begin(), r.end());
}

// --- ListAndWatch ------------------------------------------------------------

// lw-duplicate-ids, lw-bad-health, lw-negative-numa: every message the inner
// handler writes is rewritten by `rewrite` on its way out.
class RewriteSnapshots final : public ForwardingHandler {
 public:
  using Rewrite = std::function<void(v1beta1::ListAndWatchResponse&)>;

  RewriteSnapshots(std::shared_ptr<DevicePluginHandler> inner, Rewrite rewrite)
      : ForwardingHandler(std::move(inner)), rewrite_(std::move(rewrite)) {}

  Status ListAndWatch(ListAndWatchStream& stream) override {
    RewritingStream rewriting(stream, rewrite_);
    return inner().ListAndWatch(rewriting);
  }

 private:
  class RewritingStream final : public ForwardingStream {
   public:
    RewritingStream(ListAndWatchStream& stream, const Rewrite& rewrite)
        : ForwardingStream(stream), rewrite_(rewrite) {}
    bool Write(const v1beta1::ListAndWatchResponse& message) override {
      v1beta1::ListAndWatchResponse broken = message;
      rewrite_(broken);
      return inner().Write(broken);
    }

   private:
    const Rewrite& rewrite_;
  };

  const Rewrite rewrite_;
};

// lw-no-snapshot: the inner handler's messages are swallowed; the stream is
// held (and counted) until it ends.
class WithholdSnapshots final : public ForwardingHandler {
 public:
  WithholdSnapshots(std::shared_ptr<DevicePluginHandler> inner, HeldCallCounter& held)
      : ForwardingHandler(std::move(inner)), held_(held) {}

  Status ListAndWatch(ListAndWatchStream& stream) override {
    HeldCallCounter::Hold hold(held_);
    // Tests wait for this line to know a stream is held now.
    spdlog::info("event=fault_holding fault=lw-no-snapshot rpc=ListAndWatch");
    SilentStream silent(stream);
    return inner().ListAndWatch(silent);
  }

 private:
  class SilentStream final : public ForwardingStream {
   public:
    using ForwardingStream::ForwardingStream;
    bool Write(const v1beta1::ListAndWatchResponse&) override { return true; }
  };

  HeldCallCounter& held_;
};

// lw-delta-updates: after the inner handler's first message (the full
// list), every kDeltaInterval a message holding one device, its health
// toggled, in device order. The stream's waits carry the timer: while the
// inner handler waits for a change, its wait wakes for each delta.
class DeltaUpdates final : public ForwardingHandler {
 public:
  explicit DeltaUpdates(std::shared_ptr<DevicePluginHandler> inner)
      : ForwardingHandler(std::move(inner)) {}

  Status ListAndWatch(ListAndWatchStream& stream) override {
    DeltaStream deltas(stream);
    return inner().ListAndWatch(deltas);
  }

 private:
  class DeltaStream final : public ForwardingStream {
   public:
    using ForwardingStream::ForwardingStream;

    bool Write(const v1beta1::ListAndWatchResponse& message) override {
      if (!first_) {
        first_ = message;
        healthy_.assign(message.devices_size(), true);
        next_ = SteadyClock::now() + kDeltaInterval;
      }
      return inner().Write(message);
    }

    WaitResult WaitForChange(uint64_t seen, std::optional<TimePoint> deadline) override {
      while (true) {
        if (!first_ || healthy_.empty() || (deadline && *deadline <= next_)) {
          return inner().WaitForChange(seen, deadline);
        }
        WaitResult r = inner().WaitForChange(seen, next_);
        if (r != WaitResult::kDeadline) return r;
        // The delta's time: one device, its health toggled.
        next_ += kDeltaInterval;
        const int i = next_delta_++ % static_cast<int>(healthy_.size());
        healthy_[i] = !healthy_[i];
        v1beta1::ListAndWatchResponse delta;
        *delta.add_devices() = first_->devices(i);
        delta.mutable_devices(0)->set_health(
            std::string(healthy_[i] ? pluginapi::kHealthy : pluginapi::kUnhealthy));
        if (!inner().Write(delta)) return WaitResult::kEnded;
      }
    }

   private:
    std::optional<v1beta1::ListAndWatchResponse> first_;
    std::vector<bool> healthy_;  // per device, the health last sent
    int next_delta_ = 0;
    TimePoint next_;
  };
};

// health-not-sent: the first message goes out; every later one (a health
// change) is swallowed.
class FirstSnapshotOnly final : public ForwardingHandler {
 public:
  using ForwardingHandler::ForwardingHandler;

  Status ListAndWatch(ListAndWatchStream& stream) override {
    FirstOnlyStream first(stream);
    return inner().ListAndWatch(first);
  }

 private:
  class FirstOnlyStream final : public ForwardingStream {
   public:
    using ForwardingStream::ForwardingStream;
    bool Write(const v1beta1::ListAndWatchResponse& message) override {
      if (sent_) return true;
      sent_ = true;
      return inner().Write(message);
    }

   private:
    bool sent_ = false;
  };
};

// health-stale-streams, the way NVIDIA's v0.13 plugin loses health events:
// all its streams receive from one channel of health events, and a stream
// the kubelet cancelled goes on waiting on it until it takes an event (and
// then fails to send it). So each change goes to ONE waiting stream, the one
// waiting longest, and a change taken by a cancelled stream is lost. Here:
// every stream joins a queue when it opens; a stream the client cancelled
// stays in it as "stale"; each new device-set version (a health change) is
// given to the queue's head (a live head sends it and queues again at the
// back; a stale head is dropped, the change lost). Deterministic: after N
// cancelled streams, the next N changes are lost.
class StaleStreamsTakeChanges final : public ForwardingHandler {
 public:
  using ForwardingHandler::ForwardingHandler;

  Status ListAndWatch(ListAndWatchStream& stream) override {
    const uint64_t token = Join();
    TakingStream taking(stream, *this, token);
    Status s = inner().ListAndWatch(taking);
    Leave(token, /*stale=*/stream.ClientGone());
    return s;
  }

 private:
  class TakingStream final : public ForwardingStream {
   public:
    TakingStream(ListAndWatchStream& stream, StaleStreamsTakeChanges& owner, uint64_t token)
        : ForwardingStream(stream), owner_(owner), token_(token) {}
    std::shared_ptr<const std::vector<plugin::Device>> Devices(uint64_t* version) const override {
      auto devices = ForwardingStream::Devices(&version_);
      if (version != nullptr) *version = version_;
      return devices;
    }
    bool Write(const v1beta1::ListAndWatchResponse& message) override {
      if (!sent_first_) {
        sent_first_ = true;
        return inner().Write(message);
      }
      if (owner_.Take(version_) != token_) return true;  // another stream's change
      return inner().Write(message);
    }

   private:
    StaleStreamsTakeChanges& owner_;
    const uint64_t token_;
    mutable uint64_t version_ = 0;
    bool sent_first_ = false;
  };

  uint64_t Join() {
    kdm::MutexLock lock(&mu_);
    queue_.push_back(++next_token_);
    return next_token_;
  }

  // A stream ends: it stays queued as stale when its client cancelled it,
  // and leaves the queue when the server ended it.
  void Leave(uint64_t token, bool stale) {
    kdm::MutexLock lock(&mu_);
    if (stale) {
      stale_.insert(token);
    } else {
      queue_.erase(std::remove(queue_.begin(), queue_.end(), token), queue_.end());
    }
  }

  // The stream that takes `version` (decided once, by its first asker).
  uint64_t Take(uint64_t version) {
    kdm::MutexLock lock(&mu_);
    if (auto it = taken_.find(version); it != taken_.end()) return it->second;
    uint64_t taker = 0;
    if (!queue_.empty()) {
      taker = queue_.front();
      queue_.pop_front();
      if (stale_.erase(taker) > 0) {
        spdlog::info("event=fault_health_lost fault=health-stale-streams version={} stale_left={}",
                     version, stale_.size());
      } else {
        queue_.push_back(taker);
      }
    }
    taken_[version] = taker;
    while (taken_.size() > 1024) taken_.erase(taken_.begin());
    return taker;
  }

  kdm::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<uint64_t> queue_ ABSL_GUARDED_BY(mu_);
  std::set<uint64_t> stale_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, uint64_t> taken_ ABSL_GUARDED_BY(mu_);
};

// lw-drop-breaks: once a client has cancelled a stream, every later
// ListAndWatch fails at once with UNAVAILABLE.
class BreakAfterCancelledStream final : public ForwardingHandler {
 public:
  using ForwardingHandler::ForwardingHandler;

  Status ListAndWatch(ListAndWatchStream& stream) override {
    if (broken_.load()) {
      return UnavailableError(
          "ListAndWatch is broken since a client cancelled a stream (fault lw-drop-breaks)");
    }
    Status s = inner().ListAndWatch(stream);
    if (stream.ClientGone()) broken_ = true;
    return s;
  }

 private:
  std::atomic<bool> broken_{false};
};

// --- Allocate ----------------------------------------------------------------

// alloc-two-responses, alloc-relative-path, alloc-bad-permissions,
// alloc-bad-env, alloc-bad-cdi: the inner handler's answer, rewritten.
class RewriteAllocate final : public ForwardingHandler {
 public:
  using Rewrite = std::function<void(const v1beta1::AllocateRequest&, v1beta1::AllocateResponse&)>;

  RewriteAllocate(std::shared_ptr<DevicePluginHandler> inner, std::string fault, Rewrite rewrite)
      : ForwardingHandler(std::move(inner)),
        fault_(std::move(fault)),
        rewrite_(std::move(rewrite)) {}

  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override {
    KDM_ASSIGN_OR_RETURN(v1beta1::AllocateResponse response, inner().Allocate(request, call));
    rewrite_(request, response);
    spdlog::info("event=fault_applied fault={} rpc=Allocate container_responses={}", fault_,
                 response.container_responses_size());
    return response;
  }

 private:
  const std::string fault_;
  const Rewrite rewrite_;
};

// Applies `rewrite` to each container's answer (paired with its request).
RewriteAllocate::Rewrite EachContainer(std::function<void(const v1beta1::ContainerAllocateRequest&,
                                                          v1beta1::ContainerAllocateResponse&)>
                                           rewrite) {
  return [rewrite](const v1beta1::AllocateRequest& request, v1beta1::AllocateResponse& response) {
    for (int i = 0;
         i < response.container_responses_size() && i < request.container_requests_size(); ++i) {
      rewrite(request.container_requests(i), *response.mutable_container_responses(i));
    }
  };
}

// alloc-accept-unknown: the inner answer for the known ids, with the
// visible-devices env naming every id asked for, known or not.
class AcceptUnknownIds final : public ForwardingHandler {
 public:
  AcceptUnknownIds(std::shared_ptr<DevicePluginHandler> inner, const FakeDevicePlugin& healthy)
      : ForwardingHandler(std::move(inner)), healthy_(healthy) {}

  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override {
    v1beta1::AllocateResponse response;
    for (const auto& container : request.container_requests()) {
      v1beta1::AllocateRequest known;
      v1beta1::ContainerAllocateRequest* known_ids = known.add_container_requests();
      std::set<std::string> seen;
      for (const std::string& id : container.devices_ids()) {
        if (healthy_.topology().IndexOf(id) && seen.insert(id).second) {
          known_ids->add_devices_ids(id);
        }
      }
      v1beta1::ContainerAllocateResponse* r = response.add_container_responses();
      if (!known_ids->devices_ids().empty()) {
        KDM_ASSIGN_OR_RETURN(v1beta1::AllocateResponse answer, inner().Allocate(known, call));
        if (answer.container_responses_size() > 0) *r = answer.container_responses(0);
      }
      (*r->mutable_envs())[healthy_.visible_devices_env()] = Join(Strings(container.devices_ids()));
    }
    spdlog::info(
        "event=fault_applied fault=alloc-accept-unknown rpc=Allocate "
        "container_responses={}",
        response.container_responses_size());
    return response;
  }

 private:
  const FakeDevicePlugin& healthy_;
};

// alloc-not-concurrent: while another Allocate is in flight, UNAVAILABLE
// "busy"; each call is held kAllocateHold, so that overlap is certain.
class RefuseConcurrentAllocate final : public ForwardingHandler {
 public:
  using ForwardingHandler::ForwardingHandler;

  StatusOr<v1beta1::AllocateResponse> Allocate(const v1beta1::AllocateRequest& request,
                                               CallContext& call) override {
    bool idle = false;
    if (!in_flight_.compare_exchange_strong(idle, true)) {
      return UnavailableError("busy: another Allocate is in flight (fault alloc-not-concurrent)");
    }
    call.WaitUntilEnded(SteadyClock::now() + kAllocateHold);
    StatusOr<v1beta1::AllocateResponse> r = inner().Allocate(request, call);
    in_flight_ = false;
    return r;
  }

 private:
  std::atomic<bool> in_flight_{false};
};

// --- GetPreferredAllocation --------------------------------------------------

void LogPreferred(const std::string& fault, const v1beta1::PreferredAllocationRequest& request,
                  const v1beta1::PreferredAllocationResponse& response) {
  for (int i = 0; i < response.container_responses_size(); ++i) {
    int size =
        i < request.container_requests_size() ? request.container_requests(i).allocation_size() : 0;
    spdlog::info("event=fault_applied fault={} rpc=GetPreferredAllocation size={} answer={}", fault,
                 size, Join(Strings(response.container_responses(i).deviceids())));
  }
}

// pref-wrong-size, pref-not-subset, pref-duplicates, pref-drop-must-include,
// pref-random: each container's answer is `rewrite(request, inner answer)`.
// The inner handler answers first, so a fault answers only what the healthy
// plugin could answer at all.
class RewritePreferred final : public ForwardingHandler {
 public:
  using Rewrite = std::function<StatusOr<v1beta1::ContainerPreferredAllocationResponse>(
      const v1beta1::ContainerPreferredAllocationRequest&,
      v1beta1::ContainerPreferredAllocationResponse, CallContext&)>;

  RewritePreferred(std::shared_ptr<DevicePluginHandler> inner, std::string fault, Rewrite rewrite)
      : ForwardingHandler(std::move(inner)),
        fault_(std::move(fault)),
        rewrite_(std::move(rewrite)) {}

  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call) override {
    KDM_ASSIGN_OR_RETURN(v1beta1::PreferredAllocationResponse response,
                         inner().GetPreferredAllocation(request, call));
    for (int i = 0;
         i < response.container_responses_size() && i < request.container_requests_size(); ++i) {
      KDM_ASSIGN_OR_RETURN(
          *response.mutable_container_responses(i),
          rewrite_(request.container_requests(i), response.container_responses(i), call));
    }
    LogPreferred(fault_, request, response);
    return response;
  }

 private:
  const std::string fault_;
  const Rewrite rewrite_;
};

// The available ids that are not must-include ones, in request order, once each.
std::vector<std::string> RestOf(const v1beta1::ContainerPreferredAllocationRequest& request) {
  const std::set<std::string> must(request.must_include_deviceids().begin(),
                                   request.must_include_deviceids().end());
  std::vector<std::string> rest;
  std::set<std::string> seen;
  for (const std::string& id : request.available_deviceids()) {
    if (!must.count(id) && seen.insert(id).second) rest.push_back(id);
  }
  return rest;
}

// pref-drop-must-include: the inner answer for the request without its
// must-include ids (filled from the rest when that is impossible).
RewritePreferred::Rewrite DropMustInclude(DevicePluginHandler& inner) {
  return [&inner](const v1beta1::ContainerPreferredAllocationRequest& request,
                  v1beta1::ContainerPreferredAllocationResponse healthy,
                  CallContext& call) -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
    if (request.must_include_deviceids().empty()) return healthy;
    const std::vector<std::string> rest = RestOf(request);
    v1beta1::PreferredAllocationRequest without_must;
    auto* c = without_must.add_container_requests();
    for (const std::string& id : rest) c->add_available_deviceids(id);
    c->set_allocation_size(request.allocation_size());
    StatusOr<v1beta1::PreferredAllocationResponse> r =
        inner.GetPreferredAllocation(without_must, call);
    if (r.ok() && r->container_responses_size() == 1) return r->container_responses(0);
    v1beta1::ContainerPreferredAllocationResponse fewer;
    const size_t size = std::max(0, request.allocation_size());
    for (size_t i = 0; i < rest.size() && i < size; ++i) fewer.add_deviceids(rest[i]);
    return fewer;
  };
}

// pref-random: must-include ids plus a random pick of the rest, never the
// same set twice in a row when another set is possible.
class RandomPick {
 public:
  RandomPick() : random_(std::random_device{}()) {}

  v1beta1::ContainerPreferredAllocationResponse Answer(
      const v1beta1::ContainerPreferredAllocationRequest& request) {
    const std::set<std::string> must(request.must_include_deviceids().begin(),
                                     request.must_include_deviceids().end());
    std::vector<std::string> rest = RestOf(request);
    const size_t size = std::max(0, request.allocation_size());
    const size_t pick = size > must.size() ? size - must.size() : 0;
    kdm::MutexLock lock(&mu_);
    std::set<std::string> answer;
    for (int attempt = 0; attempt < 20; ++attempt) {
      std::shuffle(rest.begin(), rest.end(), random_);
      answer = must;
      answer.insert(rest.begin(), rest.begin() + std::min(pick, rest.size()));
      if (answer != last_answer_) break;
    }
    last_answer_ = answer;
    v1beta1::ContainerPreferredAllocationResponse r;
    for (const std::string& id : request.must_include_deviceids()) r.add_deviceids(id);
    for (size_t i = 0; i < pick && i < rest.size(); ++i) r.add_deviceids(rest[i]);
    return r;
  }

 private:
  kdm::Mutex mu_;
  std::mt19937 random_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> last_answer_ ABSL_GUARDED_BY(mu_);
};

// pref-slow: a request with allocation_size >= max(1, device count - 1) is
// held until the client gives up (or Stop, or kSlowBound) and then answered
// CANCELLED; smaller ones get the inner answer.
class SlowPreferred final : public ForwardingHandler {
 public:
  SlowPreferred(std::shared_ptr<DevicePluginHandler> inner, int devices, HeldCallCounter& held)
      : ForwardingHandler(std::move(inner)), devices_(devices), held_(held) {}

  StatusOr<v1beta1::PreferredAllocationResponse> GetPreferredAllocation(
      const v1beta1::PreferredAllocationRequest& request, CallContext& call) override {
    for (const auto& container : request.container_requests()) {
      // The largest requests: all but one of the devices offered (at most
      // all but one of the plugin's).
      const int offered = std::min(devices_, container.available_deviceids_size());
      if (container.allocation_size() < std::max(1, offered - 1)) continue;
      const auto start = SteadyClock::now();
      const char* ended;
      {
        HeldCallCounter::Hold hold(held_);
        // Tests wait for this line to know a call is held now.
        spdlog::info("event=fault_holding fault=pref-slow rpc=GetPreferredAllocation size={}",
                     container.allocation_size());
        WaitResult r = call.WaitUntilEnded(start + kSlowBound);
        ended = r == WaitResult::kDeadline ? "bound"
                : call.ClientGone()        ? "client_gone"
                                           : "stopping";
      }
      spdlog::info(
          "event=fault_applied fault=pref-slow rpc=GetPreferredAllocation size={} "
          "held_ms={} ended={}",
          container.allocation_size(),
          std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count(), ended);
      return CancelledError(
          "GetPreferredAllocation held until the client gave up (fault pref-slow)");
    }
    return inner().GetPreferredAllocation(request, call);
  }

 private:
  const int devices_;
  HeldCallCounter& held_;
};

// --- Options and PreStartContainer --------------------------------------------

// prestart-unimplemented: says pre_start_required, answers UNIMPLEMENTED.
class PrestartUnimplemented final : public ForwardingHandler {
 public:
  using ForwardingHandler::ForwardingHandler;

  StatusOr<v1beta1::DevicePluginOptions> GetDevicePluginOptions() override {
    KDM_ASSIGN_OR_RETURN(v1beta1::DevicePluginOptions o, inner().GetDevicePluginOptions());
    o.set_pre_start_required(true);
    return o;
  }

  Status PreStartContainer(const std::vector<std::string>&, CallContext&) override {
    return UnimplementedError(
        "PreStartContainer is not implemented (fault prestart-unimplemented)");
  }
};

// --- Registration --------------------------------------------------------------

using RegisterRewrite = std::function<bool(v1beta1::RegisterRequest&, int registrations)>;

// A registration fault: `rewrite` changes the request; the request is logged.
RegisterRewrite LoggedRewrite(std::string fault,
                              std::function<bool(v1beta1::RegisterRequest&, int)> rewrite) {
  return [fault = std::move(fault), rewrite = std::move(rewrite)](v1beta1::RegisterRequest& request,
                                                                  int registrations) {
    if (!rewrite(request, registrations)) {
      spdlog::info("event=fault_register_withheld fault={} registrations={}", fault, registrations);
      return false;
    }
    spdlog::info("event=fault_register_request fault={} version={} resource={} endpoint={}", fault,
                 QuoteLogValue(request.version()), QuoteLogValue(request.resource_name()),
                 QuoteLogValue(request.endpoint()));
    return true;
  };
}

// --- the table -------------------------------------------------------------------

struct Parts {
  const FakeDevicePlugin& healthy;
  HeldCallCounter& held;
  std::shared_ptr<DevicePluginHandler> inner;
};

using Builder = FaultSetup (*)(const Parts&);

template <typename Handler, typename... Args>
FaultSetup Wrap(const Parts& p, Args&&... args) {
  return {std::make_shared<Handler>(p.inner, std::forward<Args>(args)...), nullptr};
}

FaultSetup Register(const Parts& p, const char* fault,
                    std::function<bool(v1beta1::RegisterRequest&, int)> rewrite) {
  return {p.inner, LoggedRewrite(fault, std::move(rewrite))};
}

FaultSetup Snapshots(const Parts& p, void (*rewrite)(v1beta1::ListAndWatchResponse&)) {
  return Wrap<RewriteSnapshots>(p, [rewrite](v1beta1::ListAndWatchResponse& r) {
    if (!r.devices().empty()) rewrite(r);
  });
}

FaultSetup Containers(const Parts& p, const char* fault,
                      void (*rewrite)(const v1beta1::ContainerAllocateRequest&,
                                      v1beta1::ContainerAllocateResponse&)) {
  return Wrap<RewriteAllocate>(p, std::string(fault), EachContainer(rewrite));
}

FaultSetup Preferred(const Parts& p, const char* fault,
                     void (*rewrite)(google::protobuf::RepeatedPtrField<std::string>&)) {
  return Wrap<RewritePreferred>(
      p, std::string(fault),
      [rewrite](const v1beta1::ContainerPreferredAllocationRequest&,
                v1beta1::ContainerPreferredAllocationResponse r,
                CallContext&) -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
        rewrite(*r.mutable_deviceids());
        return r;
      });
}

struct FaultEntry {
  const char* name;
  Builder build;
};

// One entry per fault, in the catalogue's order (docs/conformance.md): FaultNames().
const FaultEntry kFaultTable[] = {
    {"reg-bad-version",
     [](const Parts& p) {
       return Register(p, "reg-bad-version", [](v1beta1::RegisterRequest& r, int) {
         r.set_version("v1beta2");
         return true;
       });
     }},
    {"reg-bad-resource-name",
     [](const Parts& p) {
       return Register(p, "reg-bad-resource-name", [](v1beta1::RegisterRequest& r, int) {
         const std::string& name = r.resource_name();
         r.set_resource_name(name.substr(0, name.find('/')) + "/Bad Name!");
         return true;
       });
     }},
    {"reg-endpoint-path",
     [](const Parts& p) {
       return Register(p, "reg-endpoint-path", [](v1beta1::RegisterRequest& r, int) {
         r.set_endpoint("../" + r.endpoint());
         return true;
       });
     }},
    {"reg-options-mismatch",
     [](const Parts& p) {
       return Register(p, "reg-options-mismatch", [](v1beta1::RegisterRequest& r, int) {
         r.mutable_options()->set_pre_start_required(!r.options().pre_start_required());
         return true;
       });
     }},
    {"lw-no-snapshot", [](const Parts& p) { return Wrap<WithholdSnapshots>(p, p.held); }},
    {"lw-duplicate-ids",
     [](const Parts& p) {
       return Snapshots(p,
                        [](v1beta1::ListAndWatchResponse& r) { *r.add_devices() = r.devices(0); });
     }},
    {"lw-bad-health",
     [](const Parts& p) {
       return Snapshots(p, [](v1beta1::ListAndWatchResponse& r) {
         r.mutable_devices(0)->set_health("healthy");
       });
     }},
    {"lw-negative-numa",
     [](const Parts& p) {
       return Snapshots(p, [](v1beta1::ListAndWatchResponse& r) {
         v1beta1::TopologyInfo* t = r.mutable_devices(0)->mutable_topology();
         t->clear_nodes();
         t->add_nodes()->set_id(-1);
       });
     }},
    {"health-not-sent", [](const Parts& p) { return Wrap<FirstSnapshotOnly>(p); }},
    {"lw-delta-updates", [](const Parts& p) { return Wrap<DeltaUpdates>(p); }},
    {"alloc-two-responses",
     [](const Parts& p) {
       return Wrap<RewriteAllocate>(
           p, std::string("alloc-two-responses"),
           [](const v1beta1::AllocateRequest&, v1beta1::AllocateResponse& r) {
             if (r.container_responses().empty()) return;
             v1beta1::ContainerAllocateResponse extra = r.container_responses(0);
             *r.add_container_responses() = std::move(extra);
           });
     }},
    {"alloc-accept-unknown", [](const Parts& p) { return Wrap<AcceptUnknownIds>(p, p.healthy); }},
    {"alloc-relative-path",
     [](const Parts& p) {
       return Containers(
           p, "alloc-relative-path",
           [](const v1beta1::ContainerAllocateRequest&, v1beta1::ContainerAllocateResponse& r) {
             if (r.devices().empty()) return;
             std::string path = r.devices(0).host_path();
             path.erase(0, path.find_first_not_of('/'));
             r.mutable_devices(0)->set_host_path(path.empty() ? "dev/nvidia0" : path);
           });
     }},
    {"alloc-bad-permissions",
     [](const Parts& p) {
       return Containers(
           p, "alloc-bad-permissions",
           [](const v1beta1::ContainerAllocateRequest&, v1beta1::ContainerAllocateResponse& r) {
             if (!r.devices().empty()) r.mutable_devices(0)->set_permissions("rwx");
           });
     }},
    {"alloc-bad-env",
     [](const Parts& p) {
       return Containers(
           p, "alloc-bad-env",
           [](const v1beta1::ContainerAllocateRequest&, v1beta1::ContainerAllocateResponse& r) {
             (*r.mutable_envs())["1 BAD=NAME"] = "1";
           });
     }},
    {"alloc-bad-cdi",
     [](const Parts& p) {
       return Containers(
           p, "alloc-bad-cdi",
           [](const v1beta1::ContainerAllocateRequest& req, v1beta1::ContainerAllocateResponse& r) {
             r.add_cdi_devices()->set_name(req.devices_ids().empty() ? "gpu0" : req.devices_ids(0));
           });
     }},
    {"alloc-not-concurrent", [](const Parts& p) { return Wrap<RefuseConcurrentAllocate>(p); }},
    {"pref-wrong-size",
     [](const Parts& p) {
       return Preferred(p, "pref-wrong-size",
                        [](google::protobuf::RepeatedPtrField<std::string>& ids) {
                          if (!ids.empty()) ids.RemoveLast();
                        });
     }},
    {"pref-not-subset",
     [](const Parts& p) {
       return Preferred(p, "pref-not-subset",
                        [](google::protobuf::RepeatedPtrField<std::string>& ids) {
                          if (!ids.empty()) *ids.Mutable(ids.size() - 1) = "no-such-device";
                        });
     }},
    {"pref-drop-must-include",
     [](const Parts& p) {
       return Wrap<RewritePreferred>(p, std::string("pref-drop-must-include"),
                                     DropMustInclude(*p.inner));
     }},
    {"pref-duplicates",
     [](const Parts& p) {
       return Preferred(p, "pref-duplicates",
                        [](google::protobuf::RepeatedPtrField<std::string>& ids) {
                          if (ids.size() >= 2) {
                            *ids.Mutable(ids.size() - 1) = ids.Get(0);
                          } else if (ids.size() == 1) {
                            *ids.Add() = ids.Get(0);
                          }
                        });
     }},
    {"pref-random",
     [](const Parts& p) {
       auto pick = std::make_shared<RandomPick>();
       return Wrap<RewritePreferred>(
           p, std::string("pref-random"),
           [pick](const v1beta1::ContainerPreferredAllocationRequest& request,
                  v1beta1::ContainerPreferredAllocationResponse,
                  CallContext&) -> StatusOr<v1beta1::ContainerPreferredAllocationResponse> {
             return pick->Answer(request);
           });
     }},
    {"pref-slow",
     [](const Parts& p) {
       return Wrap<SlowPreferred>(p, static_cast<int>(p.healthy.topology().size()), p.held);
     }},
    {"prestart-unimplemented", [](const Parts& p) { return Wrap<PrestartUnimplemented>(p); }},
    {"lw-drop-breaks", [](const Parts& p) { return Wrap<BreakAfterCancelledStream>(p); }},
    {"health-stale-streams", [](const Parts& p) { return Wrap<StaleStreamsTakeChanges>(p); }},
    {"no-reregister",
     [](const Parts& p) {
       return Register(p, "no-reregister", [](v1beta1::RegisterRequest&, int registrations) {
         return registrations == 0;
       });
     }},
};

}  // namespace

const std::vector<std::string>& FaultNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>();
    for (const FaultEntry& e : kFaultTable) v->push_back(e.name);
    return v;
  }();
  return *names;
}

StatusOr<FaultSetup> MakeFaultSetup(const std::string& name, const FakeDevicePlugin& healthy,
                                    HeldCallCounter& held) {
  for (const FaultEntry& e : kFaultTable) {
    if (name == e.name) return e.build(Parts{healthy, held, healthy.handler()});
  }
  return InvalidArgumentError("unknown fault \"" + name + "\"");
}

}  // namespace kdm::fakes
