// ManagerImpl against gMock plugin stubs: RPC failures, deadlines, invalid
// preferred answers, endpoint life cycle on a fake clock, checkpoint
// failures and restart. No sockets (except Start()'s registration socket in
// the restart tests).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "kdm/base/sync.h"
#include "kdm/checkpoint/store.h"
#include "kdm/devicemanager/manager_impl.h"
#include "kdm/test/devicemanager/test_pods.h"
#include "kdm/test/mocks/mock_device_plugin.h"
#include "kdm/test/wait_until.h"

namespace kdm::devicemanager {
namespace {

using ::kdm::testing::FakeListAndWatch;
using ::kdm::testing::MockDevicePluginStub;
using ::kdm::testing::Snapshot;
using ::testing::_;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Invoke;
using ::testing::Return;
using ::testing::StrictMock;
using ::testing::UnorderedElementsAre;

constexpr char kMockGpu[] = "vendor.com/gpu";
constexpr char kMockNic[] = "vendor.com/nic";

// A store that fails every Apply while `fail` is set.
class FlakyStore : public checkpoint::Store {
 public:
  StatusOr<checkpoint::CheckpointData> Load() override { return inner_->Load(); }
  Status Apply(const checkpoint::Change& c) override {
    if (fail) return InternalError("disk full");
    applies++;
    return inner_->Apply(c);
  }
  Status Replace(const checkpoint::CheckpointData& d) override { return inner_->Replace(d); }
  Status SetBootId(const std::string& b) override { return inner_->SetBootId(b); }
  std::string Describe() const override { return "flaky"; }

  bool fail = false;
  int applies = 0;

 private:
  std::unique_ptr<checkpoint::Store> inner_ = checkpoint::NewMemoryStore();
};

struct FakePlugin {
  std::shared_ptr<StrictMock<MockDevicePluginStub>> stub =
      std::make_shared<StrictMock<MockDevicePluginStub>>();
  std::shared_ptr<FakeListAndWatch> stream = std::make_shared<FakeListAndWatch>();
};

using kdm::devicemanager::testing::MakePod;

// Effects of other threads (an endpoint's reader) are waited for with the
// default bound (10 s).
using kdm::test::WaitUntil;

v1beta1::ContainerAllocateResponse EnvResponse(const std::string& key, const std::string& value) {
  v1beta1::ContainerAllocateResponse r;
  (*r.mutable_envs())[key] = value;
  return r;
}

class ManagerMockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kdm-mm-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    clock_ = std::make_shared<FakeClock>();
    store_ = std::make_shared<FlakyStore>();
  }
  void TearDown() override {
    for (auto& [path, p] : plugins_) p.stream->Close();
    if (manager_) manager_->Stop();
    manager_.reset();
    std::filesystem::remove_all(dir_);
  }

  Manager::Options BaseOptions() {
    Manager::Options o;
    o.plugin_dir = dir_;
    o.store = store_;
    o.clock = clock_;
    o.rpc_timeout = std::chrono::milliseconds(250);
    o.registration_timeout = std::chrono::milliseconds(2000);
    o.grace_period = std::chrono::minutes(5);
    o.boot_id_provider = [this]() -> StatusOr<std::string> { return boot_id_; };
    o.active_pods = [this] { return active_; };
    return o;
  }

  void MakeManager(Manager::Options o) {
    manager_ = std::make_unique<ManagerImpl>(
        std::move(o),
        [this](const std::string& path, std::chrono::milliseconds)
            -> StatusOr<std::shared_ptr<v1beta1::DevicePlugin::StubInterface>> {
          auto it = plugins_.find(path);
          if (it == plugins_.end()) return UnavailableError("no plugin at " + path);
          return std::shared_ptr<v1beta1::DevicePlugin::StubInterface>(it->second.stub);
        });
  }
  void MakeManager() { MakeManager(BaseOptions()); }

  // Plugin at `socket` that answers options and streams `first`.
  FakePlugin& AddPlugin(const std::string& socket, v1beta1::ListAndWatchResponse first,
                        bool preferred = false, bool pre_start = false) {
    FakePlugin& p = plugins_[socket];
    v1beta1::DevicePluginOptions opts;
    opts.set_get_preferred_allocation_available(preferred);
    opts.set_pre_start_required(pre_start);
    EXPECT_CALL(*p.stub, GetDevicePluginOptions(_, _, _))
        .WillOnce(Invoke(
            [opts](grpc::ClientContext*, const v1beta1::Empty&, v1beta1::DevicePluginOptions* out) {
              *out = opts;
              return grpc::Status::OK;
            }));
    auto stream = p.stream;
    EXPECT_CALL(*p.stub, ListAndWatchRaw(_, _)).WillOnce(Invoke([stream](auto*, const auto&) {
      return stream->NewReader();
    }));
    p.stream->Push(std::move(first));
    return p;
  }

