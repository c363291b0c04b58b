// The fake NVML itself: bad node descriptions give a clear error (never a
// crash), and the event channel delivers what a test appends.
#include <gtest/gtest.h>

#include <fstream>
#include <vector>

#include "kdm/nvml/discovery.h"
#include "kdm/nvml/library.h"
#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

using test::kFakeLibrary;
using test::TempDir;
using test::TwoGpuNode;
using test::UseNode;

class FakeNvmlBadDescriptionTest : public ::testing::Test {
 protected:
  // The error of loading the fake on `text`.
  std::string LoadError(const std::string& text) {
    UseNode(dir_.Write("node.json", text));
    auto lib = Library::Load(kFakeLibrary);
    if (lib.ok()) return "loaded";
    EXPECT_EQ(lib.status().message().find('\n'), std::string::npos) << lib.status().message();
    return lib.status().message();
  }
  // "nvmlInit_v2: fake NVML: <path>: <what> (NVML error 999)".
  std::string Error(const std::string& what) const {
    return "nvmlInit_v2: fake NVML: " + path_ + ": " + what + " (NVML error 999)";
  }

  TempDir dir_;
  const std::string path_ = dir_.path() + "/node.json";
};

TEST_F(FakeNvmlBadDescriptionTest, UnsetAndMissingFile) {
  unsetenv("KDM_FAKE_NVML_NODE");
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().message(),
            "nvmlInit_v2: fake NVML: KDM_FAKE_NVML_NODE is not set (NVML error 999)");
  UseNode(dir_.path() + "/absent.json");
  lib = Library::Load(kFakeLibrary);
  ASSERT_FALSE(lib.ok());
  EXPECT_NE(lib.status().message().find("cannot open " + dir_.path() + "/absent.json"),
            std::string::npos)
      << lib.status().message();
}

TEST_F(FakeNvmlBadDescriptionTest, GarbageAndTruncatedJson) {
  std::string e = LoadError("\x01\x02garbage");
  EXPECT_NE(e.find(path_ + ": not JSON: "), std::string::npos) << e;
  std::string full = TwoGpuNode();
  e = LoadError(full.substr(0, full.size() / 2));
  EXPECT_NE(e.find(path_ + ": not JSON: "), std::string::npos) << e;
  e = LoadError("");
  EXPECT_NE(e.find(path_ + ": not JSON"), std::string::npos) << e;
  EXPECT_EQ(LoadError("[]"), Error("$: expected an object, got array"));
}

