// The FaultyPlugin's decorators (fakes/fault_handlers.h) called directly:
// for each fault, the healthy FakeDevicePlugin handler's answer next to the
// decorated one shows exactly what the decorator changes. The streams and
// calls here are the test's own (no gRPC): their waits return at once with
// what the test scripts, so nothing depends on time. faulty_plugin_test.cc
// shows the same faults over real sockets.
#include "kdm/fakes/fault_handlers.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kdm/fakes/faulty_plugin.h"

namespace kdm::fakes {
namespace {

using plugin::CallContext;
using plugin::Device;
using plugin::ListAndWatchStream;
using plugin::WaitResult;

// A call whose client may have gone; WaitUntilEnded runs `on_wait`, then
// answers `wait_result` at once.
class ScriptedCall : public ListAndWatchStream {
 public:
  bool ClientGone() const override { return client_gone; }
  bool Ended() const override { return client_gone; }
  WaitResult WaitUntilEnded(TimePoint) override {
    ++waits;
    if (on_wait) on_wait();
    return wait_result;
  }

  // As a stream: the devices at version 1; each wait with a deadline is a
  // deadline while `ticks` last, then the stream ends (`client_gone`).
  std::shared_ptr<const std::vector<Device>> Devices(uint64_t* version) const override {
    *version = 1;
    return devices;
  }
  WaitResult WaitForChange(uint64_t, std::optional<TimePoint> deadline) override {
    ++waits;
    if (on_wait) on_wait();
    if (deadline && ticks > 0) {
      --ticks;
      return WaitResult::kDeadline;
    }
    return WaitResult::kEnded;
  }
  bool Write(const v1beta1::ListAndWatchResponse& message) override {
    written.push_back(message);
    return true;
  }

  bool client_gone = false;
  WaitResult wait_result = WaitResult::kEnded;
  std::function<void()> on_wait;
  int waits = 0;
  int ticks = 0;
  std::shared_ptr<const std::vector<Device>> devices;
  std::vector<v1beta1::ListAndWatchResponse> written;
};

class FaultHandlersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PluginConfig c;
    c.resource_name = "example.com/gpu";
    c.plugin_dir = "/tmp/kdm-fault-handlers-test";  // never served
    c.count = 4;
    c.register_with_kubelet = false;
    auto p = FakeDevicePlugin::Create(std::move(c));
    ASSERT_TRUE(p.ok()) << p.status();
    healthy_ = std::move(*p);
  }