  // Allocate answers that echo the ids as env DEVICES=<ids joined by ','>.
  static void EchoAllocate(FakePlugin& p) {
    EXPECT_CALL(*p.stub, Allocate(_, _, _))
        .WillRepeatedly(Invoke([](grpc::ClientContext*, const v1beta1::AllocateRequest& req,
                                  v1beta1::AllocateResponse* resp) {
          std::string ids;
          for (const auto& id : req.container_requests(0).devices_ids()) {
            ids += (ids.empty() ? "" : ",") + id;
          }
          *resp->add_container_responses() = EnvResponse("DEVICES", ids);
          return grpc::Status::OK;
        }));
  }

  std::vector<std::string> DevicesOf(const std::string& uid, const std::string& c) {
    std::vector<std::string> ids;
    for (const auto& cd : manager_->GetDevices(uid, c)) {
      ids.insert(ids.end(), cd.device_ids.begin(), cd.device_ids.end());
    }
    std::sort(ids.begin(), ids.end());
    return ids;
  }

  std::string dir_;
  std::shared_ptr<FakeClock> clock_;
  std::shared_ptr<FlakyStore> store_;
  std::string boot_id_ = "boot-1";
  std::set<std::string> active_;
  std::map<std::string, FakePlugin> plugins_;
  // Health events seen by Subscribe(); members so that they outlive the
  // Manager (TearDown stops it, which may still notify).
  kdm::Mutex seen_mu_;
  std::vector<DeviceHealthEvent> seen_;
  std::unique_ptr<ManagerImpl> manager_;

  int64_t SubscribeToHealth() {
    return manager_->Subscribe([this](const std::vector<DeviceHealthEvent>& ev) {
      kdm::MutexLock l(&seen_mu_);
      seen_.insert(seen_.end(), ev.begin(), ev.end());
    });
  }
  std::vector<DeviceHealthEvent> Seen() {
    kdm::MutexLock l(&seen_mu_);
    return seen_;
  }
};

v1beta1::ListAndWatchResponse MockGpus(int n, bool healthy = true) {
  std::vector<kdm::testing::TestDevice> d;
  for (int i = 0; i < n; ++i) d.push_back({"gpu" + std::to_string(i), healthy, i % 2});
  return Snapshot(d);
}