TEST_F(FakeNvmlBadDescriptionTest, WrongTypesNameTheField) {
  EXPECT_EQ(LoadError(R"({"driver_version": 5, "cuda_driver_version": 1, "gpus": []})"),
            Error("$.driver_version: expected a string, got number"));
  EXPECT_EQ(LoadError(R"({"driver_version": "1", "cuda_driver_version": "12.4", "gpus": []})"),
            Error("$.cuda_driver_version: expected an integer, got string"));
  EXPECT_EQ(LoadError(R"({"driver_version": "1", "cuda_driver_version": 1, "gpus": {}})"),
            Error("$.gpus: expected an array, got object"));
  EXPECT_EQ(LoadError(R"({"driver_version": "1", "cuda_driver_version": 1})"),
            Error("$: missing \"gpus\""));
  EXPECT_EQ(LoadError(R"({"driver_version": "1", "cuda_driver_version": 1, "gpus": [],
                          "gpu": []})"),
            Error("$: unknown key \"gpu\""));
  std::string node = TwoGpuNode();
  auto replace = [&node](const std::string& from, const std::string& to) {
    std::string s = node;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_EQ(LoadError(replace(R"("minor": 3)", R"("minor": "3")")),
            Error("$.gpus[0].minor: expected an integer, got string"));
  EXPECT_EQ(LoadError(replace(R"("minor": 3)", R"("minor": -3)")),
            Error("$.gpus[0].minor: -3 is out of range [0, 1048576]"));
  EXPECT_EQ(LoadError(replace(R"("memory_mib": 81559)", R"("memory_mib": 1e30)")),
            Error("$.gpus[0].memory_mib: expected an integer, got number"));
  EXPECT_EQ(LoadError(replace(R"("memory_mib": 81559)", R"("memory_mib": 99999999999999999999)")),
            Error("$.gpus[0].memory_mib: expected an integer, got number"));
  EXPECT_EQ(LoadError(replace(R"("memory_mib": 81559)", R"("memory_mib": 18446744073709551615)")),
            Error("$.gpus[0].memory_mib: 18446744073709551615 is out of range [0, 1099511627776]"));
  EXPECT_EQ(LoadError(replace("00000000:1B:00.0", "../../etc")),
            Error("$.gpus[0].pci_bus_id: '../../etc' is not a PCI bus id (dddd:bb:dd.f)"));
  EXPECT_EQ(LoadError(replace(R"("compute_capability": "9.0")", R"("compute_capability": "9")")),
            Error("$.gpus[0].compute_capability: '9' is not MAJOR.MINOR"));
  EXPECT_EQ(LoadError(replace(R"("brand": "nvidia")", R"("brand": "acme")")),
            Error("$.gpus[0].brand: unknown brand 'acme'"));
  EXPECT_EQ(LoadError(replace(R"({"gpu": 1, "count": 2})", R"({"gpu": 7, "count": 2})")),
            Error("$.gpus[0].nvlinks[0].gpu: 7 is out of range [0, 1]"));
  EXPECT_EQ(LoadError(replace(R"({"gpu": 1, "count": 2})", R"({"gpu": "GPU-zz", "count": 2})")),
            Error("$.gpus[0].nvlinks[0].gpu: no GPU has uuid 'GPU-zz'"));
  EXPECT_EQ(LoadError(replace(R"({"gpu": 1, "count": 2})", R"({"gpu": 1, "count": 37})")),
            Error("$.gpus[0].nvlinks[0].count: 37 is out of range [0, 36]"));
  EXPECT_EQ(LoadError(replace(R"({"gpu": 1, "count": 2})",
                              R"({"gpu": 1, "count": 20}, {"gpu": 1, "count": 20})")),
            Error("$.gpus[0].nvlinks: 40 links, more than 36"));
  EXPECT_EQ(LoadError(replace(R"({"gpu": 1, "count": 2})", R"({"count": 2})")),
            Error("$.gpus[0].nvlinks[0]: give exactly one of \"gpu\", \"switch\", "
                  "\"remote_bus_id\""));
  EXPECT_EQ(LoadError(replace(R"(["PXB", "X"])", R"(["PIX", "X"])")),
            Error("$.pcie[1][0]: differs from $.pcie[0][1]"));
  EXPECT_EQ(LoadError(replace(R"(["PXB", "X"])", R"(["PXB"])")),
            Error("$.pcie[1]: expected an array of 2 cells"));
  EXPECT_EQ(LoadError(replace(R"(["PXB", "X"])", R"(["FAR", "X"])")),
            Error("$.pcie[1][0]: 'FAR' is not one of PSB PIX PXB PHB NODE SYS -"));
  EXPECT_EQ(LoadError(replace(R"("uuid": "GPU-aaaa")", R"("uuid": "")")),
            Error("$.gpus[0].uuid: empty"));
  EXPECT_EQ(
      LoadError(replace(R"("uuid": "GPU-aaaa")", R"("uuid": ")" + std::string(5000, 'a') + "\"")),
      Error("$.gpus[0].uuid: longer than 4096 bytes"));
  EXPECT_EQ(LoadError(TwoGpuNode(R"( "fail": {"init": "9"},)")),
            Error("$.fail.init: expected an integer, got string"));
  EXPECT_EQ(LoadError(TwoGpuNode(R"( "fail": {"reboot": 9},)")),
            Error("$.fail: unknown key \"reboot\""));
}

TEST_F(FakeNvmlBadDescriptionTest, AUuidLongerThanNvmlsBufferIsInsufficientSize) {
  std::string node = TwoGpuNode();
  node.replace(node.find("\"uuid\": \"GPU-bbbb\""), 18,
               "\"uuid\": \"GPU-" + std::string(100, 'a') + "\"");
  UseNode(dir_.Write("node.json", node));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto found = Discover(**lib, {});
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.status().message(), "nvmlDeviceGetUUID(GPU 1): Insufficient Size (NVML error 7)");
}

class FakeNvmlEventsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    events_ = dir_.Write("events", "");
    UseNode(
        dir_.Write("node.json", TwoGpuNode("", R"(, "supported_events": ["xid", "ecc_double"])")),
        events_);
    auto lib = Library::Load(kFakeLibrary);
    ASSERT_TRUE(lib.ok()) << lib.status();
    lib_ = std::move(*lib);
    auto node = Discover(*lib_, {});
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = *node;
    ASSERT_EQ(api().EventSetCreate(&set_), kSuccess);
  }
  void TearDown() override {
    if (set_ != nullptr) {
      EXPECT_EQ(api().EventSetFree(set_), kSuccess);
    }
  }
  const Api& api() const { return lib_->api(); }
  void Append(const std::string& line) { std::ofstream(events_, std::ios::app) << line; }
  Return Register(int gpu, unsigned long long mask) {
    return api().DeviceRegisterEvents(node_.gpus[gpu].handle, mask, set_);
  }

  TempDir dir_;
  std::string events_;
  std::unique_ptr<Library> lib_;
  NodeInfo node_;
  EventSetHandle set_ = nullptr;
};