  FaultSetup SetUpFault(const std::string& fault) {
    auto s = MakeFaultSetup(fault, *healthy_, held_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : FaultSetup{};
  }

  ScriptedCall Stream() {
    ScriptedCall s;
    s.devices = std::make_shared<const std::vector<Device>>(healthy_->server().Devices());
    return s;
  }

  static v1beta1::AllocateRequest AllocateRequest(const std::vector<std::string>& ids) {
    v1beta1::AllocateRequest r;
    auto* c = r.add_container_requests();
    for (const auto& id : ids) c->add_devices_ids(id);
    return r;
  }

  static v1beta1::PreferredAllocationRequest PreferredRequest(
      const std::vector<std::string>& available, const std::vector<std::string>& must, int size) {
    v1beta1::PreferredAllocationRequest r;
    auto* c = r.add_container_requests();
    for (const auto& id : available) c->add_available_deviceids(id);
    for (const auto& id : must) c->add_must_include_deviceids(id);
    c->set_allocation_size(size);
    return r;
  }

  // The ids of the one container answer of fault `fault` to `request`.
  std::vector<std::string> PreferredIds(const std::string& fault,
                                        const v1beta1::PreferredAllocationRequest& request) {
    ScriptedCall call;
    auto r = SetUpFault(fault).handler->GetPreferredAllocation(request, call);
    EXPECT_TRUE(r.ok()) << r.status();
    if (!r.ok() || r->container_responses_size() != 1) return {};
    const auto& ids = r->container_responses(0).deviceids();
    return std::vector<std::string>(ids.begin(), ids.end());
  }

  v1beta1::ContainerAllocateResponse HealthyAllocate(const std::vector<std::string>& ids) {
    auto r = healthy_->Allocate(AllocateRequest(ids).container_requests(0));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : v1beta1::ContainerAllocateResponse();
  }

  std::unique_ptr<FakeDevicePlugin> healthy_;
  HeldCallCounter held_;
};

const std::vector<std::string> kAll = {"gpu-0", "gpu-1", "gpu-2", "gpu-3"};

TEST_F(FaultHandlersTest, EveryFaultHasASetupAndUnknownNamesAreRefused) {
  for (const std::string& name : FaultNames()) {
    FaultSetup s = SetUpFault(name);
    EXPECT_NE(s.handler, nullptr) << name;
    EXPECT_EQ(static_cast<bool>(s.rewrite_register_request),
              name.rfind("reg-", 0) == 0 || name == "no-reregister")
        << name << ": only registration faults rewrite the RegisterRequest";
  }
  EXPECT_EQ(MakeFaultSetup("nope", *healthy_, held_).status().code(), StatusCode::kInvalidArgument);
}

// --- registration ------------------------------------------------------------

v1beta1::RegisterRequest HealthyRegisterRequest() {
  v1beta1::RegisterRequest r;
  r.set_version("v1beta1");
  r.set_endpoint("gpu.sock");
  r.set_resource_name("example.com/gpu");
  r.mutable_options()->set_get_preferred_allocation_available(true);
  return r;
}

TEST_F(FaultHandlersTest, RegistrationFaultsRewriteOneFieldEach) {
  struct Case {
    const char* fault;
    std::function<void(v1beta1::RegisterRequest&)> expected_change;
  };
  const Case cases[] = {
      {"reg-bad-version", [](auto& r) { r.set_version("v1beta2"); }},
      {"reg-bad-resource-name", [](auto& r) { r.set_resource_name("example.com/Bad Name!"); }},
      {"reg-endpoint-path", [](auto& r) { r.set_endpoint("../gpu.sock"); }},
      {"reg-options-mismatch", [](auto& r) { r.mutable_options()->set_pre_start_required(true); }},
  };
  for (const Case& c : cases) {
    v1beta1::RegisterRequest request = HealthyRegisterRequest();
    EXPECT_TRUE(SetUpFault(c.fault).rewrite_register_request(request, 0)) << c.fault;
    v1beta1::RegisterRequest expected = HealthyRegisterRequest();
    c.expected_change(expected);
    EXPECT_EQ(request.SerializeAsString(), expected.SerializeAsString()) << c.fault;
  }
}

TEST_F(FaultHandlersTest, NoReregisterSendsTheFirstRegistrationOnly) {
  auto hook = SetUpFault("no-reregister").rewrite_register_request;
  v1beta1::RegisterRequest request = HealthyRegisterRequest();
  EXPECT_TRUE(hook(request, 0));
  EXPECT_EQ(request.SerializeAsString(), HealthyRegisterRequest().SerializeAsString());
  EXPECT_FALSE(hook(request, 1));
  EXPECT_FALSE(hook(request, 5));
}

// --- ListAndWatch ------------------------------------------------------------

TEST_F(FaultHandlersTest, SnapshotFaultsRewriteTheFirstDeviceOfEachMessage) {
  ScriptedCall healthy_stream = Stream();
  ASSERT_TRUE(healthy_->handler()->ListAndWatch(healthy_stream).ok());
  ASSERT_EQ(healthy_stream.written.size(), 1u);
  const v1beta1::ListAndWatchResponse& healthy = healthy_stream.written[0];
  ASSERT_EQ(healthy.devices_size(), 4);

  ScriptedCall dup = Stream();
  ASSERT_TRUE(SetUpFault("lw-duplicate-ids").handler->ListAndWatch(dup).ok());
  ASSERT_EQ(dup.written.size(), 1u);
  ASSERT_EQ(dup.written[0].devices_size(), 5);
  EXPECT_EQ(dup.written[0].devices(4).SerializeAsString(), healthy.devices(0).SerializeAsString());

  ScriptedCall health = Stream();
  ASSERT_TRUE(SetUpFault("lw-bad-health").handler->ListAndWatch(health).ok());
  ASSERT_EQ(health.written.size(), 1u);
  EXPECT_EQ(health.written[0].devices(0).health(), "healthy");
  EXPECT_EQ(health.written[0].devices(1).health(), "Healthy");

  ScriptedCall numa = Stream();
  ASSERT_TRUE(SetUpFault("lw-negative-numa").handler->ListAndWatch(numa).ok());
  ASSERT_EQ(numa.written.size(), 1u);
  ASSERT_EQ(numa.written[0].devices(0).topology().nodes_size(), 1);
  EXPECT_EQ(numa.written[0].devices(0).topology().nodes(0).id(), -1);
  EXPECT_FALSE(numa.written[0].devices(1).has_topology());
}

TEST_F(FaultHandlersTest, LwNoSnapshotWritesNothingAndCountsTheHeldStream) {
  ScriptedCall s = Stream();
  int held_while_waiting = -1;
  s.on_wait = [&] { held_while_waiting = held_.count(); };
  ASSERT_TRUE(SetUpFault("lw-no-snapshot").handler->ListAndWatch(s).ok());
  EXPECT_TRUE(s.written.empty());
  EXPECT_EQ(held_while_waiting, 1);
  EXPECT_EQ(held_.count(), 0);
}

TEST_F(FaultHandlersTest, LwDeltaUpdatesSendsOneToggledDevicePerTick) {
  ScriptedCall s = Stream();
  s.ticks = 5;
  ASSERT_TRUE(SetUpFault("lw-delta-updates").handler->ListAndWatch(s).ok());
  ASSERT_EQ(s.written.size(), 6u);
  EXPECT_EQ(s.written[0].devices_size(), 4) << "the full list first";
  const std::vector<std::pair<std::string, std::string>> deltas = {{"gpu-0", "Unhealthy"},
                                                                   {"gpu-1", "Unhealthy"},
                                                                   {"gpu-2", "Unhealthy"},
                                                                   {"gpu-3", "Unhealthy"},
                                                                   {"gpu-0", "Healthy"}};
  for (size_t i = 0; i < deltas.size(); ++i) {
    ASSERT_EQ(s.written[i + 1].devices_size(), 1) << i;
    EXPECT_EQ(s.written[i + 1].devices(0).id(), deltas[i].first) << i;
    EXPECT_EQ(s.written[i + 1].devices(0).health(), deltas[i].second) << i;
  }
}

TEST_F(FaultHandlersTest, LwDropBreaksOnlyAfterAClientCancelled) {
  auto handler = SetUpFault("lw-drop-breaks").handler;
  ScriptedCall stopped = Stream();  // ended by the server, not the client
  ASSERT_TRUE(handler->ListAndWatch(stopped).ok());
  ScriptedCall cancelled = Stream();
  cancelled.client_gone = true;
  ASSERT_TRUE(handler->ListAndWatch(cancelled).ok());
  EXPECT_EQ(cancelled.written.size(), 1u) << "the stream itself is healthy";
  ScriptedCall later = Stream();
  Status s = handler->ListAndWatch(later);
  EXPECT_EQ(s.code(), StatusCode::kUnavailable) << s;
  EXPECT_TRUE(later.written.empty());
}

// --- Allocate ----------------------------------------------------------------

TEST_F(FaultHandlersTest, AllocateFaultsChangeTheHealthyAnswer) {
  const v1beta1::ContainerAllocateResponse healthy = HealthyAllocate({"gpu-1"});
  ASSERT_GE(healthy.devices_size(), 1);
  auto allocate = [&](const std::string& fault) {
    ScriptedCall call;
    auto r = SetUpFault(fault).handler->Allocate(AllocateRequest({"gpu-1"}), call);
    EXPECT_TRUE(r.ok()) << fault << ": " << r.status();
    return r.ok() ? *r : v1beta1::AllocateResponse();
  };

  v1beta1::AllocateResponse two = allocate("alloc-two-responses");
  ASSERT_EQ(two.container_responses_size(), 2);
  EXPECT_EQ(two.container_responses(1).SerializeAsString(), healthy.SerializeAsString());

  v1beta1::AllocateResponse relative = allocate("alloc-relative-path");
  ASSERT_EQ(relative.container_responses_size(), 1);
  EXPECT_EQ(relative.container_responses(0).devices(0).host_path(),
            healthy.devices(0).host_path().substr(1));

  v1beta1::AllocateResponse rwx = allocate("alloc-bad-permissions");
  EXPECT_EQ(rwx.container_responses(0).devices(0).permissions(), "rwx");

  v1beta1::AllocateResponse env = allocate("alloc-bad-env");
  EXPECT_EQ(env.container_responses(0).envs().at("1 BAD=NAME"), "1");
  EXPECT_EQ(env.container_responses(0).envs().size(), healthy.envs().size() + 1);

  v1beta1::AllocateResponse cdi = allocate("alloc-bad-cdi");
  ASSERT_EQ(cdi.container_responses(0).cdi_devices_size(), 1);
  EXPECT_EQ(cdi.container_responses(0).cdi_devices(0).name(), "gpu-1");
}

TEST_F(FaultHandlersTest, AllocAcceptUnknownAnswersForIdsNeverListed) {
  ScriptedCall call;
  auto handler = SetUpFault("alloc-accept-unknown").handler;
  auto r = handler->Allocate(AllocateRequest({"gpu-1", "nope"}), call);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->container_responses_size(), 1);
  EXPECT_EQ(r->container_responses(0).envs().at(healthy_->visible_devices_env()), "gpu-1,nope");
  EXPECT_EQ(r->container_responses(0).devices_size(), HealthyAllocate({"gpu-1"}).devices_size());
  auto only_unknown = handler->Allocate(AllocateRequest({"nope"}), call);
  ASSERT_TRUE(only_unknown.ok()) << only_unknown.status();
  EXPECT_EQ(only_unknown->container_responses(0).devices_size(), 0);
  // The healthy handler refuses it.
  EXPECT_EQ(healthy_->handler()->Allocate(AllocateRequest({"nope"}), call).status().code(),
            StatusCode::kNotFound);
}