TEST_F(ManagerMockTest, CreateRejectsBadOptions) {
  Manager::Options o = BaseOptions();
  o.plugin_dir = "";
  EXPECT_THAT(Manager::Create(o).status().message(), HasSubstr("plugin_dir is empty"));
  o = BaseOptions();
  o.plugin_dir = "/tmp/" + std::string(120, 'x');
  EXPECT_THAT(Manager::Create(o).status().message(),
              HasSubstr("longer than the 107 bytes a unix socket path allows"));
  o = BaseOptions();
  o.rpc_timeout = std::chrono::milliseconds(0);
  EXPECT_THAT(Manager::Create(o).status().message(), HasSubstr("rpc_timeout must be positive"));
  o = BaseOptions();
  o.grace_period = std::chrono::milliseconds(-1);
  EXPECT_EQ(Manager::Create(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Manager::Create(BaseOptions()).ok());
}

TEST_F(ManagerMockTest, OptionsRpcFailureIsTheRegisterError) {
  MakeManager();
  FakePlugin& p = plugins_["/p/gpu.sock"];
  EXPECT_CALL(*p.stub, GetDevicePluginOptions(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded")));
  Status s = manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock");
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(s.message(), HasSubstr("GetDevicePluginOptions of vendor.com/gpu"));
  EXPECT_EQ(manager_->GetStats().registrations_rejected, 1);
  EXPECT_EQ(manager_->GetStats().rpc_errors.at("GetDevicePluginOptions"), 1);
  EXPECT_TRUE(manager_->GetCapacity().resources.empty());
}

TEST_F(ManagerMockTest, DialFailureIsTheRegisterError) {
  MakeManager();
  Status s = manager_->RegisterPlugin(kMockGpu, "/p/missing.sock");
  EXPECT_THAT(s.message(), HasSubstr("no plugin at /p/missing.sock"));
  EXPECT_EQ(manager_->GetStats().registrations_rejected, 1);
}

TEST_F(ManagerMockTest, StreamEndingBeforeFirstListIsTheRegisterError) {
  MakeManager();
  FakePlugin& p = plugins_["/p/gpu.sock"];
  EXPECT_CALL(*p.stub, GetDevicePluginOptions(_, _, _)).WillOnce(Return(grpc::Status::OK));
  auto stream = p.stream;
  EXPECT_CALL(*p.stub, ListAndWatchRaw(_, _)).WillOnce(Invoke([stream](auto*, const auto&) {
    return stream->NewReader();
  }));
  p.stream->Close(grpc::Status(grpc::StatusCode::UNIMPLEMENTED, "no ListAndWatch"));
  Status s = manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_THAT(s.message(), HasSubstr("ended before its first device list"));
  EXPECT_THAT(s.message(), HasSubstr("no ListAndWatch"));
  EXPECT_TRUE(manager_->GetCapacity().resources.empty());
}

TEST_F(ManagerMockTest, RegistrationReportsCapacityAndAllocates) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  auto cap = manager_->GetCapacity();
  EXPECT_EQ(cap.resources.at(kMockGpu), (CapacityReport::Amounts{4, 4}));

  Pod pod = MakePod("p1", {{"main", {{kMockGpu, 2}, {"cpu", 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_THAT(DevicesOf("p1", "main"), ElementsAre("gpu0", "gpu1"));
  auto run = manager_->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->envs.at("DEVICES"), "gpu0,gpu1");
  EXPECT_EQ(store_->applies, 2);  // registered devices, then the allocation
  // A restart of the container reuses: no second Allocate RPC.
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_EQ(manager_->GetStats().allocations, 1);
  EXPECT_EQ(manager_->GetStats().preferred_not_asked, 1);
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, GetContainerAllocationReadsDevicesAndRunOptionsInOneCall) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  Pod pod = MakePod("p1", {{"main", {{kMockGpu, 2}}}, {"log", {{"cpu", 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  ASSERT_TRUE(manager_->Allocate(pod, "log").ok());
  auto allocation = manager_->GetContainerAllocation(pod, "main");
  ASSERT_TRUE(allocation.ok()) << allocation.status();
  EXPECT_EQ(allocation->devices,
            (std::map<std::string, std::vector<std::string>>{{kMockGpu, {"gpu0", "gpu1"}}}));
  EXPECT_EQ(allocation->run.envs.at("DEVICES"), "gpu0,gpu1");
  auto run = manager_->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(allocation->run.envs, run->envs);
  auto none = manager_->GetContainerAllocation(pod, "log");
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_TRUE(none->devices.empty());
  EXPECT_TRUE(none->run.envs.empty());
}

TEST_F(ManagerMockTest, CheckResourcesRegisteredAnswersWithTheLedgersText) {
  checkpoint::CheckpointData data;
  data.registered_devices["vendor.com/restored"] = {"r0"};
  ASSERT_TRUE(store_->Replace(data).ok());
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  AddPlugin("/p/gpu.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  // Registered, restored without devices, not extended (cpu), zero limits:
  // nothing is missing.
  EXPECT_TRUE(manager_
                  ->CheckResourcesRegistered(
                      MakePod("a", {{"main", {{kMockGpu, 1}, {"cpu", 2}, {kMockNic, 0}}},
                                    {"side", {{"vendor.com/restored", 1}}}}))
                  .ok());
  // The first unregistered resource in name order, init containers too.
  Pod pod =
      MakePod("b", {{"main", {{kMockGpu, 1}, {"vendor.com/zz", 1}}}}, {{"init", {{kMockNic, 1}}}});
  EXPECT_EQ(manager_->CheckResourcesRegistered(pod),
            FailedPreconditionError("cannot allocate unregistered device vendor.com/nic"));
  // Allocate itself skips what no plugin registered, as the kubelet's device
  // manager does.
  EXPECT_TRUE(manager_->Allocate(pod, "init").ok());
  // A resource whose grace period expired is unregistered again.
  clock_->Advance(std::chrono::minutes(5));
  EXPECT_EQ(
      manager_->CheckResourcesRegistered(MakePod("c", {{"main", {{"vendor.com/restored", 1}}}})),
      FailedPreconditionError("cannot allocate unregistered device vendor.com/restored"));
}

TEST_F(ManagerMockTest, AlignNumaTakesDevicesOfThePreferredNumaNodeFirst) {
  Manager::Options o = BaseOptions();
  o.align_numa = true;
  MakeManager(std::move(o));
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4));  // gpu0, gpu2 on NUMA 0; gpu1, gpu3 on 1
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(manager_->Allocate(MakePod("p1", {{"main", {{kMockGpu, 2}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("p1", "main"), ElementsAre("gpu0", "gpu2"));  // first-fit: gpu0, gpu1
  ASSERT_TRUE(manager_->Allocate(MakePod("p2", {{"main", {{kMockGpu, 1}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("p2", "main"), ElementsAre("gpu1"));
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, WithoutAlignNumaCandidatesAreInDeviceOrder) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(manager_->Allocate(MakePod("p1", {{"main", {{kMockGpu, 2}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("p1", "main"), ElementsAre("gpu0", "gpu1"));
}

TEST_F(ManagerMockTest, AllocateRpcErrorReleasesTheReservation) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_CALL(*p.stub, Allocate(_, _, _))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::INTERNAL, "driver exploded")));
  Pod a = MakePod("a", {{"main", {{kMockGpu, 2}}}});
  Status s = manager_->Allocate(a, "main");
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "Allocate of vendor.com/gpu: driver exploded");
  EXPECT_TRUE(DevicesOf("a", "main").empty());
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
  EXPECT_EQ(manager_->GetStats().rpc_errors.at("Allocate"), 1);
  EXPECT_EQ(manager_->GetStats().allocation_failures, 1);
  // Both devices are free again.
  EchoAllocate(p);
  Pod b = MakePod("b", {{"main", {{kMockGpu, 2}}}});
  EXPECT_TRUE(manager_->Allocate(b, "main").ok());
  EXPECT_THAT(DevicesOf("b", "main"), ElementsAre("gpu0", "gpu1"));
}

TEST_F(ManagerMockTest, AllocateCarriesTheDeadlineAndATimeoutFreesTheDevices) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(1));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_CALL(*p.stub, Allocate(_, _, _))
      .WillOnce(Invoke([](grpc::ClientContext* ctx, const v1beta1::AllocateRequest& req,
                          v1beta1::AllocateResponse*) {
        EXPECT_EQ(req.container_requests_size(), 1);
        auto left = ctx->deadline() - std::chrono::system_clock::now();
        EXPECT_GT(left, std::chrono::milliseconds(0));
        EXPECT_LE(left, std::chrono::milliseconds(250));
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "Deadline Exceeded");
      }));
  Status s = manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 1}}}}), "main");
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu).allocatable, 1);
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, AllocateWithoutContainerResponseFails) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(1));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_CALL(*p.stub, Allocate(_, _, _)).WillOnce(Return(grpc::Status::OK));
  Status s = manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 1}}}}), "main");
  EXPECT_THAT(s.message(), HasSubstr("returned no container response"));
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, KubeletErrorTextsReachTheCaller) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_EQ(manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 3}}}}), "main").message(),
            "requested number of devices unavailable for vendor.com/gpu. Requested: 3, "
            "Available: 2");
  EXPECT_EQ(manager_->Allocate(MakePod("a", {{"x", {{kMockGpu, 1}}}}), "main").code(),
            StatusCode::kNotFound);
}