TEST_F(FakeNvmlEventsTest, XidAndEccReachTheSet) {
  unsigned long long supported = 0;
  ASSERT_EQ(api().DeviceGetSupportedEventTypes(node_.gpus[0].handle, &supported), kSuccess);
  EXPECT_EQ(supported, kEventTypeXidCriticalError | kEventTypeDoubleBitEccError);
  ASSERT_EQ(Register(0, supported), kSuccess);
  Append("xid GPU-aaaa 79\n# a comment\n\necc GPU-aaaa\n");
  EventData data{};
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.device, node_.gpus[0].handle);
  EXPECT_EQ(data.event_type, kEventTypeXidCriticalError);
  EXPECT_EQ(data.event_data, 79u);
  EXPECT_EQ(data.gpu_instance_id, kNoInstanceId);
  EXPECT_EQ(data.compute_instance_id, kNoInstanceId);
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.event_type, kEventTypeDoubleBitEccError);
  EXPECT_EQ(data.event_data, 0u);
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 5), kErrorTimeout);
}

TEST_F(FakeNvmlEventsTest, AnEventAppendedDuringTheWaitIsDelivered) {
  ASSERT_EQ(Register(1, kEventTypeXidCriticalError), kSuccess);
  std::thread writer([events = events_] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::ofstream(events, std::ios::app) << "xid GPU-bbbb 48\n";
  });
  EventData data{};
  Return r = api().EventSetWait_v2(set_, &data, 30000);
  writer.join();
  ASSERT_EQ(r, kSuccess);
  EXPECT_EQ(data.device, node_.gpus[1].handle);
  EXPECT_EQ(data.event_data, 48u);
}

TEST_F(FakeNvmlEventsTest, OnlyRegisteredGpusAndTypesAndWholeLines) {
  ASSERT_EQ(Register(0, kEventTypeXidCriticalError), kSuccess);
  // GPU 1 is not in the set; ECC is not registered for GPU 0; bad lines are
  // skipped; a line without its newline is not read yet.
  Append(
      "xid GPU-bbbb 79\necc GPU-aaaa\nxid GPU-nope 1\nreboot GPU-aaaa\nxid GPU-aaaa\n"
      "xid GPU-aaaa 31");
  EventData data{};
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 5), kErrorTimeout);
  Append("\n");
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.event_data, 31u);
}

TEST_F(FakeNvmlEventsTest, RegistrationIsAllOrNothing) {
  EXPECT_EQ(Register(0, kEventTypeXidCriticalError | kEventTypeSingleBitEccError),
            kErrorNotSupported);
  Append("xid GPU-aaaa 79\n");
  EventData data{};
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 5), kErrorTimeout);
}

TEST_F(FakeNvmlEventsTest, LostGpuEndsTheWaitAndAnswersLostAfterwards) {
  ASSERT_EQ(Register(0, kEventTypeXidCriticalError), kSuccess);
  ASSERT_EQ(Register(1, kEventTypeXidCriticalError), kSuccess);
  Append("lost GPU-bbbb\n");
  EventData data{};
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 10000), kErrorGpuIsLost);
  char uuid[kUuidBufferSize];
  EXPECT_EQ(api().DeviceGetUUID(node_.gpus[1].handle, uuid, sizeof uuid), kErrorGpuIsLost);
  EXPECT_EQ(api().DeviceGetUUID(node_.gpus[0].handle, uuid, sizeof uuid), kSuccess);
}

TEST_F(FakeNvmlEventsTest, OnlyEventsInjectedAfterTheRegistrationAreDelivered) {
  // As real NVML: what happened before a GPU joined the set never reaches
  // it (a restarted plugin must not see the Xids of its predecessor).
  Append("xid GPU-aaaa 79\nxid GPU-bbbb 79\n");
  ASSERT_EQ(Register(0, kEventTypeXidCriticalError), kSuccess);
  EventData data{};
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 5), kErrorTimeout);
  // GPU 1 joins later: the Xid on it injected in between is not delivered
  // either; the one on GPU 0 is, and so is GPU 1's after its registration.
  Append("xid GPU-bbbb 48\nxid GPU-aaaa 31\n");
  ASSERT_EQ(Register(1, kEventTypeXidCriticalError), kSuccess);
  // Registering again for more types keeps the first registration's start.
  ASSERT_EQ(Register(0, kEventTypeXidCriticalError | kEventTypeDoubleBitEccError), kSuccess);
  Append("xid GPU-bbbb 94\n");
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.device, node_.gpus[0].handle);
  EXPECT_EQ(data.event_data, 31u);
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.device, node_.gpus[1].handle);
  EXPECT_EQ(data.event_data, 94u);
  EXPECT_EQ(api().EventSetWait_v2(set_, &data, 5), kErrorTimeout);
}