TEST_F(FaultHandlersTest, AllocNotConcurrentRefusesACallWhileOneIsHeld) {
  auto handler = SetUpFault("alloc-not-concurrent").handler;
  ScriptedCall inner_call;
  StatusOr<v1beta1::AllocateResponse> overlapping = InternalError("not called");
  ScriptedCall outer_call;
  outer_call.wait_result = WaitResult::kDeadline;
  // While the first call is held, a second one arrives.
  outer_call.on_wait = [&] {
    overlapping = handler->Allocate(AllocateRequest({"gpu-2"}), inner_call);
  };
  auto first = handler->Allocate(AllocateRequest({"gpu-1"}), outer_call);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(overlapping.status().code(), StatusCode::kUnavailable) << overlapping.status();
  EXPECT_NE(overlapping.status().message().find("busy"), std::string::npos);
  ScriptedCall after;
  after.wait_result = WaitResult::kDeadline;
  EXPECT_TRUE(handler->Allocate(AllocateRequest({"gpu-2"}), after).ok()) << "free again";
}

// --- GetPreferredAllocation --------------------------------------------------

TEST_F(FaultHandlersTest, PreferredFaultsChangeTheHealthyAnswer) {
  const auto request = PreferredRequest(kAll, {}, 2);
  const std::vector<std::string> healthy = PreferredIds("alloc-bad-env", request);
  ASSERT_EQ(healthy.size(), 2u) << "a fault elsewhere answers like the healthy plugin";

  EXPECT_EQ(PreferredIds("pref-wrong-size", request),
            std::vector<std::string>(healthy.begin(), healthy.end() - 1));
  EXPECT_EQ(PreferredIds("pref-not-subset", request),
            (std::vector<std::string>{healthy[0], "no-such-device"}));
  EXPECT_EQ(PreferredIds("pref-duplicates", request),
            (std::vector<std::string>{healthy[0], healthy[0]}));

  std::vector<std::string> dropped =
      PreferredIds("pref-drop-must-include", PreferredRequest(kAll, {"gpu-3"}, 2));
  EXPECT_EQ(dropped.size(), 2u);
  EXPECT_EQ(std::count(dropped.begin(), dropped.end(), "gpu-3"), 0);

  // pref-random keeps must-include and never repeats the set it just gave.
  auto handler = SetUpFault("pref-random").handler;
  std::vector<std::string> last;
  for (int i = 0; i < 5; ++i) {
    ScriptedCall call;
    auto r = handler->GetPreferredAllocation(PreferredRequest(kAll, {"gpu-0"}, 2), call);
    ASSERT_TRUE(r.ok()) << r.status();
    std::vector<std::string> ids(r->container_responses(0).deviceids().begin(),
                                 r->container_responses(0).deviceids().end());
    ASSERT_EQ(ids.size(), 2u);
    EXPECT_EQ(ids[0], "gpu-0");
    EXPECT_NE(ids, last);
    last = ids;
  }

  // An impossible request fails as the healthy plugin's does.
  ScriptedCall call;
  EXPECT_FALSE(SetUpFault("pref-wrong-size")
                   .handler->GetPreferredAllocation(PreferredRequest(kAll, {}, 9), call)
                   .ok());
}