struct PreferredCase {
  const char* name;
  std::vector<std::string> answer;  // empty + rpc_error: the RPC fails
  bool rpc_error = false;
};

TEST_F(ManagerMockTest, InvalidPreferredAnswersFallBackAndThePodIsAdmitted) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(10), /*preferred=*/true);
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  const std::vector<PreferredCase> cases = {
      {"wrong size", {"gpu3"}},
      {"duplicates", {"gpu3", "gpu3"}},
      {"unknown id", {"gpu3", "gpu99"}},
      {"rpc error", {}, true},
  };
  int n = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_CALL(*p.stub, GetPreferredAllocation(_, _, _))
        .WillOnce(Invoke([&](grpc::ClientContext*, const v1beta1::PreferredAllocationRequest& req,
                             v1beta1::PreferredAllocationResponse* resp) {
          EXPECT_EQ(req.container_requests(0).allocation_size(), 2);
          if (c.rpc_error) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "plugin busy");
          auto* r = resp->add_container_responses();
          for (const auto& id : c.answer) r->add_deviceids(id);
          return grpc::Status::OK;
        }));
    std::string uid = "pod" + std::to_string(n++);
    ASSERT_TRUE(manager_->Allocate(MakePod(uid, {{"main", {{kMockGpu, 2}}}}), "main").ok());
    EXPECT_EQ(DevicesOf(uid, "main").size(), 2u);
    EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
  }
  ManagerStats st = manager_->GetStats();
  EXPECT_EQ(st.preferred_invalid, 3);
  EXPECT_EQ(st.preferred_rpc_error, 1);
  EXPECT_EQ(st.rpc_errors.at("GetPreferredAllocation"), 1);
  EXPECT_EQ(st.allocations, 4);
}