TEST_F(FakeNvmlEventsTest, TheReplaySwitchDeliversEarlierEvents) {
  Append("xid GPU-aaaa 79\n");
  setenv("KDM_FAKE_NVML_REPLAY_EVENTS", "1", 1);
  Return r = Register(0, kEventTypeXidCriticalError);
  unsetenv("KDM_FAKE_NVML_REPLAY_EVENTS");
  ASSERT_EQ(r, kSuccess);
  EventData data{};
  ASSERT_EQ(api().EventSetWait_v2(set_, &data, 10000), kSuccess);
  EXPECT_EQ(data.event_data, 79u);
  // Any other value is off.
  EventSetHandle other = nullptr;
  ASSERT_EQ(api().EventSetCreate(&other), kSuccess);
  setenv("KDM_FAKE_NVML_REPLAY_EVENTS", "yes", 1);
  r = api().DeviceRegisterEvents(node_.gpus[0].handle, kEventTypeXidCriticalError, other);
  unsetenv("KDM_FAKE_NVML_REPLAY_EVENTS");
  ASSERT_EQ(r, kSuccess);
  EXPECT_EQ(api().EventSetWait_v2(other, &data, 5), kErrorTimeout);
  EXPECT_EQ(api().EventSetFree(other), kSuccess);
}

TEST(FakeNvmlOptionalDataTest, BadValuesNameTheField) {
  TempDir dir;
  struct Case {
    std::string gpu_extra;
    std::string want;
  };
  for (const Case& c : std::vector<Case>{
           {R"(, "serial": "0123456789012345678901234567890")",
            "$.gpus[0].serial: longer than 29 bytes"},
           {R"(, "serial": 7)", "$.gpus[0].serial: expected a string, got number"},
           {R"(, "power_limit_mw": -1)", "$.gpus[0].power_limit_mw: -1 is out of range"},
           {R"(, "bar1_mib": "big")", "$.gpus[0].bar1_mib: expected an integer, got string"},
           {R"(, "pcie_link": {"gen": 4, "lanes": 16})",
            "$.gpus[0].pcie_link: unknown key \"lanes\""},
           {R"(, "pcie_link": [4])", "$.gpus[0].pcie_link: expected an object, got array"},
           {R"(, "clocks_mhz": {"sm": 99999999})",
            "$.gpus[0].clocks_mhz.sm: 99999999 is out of range"},
           {R"(, "max_clocks_mhz": {"shader": 1})",
            "$.gpus[0].max_clocks_mhz: unknown key \"shader\""}}) {
    UseNode(dir.Write("node.json", TwoGpuNode("", c.gpu_extra)));
    auto lib = Library::Load(kFakeLibrary);
    ASSERT_FALSE(lib.ok()) << c.gpu_extra;
    EXPECT_NE(lib.status().message().find(c.want), std::string::npos)
        << c.gpu_extra << ": " << lib.status().message();
  }
}

TEST(FakeNvmlEventsFailTest, RegistrationFailureSwitch) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode("", R"(, "fail": {"register_events": 3})")));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto node = Discover(**lib, {});
  ASSERT_TRUE(node.ok()) << node.status();
  const Api& api = (*lib)->api();
  EventSetHandle set = nullptr;
  ASSERT_EQ(api.EventSetCreate(&set), kSuccess);
  EXPECT_EQ(api.DeviceRegisterEvents(node->gpus[0].handle, kEventTypeXidCriticalError, set),
            kErrorNotSupported);
  EXPECT_EQ(api.DeviceRegisterEvents(node->gpus[1].handle, kEventTypeXidCriticalError, set),
            kSuccess);
  EventData data{};
  // No events file: every wait times out.
  EXPECT_EQ(api.EventSetWait_v2(set, &data, 1), kErrorTimeout);
  EXPECT_EQ(api.EventSetFree(set), kSuccess);
}

}  // namespace
}  // namespace kdm::nvml