TEST_F(FaultHandlersTest, PrefSlowHoldsLargeRequestsUntilTheClientGoes) {
  auto handler = SetUpFault("pref-slow").handler;
  ScriptedCall call;
  call.client_gone = true;
  int held_while_waiting = -1;
  call.on_wait = [&] { held_while_waiting = held_.count(); };
  auto held = handler->GetPreferredAllocation(PreferredRequest(kAll, {}, 3), call);
  EXPECT_EQ(held.status().code(), StatusCode::kCancelled) << held.status();
  EXPECT_EQ(held_while_waiting, 1);
  EXPECT_EQ(held_.count(), 0);

  ScriptedCall small;
  auto answered = handler->GetPreferredAllocation(PreferredRequest(kAll, {}, 2), small);
  ASSERT_TRUE(answered.ok()) << answered.status();
  EXPECT_EQ(small.waits, 0) << "a small request is not held";
}

// --- options and PreStartContainer --------------------------------------------

TEST_F(FaultHandlersTest, PrestartUnimplementedSaysRequiredAndAnswersUnimplemented) {
  auto healthy_options = healthy_->handler()->GetDevicePluginOptions();
  ASSERT_TRUE(healthy_options.ok());
  EXPECT_FALSE(healthy_options->pre_start_required());
  auto handler = SetUpFault("prestart-unimplemented").handler;
  auto options = handler->GetDevicePluginOptions();
  ASSERT_TRUE(options.ok());
  EXPECT_TRUE(options->pre_start_required());
  EXPECT_EQ(options->get_preferred_allocation_available(),
            healthy_options->get_preferred_allocation_available());
  ScriptedCall call;
  EXPECT_EQ(handler->PreStartContainer({"gpu-0"}, call).code(), StatusCode::kUnimplemented);
  EXPECT_TRUE(healthy_->handler()->PreStartContainer({"gpu-0"}, call).ok());
}

}  // namespace
}  // namespace kdm::fakes