TEST_F(ManagerMockTest, PreferredAnswerMissingAMustIncludeIdFallsBack) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4), /*preferred=*/true);
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  Pod pod = MakePod("p", {{"main", {{kMockGpu, 2}}}}, {{"init", {{kMockGpu, 1}}}});
  // init: a real choice (1 of 4): the plugin picks gpu2.
  EXPECT_CALL(*p.stub, GetPreferredAllocation(_, _, _))
      .WillOnce(Invoke([](auto*, const v1beta1::PreferredAllocationRequest&,
                          v1beta1::PreferredAllocationResponse* resp) {
        resp->add_container_responses()->add_deviceids("gpu2");
        return grpc::Status::OK;
      }))
      // main: gpu2 is handed over (must include); the answer leaves it out.
      .WillOnce(Invoke([](auto*, const v1beta1::PreferredAllocationRequest& req,
                          v1beta1::PreferredAllocationResponse* resp) {
        EXPECT_THAT(req.container_requests(0).must_include_deviceids(), ElementsAre("gpu2"));
        auto* r = resp->add_container_responses();
        r->add_deviceids("gpu0");
        r->add_deviceids("gpu1");
        return grpc::Status::OK;
      }));
  ASSERT_TRUE(manager_->Allocate(pod, "init").ok());
  EXPECT_THAT(DevicesOf("p", "init"), ElementsAre("gpu2"));
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  auto main = DevicesOf("p", "main");
  EXPECT_THAT(main, ::testing::Contains("gpu2"));
  EXPECT_EQ(main.size(), 2u);
  EXPECT_EQ(manager_->GetStats().preferred_ok, 1);
  EXPECT_EQ(manager_->GetStats().preferred_invalid, 1);
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, ValidPreferredAnswerIsUsed) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4), /*preferred=*/true);
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_CALL(*p.stub, GetPreferredAllocation(_, _, _))
      .WillOnce(Invoke([](auto*, const v1beta1::PreferredAllocationRequest& req,
                          v1beta1::PreferredAllocationResponse* resp) {
        EXPECT_EQ(req.container_requests(0).available_deviceids_size(), 4);
        auto* r = resp->add_container_responses();
        r->add_deviceids("gpu3");
        r->add_deviceids("gpu1");
        return grpc::Status::OK;
      }));
  ASSERT_TRUE(manager_->Allocate(MakePod("p", {{"main", {{kMockGpu, 2}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu1", "gpu3"));
  // No real choice left for 2 of the 2 free devices: not asked.
  ASSERT_TRUE(manager_->Allocate(MakePod("q", {{"main", {{kMockGpu, 2}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("q", "main"), ElementsAre("gpu0", "gpu2"));
  EXPECT_EQ(manager_->GetStats().preferred_ok, 1);
  EXPECT_EQ(manager_->GetStats().preferred_not_asked, 1);
}

TEST_F(ManagerMockTest, PreStartContainerGetsTheDeviceIdsAndItsErrorFailsTheStart) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2), false, /*pre_start=*/true);
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  Pod pod = MakePod("p", {{"main", {{kMockGpu, 2}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  EXPECT_CALL(*p.stub, PreStartContainer(_, _, _))
      .WillOnce(Invoke([](grpc::ClientContext* ctx, const v1beta1::PreStartContainerRequest& req,
                          v1beta1::PreStartContainerResponse*) {
        EXPECT_THAT(req.devices_ids(), UnorderedElementsAre("gpu0", "gpu1"));
        EXPECT_GT(ctx->deadline() - std::chrono::system_clock::now(), std::chrono::seconds(20));
        return grpc::Status::OK;
      }))
      .WillOnce(Return(grpc::Status(grpc::StatusCode::UNKNOWN, "firmware not loaded")));
  EXPECT_TRUE(manager_->GetDeviceRunContainerOptions(pod, "main").ok());
  auto second = manager_->GetDeviceRunContainerOptions(pod, "main");
  EXPECT_EQ(second.status().message(), "PreStartContainer of vendor.com/gpu: firmware not loaded");
  EXPECT_EQ(manager_->GetStats().rpc_errors.at("PreStartContainer"), 1);
}

TEST_F(ManagerMockTest, RunOptionsMergeInResourceNameOrderAndReportConflicts) {
  MakeManager();
  FakePlugin& gpu = AddPlugin("/p/gpu.sock", MockGpus(1));
  FakePlugin& nic = AddPlugin("/p/nic.sock", Snapshot({{"nic0", true, -1}}));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(manager_->RegisterPlugin(kMockNic, "/p/nic.sock").ok());
  auto response = [](const std::string& who) {
    v1beta1::ContainerAllocateResponse r;
    (*r.mutable_envs())["SHARED"] = who;
    (*r.mutable_envs())["ONLY_" + who] = "1";
    auto* m = r.add_mounts();
    m->set_container_path("/dev/shm");
    m->set_host_path("/host/" + who);
    auto* d = r.add_devices();
    d->set_container_path("/dev/" + who);
    d->set_host_path("/dev/" + who);
    d->set_permissions("rw");
    (*r.mutable_annotations())["a"] = who;
    r.add_cdi_devices()->set_name("vendor.com/all=all");
    r.add_cdi_devices()->set_name("vendor.com/" + who + "=0");
    return r;
  };
  for (auto* p : {&gpu, &nic}) {
    std::string who = p == &gpu ? "gpu" : "nic";
    EXPECT_CALL(*p->stub, Allocate(_, _, _))
        .WillOnce(Invoke([=](auto*, const auto&, v1beta1::AllocateResponse* resp) {
          *resp->add_container_responses() = response(who);
          return grpc::Status::OK;
        }));
  }
  Pod pod = MakePod("p", {{"main", {{kMockNic, 1}, {kMockGpu, 1}}}});
  ASSERT_TRUE(manager_->Allocate(pod, "main").ok());
  auto run = manager_->GetDeviceRunContainerOptions(pod, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  // vendor.com/gpu sorts first: its values win.
  EXPECT_EQ(run->envs.at("SHARED"), "gpu");
  EXPECT_EQ(run->envs.size(), 3u);
  EXPECT_EQ(run->annotations.at("a"), "gpu");
  ASSERT_EQ(run->mounts.size(), 1u);
  EXPECT_EQ(run->mounts[0].host_path, "/host/gpu");
  EXPECT_EQ(run->devices.size(), 2u);
  EXPECT_THAT(run->cdi_devices,
              ElementsAre("vendor.com/all=all", "vendor.com/gpu=0", "vendor.com/nic=0"));
  EXPECT_THAT(run->conflicts,
              UnorderedElementsAre(
                  "env \"SHARED\": vendor.com/nic's value ignored, vendor.com/gpu's kept",
                  "mount \"/dev/shm\": vendor.com/nic's value ignored, vendor.com/gpu's kept",
                  "annotation \"a\": vendor.com/nic's value ignored, vendor.com/gpu's kept"));
}

TEST_F(ManagerMockTest, StreamEndMarksUnhealthyAndGraceExpiryDeletes) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_EQ(manager_->GetStats().endpoints_by_state,
            (std::map<std::string, int64_t>{{"connected", 1}, {"stopped", 0}}));
  SubscribeToHealth();
  p.stream->Close(grpc::Status(grpc::StatusCode::UNAVAILABLE, "plugin died"));
  ASSERT_TRUE(WaitUntil([&] { return clock_->PendingTimers() == 1; }));
  EXPECT_EQ(manager_->GetStats().endpoints_by_state,
            (std::map<std::string, int64_t>{{"connected", 0}, {"stopped", 1}}));
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{2, 0}));
  EXPECT_TRUE(WaitUntil([&] { return Seen().size() >= 2; }));
  EXPECT_THAT(Seen(), UnorderedElementsAre(DeviceHealthEvent{kMockGpu, "gpu0", false},
                                           DeviceHealthEvent{kMockGpu, "gpu1", false}));
  EXPECT_EQ(manager_->GetStats().rpc_errors.at("ListAndWatch"), 1);
  // RPCs to a stopped endpoint fail with the kubelet's text.
  Status s = manager_->Allocate(MakePod("x", {{"main", {{kMockGpu, 1}}}}), "main");
  EXPECT_EQ(s.message(), "no healthy devices present; cannot allocate unhealthy devices " +
                             std::string(kMockGpu));
  clock_->Advance(std::chrono::minutes(5) - std::chrono::milliseconds(1));
  EXPECT_EQ(manager_->GetCapacity().resources.count(kMockGpu), 1u);
  clock_->Advance(std::chrono::milliseconds(1));
  CapacityReport cap = manager_->GetCapacity();
  EXPECT_EQ(cap.resources.count(kMockGpu), 0u);
  EXPECT_THAT(cap.deleted, ElementsAre(kMockGpu));
  EXPECT_EQ(manager_->GetStats().endpoints_by_state.at("stopped"), 0);
  // No longer a device resource: nothing to allocate.
  EXPECT_TRUE(manager_->Allocate(MakePod("y", {{"main", {{kMockGpu, 1}}}}), "main").ok());
}

TEST_F(ManagerMockTest, ReRegistrationWithinGraceRestores) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  p.stream->Close();
  ASSERT_TRUE(WaitUntil([&] { return clock_->PendingTimers() == 1; }));
  ASSERT_EQ(manager_->GetCapacity().resources.at(kMockGpu).allocatable, 0);
  clock_->Advance(std::chrono::minutes(4));
  // The plugin comes back on a new socket.
  AddPlugin("/p/gpu2.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu2.sock").ok());
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{2, 2}));
  clock_->Advance(std::chrono::minutes(10));
  CapacityReport cap = manager_->GetCapacity();
  EXPECT_EQ(cap.resources.at(kMockGpu), (CapacityReport::Amounts{2, 2}));
  EXPECT_TRUE(cap.deleted.empty());
}

TEST_F(ManagerMockTest, RollingUpdateNeverDropsAllocatable) {
  MakeManager();
  FakePlugin& old_plugin = AddPlugin("/p/gpu-v1.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu-v1.sock").ok());
  FakePlugin& new_plugin = AddPlugin("/p/gpu-v2.sock", MockGpus(3));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu-v2.sock").ok());
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{3, 3}));
  // The old plugin's late snapshots and its exit change nothing.
  old_plugin.stream->Push(MockGpus(1));
  old_plugin.stream->Close();
  ASSERT_TRUE(WaitUntil([&] { return manager_->LiveEndpointsForTest(kMockGpu) == 1; }));
  EXPECT_EQ(manager_->LiveEndpointsForTest(kMockGpu), 1);
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{3, 3}));
  EXPECT_EQ(clock_->PendingTimers(), 0u);
  EchoAllocate(new_plugin);
  EXPECT_TRUE(manager_->Allocate(MakePod("p", {{"main", {{kMockGpu, 3}}}}), "main").ok());
}

TEST_F(ManagerMockTest, HealthFlipsAreVisibleInCapacityAndSubscriptions) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  int64_t id = SubscribeToHealth();
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  p.stream->Push(Snapshot({{"gpu0", true, 0}, {"gpu1", false, 1}}));
  auto allocatable = [&] { return manager_->GetCapacity().resources.at(kMockGpu).allocatable; };
  ASSERT_TRUE(WaitUntil([&] { return allocatable() == 1; }));
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{2, 1}));
  EXPECT_EQ(manager_->GetAllocatableDevices(),
            (std::vector<ContainerDevices>{{kMockGpu, {"gpu0"}, 0}}));
  // Callbacks run after the capacity changes: wait for the last batch.
  EXPECT_TRUE(WaitUntil([&] { return Seen().size() >= 3; }));
  manager_->Unsubscribe(id);
  EXPECT_THAT(Seen(), ElementsAre(DeviceHealthEvent{kMockGpu, "gpu0", true},
                                  DeviceHealthEvent{kMockGpu, "gpu1", true},
                                  DeviceHealthEvent{kMockGpu, "gpu1", false}));
}

TEST_F(ManagerMockTest, CheckpointWriteFailureRollsTheAllocationBack) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(1));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  store_->fail = true;
  Status s = manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 1}}}}), "main");
  EXPECT_EQ(s.message(), "cannot write checkpoint (allocation): disk full");
  EXPECT_TRUE(DevicesOf("a", "main").empty());
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu).allocatable, 1);
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
  EXPECT_EQ(manager_->GetStats().checkpoint_errors, 1);
  store_->fail = false;
  EXPECT_TRUE(manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 1}}}}), "main").ok());
  // GC that cannot be written leaves the state as it was.
  store_->fail = true;
  EXPECT_FALSE(manager_->UpdateAllocatedDevices().ok());
  EXPECT_FALSE(manager_->RemovePod("a").ok());
  EXPECT_THAT(DevicesOf("a", "main"), ElementsAre("gpu0"));
}

TEST_F(ManagerMockTest, GarbageCollectionFreesDevicesOfInactivePods) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(2));
  EchoAllocate(p);
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  ASSERT_TRUE(manager_->Allocate(MakePod("a", {{"main", {{kMockGpu, 1}}}}), "main").ok());
  ASSERT_TRUE(manager_->Allocate(MakePod("b", {{"main", {{kMockGpu, 1}}}}), "main").ok());
  active_ = {"b"};
  ASSERT_TRUE(manager_->UpdateAllocatedDevices().ok());
  EXPECT_THAT(manager_->GetPodsWithDevices(), ElementsAre("b"));
  ASSERT_TRUE(manager_->RemovePod("b").ok());
  EXPECT_TRUE(manager_->GetPodsWithDevices().empty());
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, GarbageCollectionWithoutActivePodsCallbackIsRefused) {
  Manager::Options o = BaseOptions();
  o.active_pods = nullptr;
  MakeManager(std::move(o));
  EXPECT_EQ(manager_->UpdateAllocatedDevices().code(), StatusCode::kFailedPrecondition);
}

checkpoint::PodDevicesEntry Entry(const std::string& pod, const std::string& container,
                                  std::vector<std::string> ids) {
  checkpoint::PodDevicesEntry e;
  e.pod_uid = pod;
  e.container_name = container;
  e.resource_name = kMockGpu;
  e.device_ids[0] = std::move(ids);
  e.alloc_response = EnvResponse("RESTORED", pod).SerializeAsString();
  return e;
}

TEST_F(ManagerMockTest, RestartRestoresAllocationsAndNeverReallocatesThem) {
  checkpoint::CheckpointData data;
  data.entries = {Entry("p", "main", {"gpu0"})};
  data.registered_devices[kMockGpu] = {"gpu0", "gpu1"};
  data.boot_id = "boot-1";
  ASSERT_TRUE(store_->Replace(data).ok());
  // A stale plugin socket is removed at start (so the plugin re-registers);
  // other files stay.
  std::string stale = dir_ + "/old-plugin.sock";
  {
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    ::close(fd);
  }
  {
    std::FILE* f = std::fopen((dir_ + "/notes.txt").c_str(), "w");
    std::fclose(f);
  }
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/notes.txt"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/kubelet.sock"));
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{0, 0}));
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu0"));
  Pod p = MakePod("p", {{"main", {{kMockGpu, 1}}}});
  auto run = manager_->GetDeviceRunContainerOptions(p, "main");
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->envs.at("RESTORED"), "p");

  // The plugin registers again (StrictMock: no Allocate expected for p).
  FakePlugin& plugin = AddPlugin("/p/gpu.sock", MockGpus(2));
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  EXPECT_EQ(manager_->GetCapacity().resources.at(kMockGpu), (CapacityReport::Amounts{2, 2}));
  EXPECT_TRUE(manager_->Allocate(p, "main").ok());
  EXPECT_THAT(DevicesOf("p", "main"), ElementsAre("gpu0"));
  // gpu0 stays p's: another pod gets gpu1 only.
  EXPECT_EQ(manager_->Allocate(MakePod("q", {{"main", {{kMockGpu, 2}}}}), "main").message(),
            "requested number of devices unavailable for vendor.com/gpu. Requested: 2, "
            "Available: 1");
  EchoAllocate(plugin);
  ASSERT_TRUE(manager_->Allocate(MakePod("r", {{"main", {{kMockGpu, 1}}}}), "main").ok());
  EXPECT_THAT(DevicesOf("r", "main"), ElementsAre("gpu1"));
  EXPECT_TRUE(manager_->CheckInvariantsForTest().ok());
}

TEST_F(ManagerMockTest, RestoredResourceWithoutPluginIsDeletedAfterGrace) {
  checkpoint::CheckpointData data;
  data.registered_devices[kMockGpu] = {"gpu0"};
  ASSERT_TRUE(store_->Replace(data).ok());
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  EXPECT_EQ(manager_->GetCapacity().resources.count(kMockGpu), 1u);
  clock_->Advance(std::chrono::minutes(5));
  EXPECT_THAT(manager_->GetCapacity().deleted, ElementsAre(kMockGpu));
}

TEST_F(ManagerMockTest, RebootKeepsOnlyAllocationsOfActivePods) {
  checkpoint::CheckpointData data;
  data.entries = {Entry("gone", "main", {"gpu0"}), Entry("kept", "main", {"gpu1"})};
  data.registered_devices[kMockGpu] = {"gpu0", "gpu1"};
  data.boot_id = "boot-0";
  ASSERT_TRUE(store_->Replace(data).ok());
  active_ = {"kept"};
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  EXPECT_THAT(manager_->GetPodsWithDevices(), ElementsAre("kept"));
  auto stored = store_->Load();
  ASSERT_TRUE(stored.ok());
  EXPECT_EQ(stored->boot_id, "boot-1");
  ASSERT_EQ(stored->entries.size(), 1u);
  EXPECT_EQ(stored->entries[0].pod_uid, "kept");
}

TEST_F(ManagerMockTest, SameBootKeepsEveryAllocation) {
  checkpoint::CheckpointData data;
  data.entries = {Entry("a", "main", {"gpu0"}), Entry("b", "main", {"gpu1"})};
  data.boot_id = "boot-1";
  ASSERT_TRUE(store_->Replace(data).ok());
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  EXPECT_THAT(manager_->GetPodsWithDevices(), ElementsAre("a", "b"));
}

TEST_F(ManagerMockTest, StartTwiceAndStopTwice) {
  MakeManager();
  ASSERT_TRUE(manager_->Start().ok());
  EXPECT_EQ(manager_->Start().code(), StatusCode::kFailedPrecondition);
  manager_->Stop();
  manager_->Stop();
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/kubelet.sock"));
  EXPECT_EQ(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").code(), StatusCode::kUnavailable);
}

TEST_F(ManagerMockTest, TopologyHintsComeFromTheLedger) {
  MakeManager();
  FakePlugin& p = AddPlugin("/p/gpu.sock", MockGpus(4));  // gpu0,2 on node 0; gpu1,3 on node 1
  (void)p;
  ASSERT_TRUE(manager_->RegisterPlugin(kMockGpu, "/p/gpu.sock").ok());
  auto hints = manager_->GetTopologyHints(MakePod("p", {{"main", {{kMockGpu, 2}}}}), "main");
  ASSERT_TRUE(hints.ok()) << hints.status();
  ASSERT_TRUE(hints->at(kMockGpu).has_value());
  EXPECT_THAT(*hints->at(kMockGpu),
              UnorderedElementsAre(TopologyHint{{0}, true}, TopologyHint{{1}, true},
                                   TopologyHint{{0, 1}, false}));
  auto pod_hints = manager_->GetPodTopologyHints(MakePod("p", {{"main", {{kMockGpu, 3}}}}));
  ASSERT_TRUE(pod_hints.ok());
  EXPECT_THAT(*pod_hints->at(kMockGpu), ElementsAre(TopologyHint{{0, 1}, true}));
}

}  // namespace
}  // namespace kdm::devicemanager
