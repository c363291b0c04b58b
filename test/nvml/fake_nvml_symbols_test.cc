// The fake libnvidia-ml.so.1 as a program sees it: its dynamic symbol table
// equals test/nvml/fake_nvml/exported_symbols.txt, and every function listed
// there, called on every preset node description with valid and invalid
// arguments, answers an NVML code and the description's data.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "fake_nvml/fake_nvml_api.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/nvml_api.h"
#include "kdm/nvml/topology_from_nvml.h"
#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

using json = nlohmann::json;
using test::kFakeLibrary;
using test::kNodesDir;
using test::UseNode;

const std::string kSymbolList =
    std::string(KDM_TEST_SOURCE_DIR) + "/test/nvml/fake_nvml/exported_symbols.txt";

// exported_symbols.txt: "name kind" per line, kind one of impl, device,
// instance, unit, other (fake_nvml.cc, "the rest of the API").
std::map<std::string, std::string> SymbolList() {
  std::map<std::string, std::string> out;
  std::ifstream in(kSymbolList);
  EXPECT_TRUE(in) << kSymbolList;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name, kind, rest;
    EXPECT_TRUE(fields >> name >> kind) << "bad line '" << line << "'";
    EXPECT_FALSE(fields >> rest) << "bad line '" << line << "'";
    EXPECT_TRUE(out.emplace(name, kind).second) << name << " listed twice";
  }
  return out;
}

// What `nm -D --defined-only` says the library defines.
std::set<std::string> DynamicSymbols(const std::string& library) {
  std::set<std::string> out;
  const std::string cmd = "nm -D --defined-only '" + library + "' 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr);
  if (p == nullptr) return out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    std::istringstream fields(buf);
    std::string address, type, name;
    if (fields >> address >> type >> name) out.insert(name + " " + type);
  }
  EXPECT_EQ(::pclose(p), 0) << cmd;
  return out;
}

TEST(FakeNvmlSymbolsTest, TheDynamicSymbolTableEqualsTheList) {
  std::map<std::string, std::string> list = SymbolList();
  const std::set<std::string> kinds = {"impl", "device", "instance", "unit", "other"};
  std::set<std::string> want;
  for (const auto& [name, kind] : list) {
    EXPECT_TRUE(kinds.count(kind)) << name << ": unknown kind " << kind;
    want.insert(name + " T");  // a function in the text section, nothing else
  }
  const std::set<std::string> got = DynamicSymbols(kFakeLibrary);
  std::vector<std::string> missing, extra;
  std::set_difference(want.begin(), want.end(), got.begin(), got.end(),
                      std::back_inserter(missing));
  std::set_difference(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(extra));
  EXPECT_TRUE(missing.empty()) << "listed, not exported: " << ::testing::PrintToString(missing);
  EXPECT_TRUE(extra.empty()) << "exported, not listed: " << ::testing::PrintToString(extra);
  EXPECT_EQ(got.size(), list.size());
  // At least what NVIDIA's k8s-device-plugin calls at start and in
  // GetPreferredAllocation, answered from the description.
  for (const char* name : {"nvmlDeviceGetHandleByUUID", "nvmlDeviceGetPowerManagementLimit",
                           "nvmlDeviceGetBAR1MemoryInfo", "nvmlDeviceGetMaxPcieLinkGeneration",
                           "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetMaxClockInfo"}) {
    EXPECT_EQ(list[name], "impl") << name;
  }
}

// The fake, dlopened by the test: its functions by name.
class Fake {
 public:
  Fake() : handle_(::dlopen(kFakeLibrary, RTLD_NOW | RTLD_LOCAL)) {
    EXPECT_NE(handle_, nullptr) << ::dlerror();
  }
  ~Fake() {
    if (handle_ != nullptr) ::dlclose(handle_);
  }
  Fake(const Fake&) = delete;
  Fake& operator=(const Fake&) = delete;

  void* Symbol(const std::string& name) const {
    void* s = handle_ == nullptr ? nullptr : ::dlsym(handle_, name.c_str());
    EXPECT_NE(s, nullptr) << name;
    return s;
  }
  // The function `name`, as a pointer of type F.
  template <typename F>
  F Fn(const std::string& name) const {
    return reinterpret_cast<F>(Symbol(name));
  }

 private:
  void* handle_;
};

bool IsNvmlCode(Return r) { return (r >= 0 && r <= kErrorResetTypeNotSupported) || r == 999; }

// The preset node descriptions.
std::vector<std::string> NodeFiles() {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(kNodesDir)) {
    if (e.path().extension() == ".json") out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

using Handles = std::vector<DeviceHandle>;

// One function's checks on one node: `node` its description, `gpus` the
// handles in index order, `bogus` a pointer that is no handle.
using Check =
    std::function<void(const Fake&, const json& node, const Handles& gpus, DeviceHandle bogus)>;

// A device function taking (handle, unsigned*): each GPU answers `want(g)`
// (nullopt: NOT_SUPPORTED), a null out pointer and a bad handle answer 2.
Check UnsignedCheck(const std::string& name,
                    std::function<std::optional<unsigned>(const json& gpu)> want) {
  return [name, want](const Fake& f, const json& node, const Handles& gpus, DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, unsigned*)>(name);
    for (size_t i = 0; i < gpus.size(); ++i) {
      unsigned v = 12345;
      std::optional<unsigned> w = want(node["gpus"][i]);
      Return r = fn(gpus[i], &v);
      if (w) {
        EXPECT_EQ(r, kSuccess) << name << " gpu " << i;
        EXPECT_EQ(v, *w) << name << " gpu " << i;
      } else {
        EXPECT_EQ(r, kErrorNotSupported) << name << " gpu " << i;
      }
      r = fn(gpus[i], nullptr);
      EXPECT_TRUE(r == kErrorInvalidArgument || (!w && r == kErrorNotSupported)) << name << r;
    }
    unsigned v = 0;
    EXPECT_EQ(fn(bogus, &v), kErrorInvalidArgument) << name;
    EXPECT_EQ(fn(nullptr, &v), kErrorInvalidArgument) << name;
  };
}

// A device function taking (handle, char*, unsigned): the string `want(g)`,
// INSUFFICIENT_SIZE one byte short, INVALID_ARGUMENT for null and bad handles.
Check StringCheck(const std::string& name, std::function<std::string(const json& gpu)> want) {
  return [name, want](const Fake& f, const json& node, const Handles& gpus, DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, char*, unsigned)>(name);
    char buf[128];
    for (size_t i = 0; i < gpus.size(); ++i) {
      const std::string w = want(node["gpus"][i]);
      ASSERT_EQ(fn(gpus[i], buf, sizeof buf), kSuccess) << name;
      EXPECT_EQ(std::string(buf), w) << name;
      EXPECT_EQ(fn(gpus[i], buf, static_cast<unsigned>(w.size())), kErrorInsufficientSize) << name;
      EXPECT_EQ(fn(gpus[i], nullptr, sizeof buf), kErrorInvalidArgument) << name;
    }
    EXPECT_EQ(fn(bogus, buf, sizeof buf), kErrorInvalidArgument) << name;
  };
}

std::optional<unsigned> Opt(const json& obj, const char* key) {
  if (!obj.contains(key)) return std::nullopt;
  return obj[key].get<unsigned>();
}

std::optional<unsigned> Opt2(const json& obj, const char* table, const char* key) {
  if (!obj.contains(table)) return std::nullopt;
  return Opt(obj[table], key);
}

bool MigCapableCc(const json& gpu) {
  const std::string cc = gpu["compute_capability"];
  return cc == "8.0" || cc == "9.0";
}

// Whether the description links GPUs i and j by NVLink (directly or
// through a common NVSwitch).
bool Linked(const json& node, size_t i, size_t j) {
  const json& a = node["gpus"][i];
  const json& b = node["gpus"][j];
  if (!a.contains("nvlinks") || !b.contains("nvlinks")) return false;
  for (const json& la : a["nvlinks"]) {
    if (la.contains("gpu") && (la["gpu"] == j || la["gpu"] == b["uuid"])) return true;
    if (!la.contains("switch")) continue;
    for (const json& lb : b["nvlinks"]) {
      if (lb.contains("switch") && lb["switch"] == la["switch"]) return true;
    }
  }
  return false;
}

int LinkCount(const json& gpu) {
  int n = 0;
  for (const json& l : gpu["nvlinks"])
    n += l.contains("disabled") ? l["disabled"].get<int>() : l["count"].get<int>();
  return n;
}

// The checks of every implemented function ("impl" in the list).
std::map<std::string, Check> Checks() {
  std::map<std::string, Check> c;
  auto noop = [](const Fake&, const json&, const Handles&, DeviceHandle) {};
  // Init and shutdown run around every node's checks (the fixture below).
  for (const char* n : {"nvmlInit", "nvmlInit_v2", "nvmlShutdown"}) c[n] = noop;
  c["nvmlInitWithFlags"] = [](const Fake& f, const json&, const Handles&, DeviceHandle) {
    EXPECT_EQ(f.Fn<Return (*)(unsigned)>("nvmlInitWithFlags")(0), kSuccess);
    EXPECT_EQ(f.Fn<Return (*)()>("nvmlShutdown")(), kSuccess);
  };
  c["nvmlErrorString"] = [](const Fake& f, const json&, const Handles&, DeviceHandle) {
    auto fn = f.Fn<const char* (*)(Return)>("nvmlErrorString");
    std::set<std::string> seen;
    for (Return r = 0; r <= kErrorResetTypeNotSupported; ++r) {
      ASSERT_NE(fn(r), nullptr) << r;
      EXPECT_TRUE(seen.insert(fn(r)).second) << r << " shares its text: " << fn(r);
    }
    EXPECT_STREQ(fn(-7), "Unknown Error");
  };
  c["nvmlSystemGetDriverVersion"] = [](const Fake& f, const json& node, const Handles&,
                                       DeviceHandle) {
    auto fn = f.Fn<Return (*)(char*, unsigned)>("nvmlSystemGetDriverVersion");
    char buf[80];
    ASSERT_EQ(fn(buf, sizeof buf), kSuccess);
    EXPECT_EQ(std::string(buf), node["driver_version"]);
    EXPECT_EQ(fn(buf, 2), kErrorInsufficientSize);
    EXPECT_EQ(fn(nullptr, sizeof buf), kErrorInvalidArgument);
  };
  c["nvmlSystemGetNVMLVersion"] = [](const Fake& f, const json& node, const Handles&,
                                     DeviceHandle) {
    auto fn = f.Fn<Return (*)(char*, unsigned)>("nvmlSystemGetNVMLVersion");
    char buf[80];
    ASSERT_EQ(fn(buf, sizeof buf), kSuccess);
    EXPECT_EQ(std::string(buf), std::to_string(node["cuda_driver_version"].get<int>() / 1000) +
                                    "." + node["driver_version"].get<std::string>());
    EXPECT_EQ(fn(buf, 2), kErrorInsufficientSize);
    EXPECT_EQ(fn(nullptr, sizeof buf), kErrorInvalidArgument);
  };
  for (const char* n : {"nvmlSystemGetCudaDriverVersion", "nvmlSystemGetCudaDriverVersion_v2"}) {
    c[n] = [n](const Fake& f, const json& node, const Handles&, DeviceHandle) {
      auto fn = f.Fn<Return (*)(int*)>(n);
      int v = 0;
      ASSERT_EQ(fn(&v), kSuccess);
      EXPECT_EQ(v, node["cuda_driver_version"]);
      EXPECT_EQ(fn(nullptr), kErrorInvalidArgument);
    };
  }
  for (const char* n : {"nvmlDeviceGetCount", "nvmlDeviceGetCount_v2"}) {
    c[n] = [n](const Fake& f, const json& node, const Handles&, DeviceHandle) {
      auto fn = f.Fn<Return (*)(unsigned*)>(n);
      unsigned v = 0;
      ASSERT_EQ(fn(&v), kSuccess);
      EXPECT_EQ(v, node["gpus"].size());
      EXPECT_EQ(fn(nullptr), kErrorInvalidArgument);
    };
  }
  for (const char* n : {"nvmlUnitGetCount", "nvmlGetExcludedDeviceCount"}) {
    c[n] = [n](const Fake& f, const json&, const Handles&, DeviceHandle) {
      auto fn = f.Fn<Return (*)(unsigned*)>(n);
      unsigned v = 7;
      ASSERT_EQ(fn(&v), kSuccess);
      EXPECT_EQ(v, 0u);
      EXPECT_EQ(fn(nullptr), kErrorInvalidArgument);
    };
  }
  for (const char* n : {"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2"}) {
    c[n] = [n](const Fake& f, const json&, const Handles& gpus, DeviceHandle) {
      auto fn = f.Fn<Return (*)(unsigned, DeviceHandle*)>(n);
      DeviceHandle h = nullptr;
      for (unsigned i = 0; i < gpus.size(); ++i) {
        ASSERT_EQ(fn(i, &h), kSuccess);
        EXPECT_EQ(h, gpus[i]);
      }
      EXPECT_EQ(fn(static_cast<unsigned>(gpus.size()), &h), kErrorInvalidArgument);
      EXPECT_EQ(fn(0, nullptr), kErrorInvalidArgument);
    };
  }
  // The by-key lookups: each GPU's key finds it; unknown keys are not found.
  auto lookup = [](const char* n, std::function<std::string(const json&)> key, const char* unknown,
                   Return unknown_answer) -> Check {
    return [=](const Fake& f, const json& node, const Handles& gpus, DeviceHandle) {
      auto fn = f.Fn<Return (*)(const char*, DeviceHandle*)>(n);
      DeviceHandle h = nullptr;
      for (size_t i = 0; i < gpus.size(); ++i) {
        const std::string k = key(node["gpus"][i]);
        ASSERT_EQ(fn(k.c_str(), &h), kSuccess) << n << " " << k;
        EXPECT_EQ(h, gpus[i]) << n << " " << k;
        EXPECT_EQ(fn(k.c_str(), nullptr), kErrorInvalidArgument) << n;
      }
      EXPECT_EQ(fn(unknown, &h), unknown_answer) << n << " " << unknown;
      EXPECT_EQ(fn("", &h), n == std::string("nvmlDeviceGetHandleByPciBusId") ||
                                    n == std::string("nvmlDeviceGetHandleByPciBusId_v2")
                                ? kErrorInvalidArgument
                                : kErrorNotFound)
          << n;
      EXPECT_EQ(fn(nullptr, &h), kErrorInvalidArgument) << n;
    };
  };
  c["nvmlDeviceGetHandleByUUID"] = lookup(
      "nvmlDeviceGetHandleByUUID", [](const json& g) { return g["uuid"].get<std::string>(); },
      "GPU-00000000-0000-0000-0000-000000000000", kErrorNotFound);
  c["nvmlDeviceGetHandleBySerial"] = lookup(
      "nvmlDeviceGetHandleBySerial", [](const json& g) { return g["serial"].get<std::string>(); },
      "0000000000000", kErrorNotFound);
  for (const char* n : {"nvmlDeviceGetHandleByPciBusId", "nvmlDeviceGetHandleByPciBusId_v2"}) {
    // The 4-digit domain and lower case find the GPU too; garbage is invalid.
    c[n] = [n, lookup](const Fake& f, const json& node, const Handles& gpus, DeviceHandle b) {
      lookup(
          n, [](const json& g) { return g["pci_bus_id"].get<std::string>(); }, "0000:FF:1F.7",
          kErrorNotFound)(f, node, gpus, b);
      auto fn = f.Fn<Return (*)(const char*, DeviceHandle*)>(n);
      DeviceHandle h = nullptr;
      std::string legacy = node["gpus"][0]["pci_bus_id"].get<std::string>().substr(4);
      for (char& ch : legacy) ch = static_cast<char>(std::tolower(ch));
      ASSERT_EQ(fn(legacy.c_str(), &h), kSuccess) << legacy;
      EXPECT_EQ(h, gpus[0]);
      EXPECT_EQ(fn("not a bus id", &h), kErrorInvalidArgument);
    };
  }
  c["nvmlDeviceGetIndex"] = [](const Fake& f, const json& node, const Handles& gpus,
                               DeviceHandle bogus) {
    UnsignedCheck("nvmlDeviceGetIndex", [&](const json& g) -> std::optional<unsigned> {
      for (unsigned i = 0; i < node["gpus"].size(); ++i) {
        if (node["gpus"][i]["uuid"] == g["uuid"]) return i;
      }
      return std::nullopt;
    })(f, node, gpus, bogus);
  };
  c["nvmlDeviceGetMinorNumber"] =
      UnsignedCheck("nvmlDeviceGetMinorNumber", [](const json& g) { return Opt(g, "minor"); });
  c["nvmlDeviceGetUUID"] =
      StringCheck("nvmlDeviceGetUUID", [](const json& g) { return g["uuid"].get<std::string>(); });
  c["nvmlDeviceGetName"] =
      StringCheck("nvmlDeviceGetName", [](const json& g) { return g["name"].get<std::string>(); });
  c["nvmlDeviceGetSerial"] = StringCheck(
      "nvmlDeviceGetSerial", [](const json& g) { return g["serial"].get<std::string>(); });
  c["nvmlDeviceGetPowerManagementLimit"] = UnsignedCheck(
      "nvmlDeviceGetPowerManagementLimit", [](const json& g) { return Opt(g, "power_limit_mw"); });
  c["nvmlDeviceGetEnforcedPowerLimit"] = UnsignedCheck(
      "nvmlDeviceGetEnforcedPowerLimit", [](const json& g) { return Opt(g, "power_limit_mw"); });
  c["nvmlDeviceGetPowerUsage"] = UnsignedCheck(
      "nvmlDeviceGetPowerUsage", [](const json& g) { return Opt(g, "power_usage_mw"); });
  const std::map<std::string, const char*> pcie = {
      {"nvmlDeviceGetMaxPcieLinkGeneration", "max_gen"},
      {"nvmlDeviceGetMaxPcieLinkWidth", "max_width"},
      {"nvmlDeviceGetCurrPcieLinkGeneration", "gen"},
      {"nvmlDeviceGetCurrPcieLinkWidth", "width"}};
  for (const auto& [n, key] : pcie) {
    const char* k = key;
    c[n] = UnsignedCheck(n, [k](const json& g) { return Opt2(g, "pcie_link", k); });
  }
  for (const auto& [n, table] :
       std::map<std::string, const char*>{{"nvmlDeviceGetClockInfo", "clocks_mhz"},
                                          {"nvmlDeviceGetMaxClockInfo", "max_clocks_mhz"}}) {
    const std::string name = n;
    const char* t = table;
    c[n] = [name, t](const Fake& f, const json& node, const Handles& gpus, DeviceHandle bogus) {
      auto fn = f.Fn<Return (*)(DeviceHandle, int, unsigned*)>(name);
      const char* kinds[] = {"graphics", "sm", "memory", "video"};
      for (size_t i = 0; i < gpus.size(); ++i) {
        for (int type = 0; type < 4; ++type) {
          unsigned v = 0;
          std::optional<unsigned> w = Opt2(node["gpus"][i], t, kinds[type]);
          ASSERT_EQ(fn(gpus[i], type, &v), w ? kSuccess : kErrorNotSupported) << name;
          if (w) {
            EXPECT_EQ(v, *w) << name << " " << kinds[type];
          }
        }
        unsigned v = 0;
        EXPECT_EQ(fn(gpus[i], 4, &v), kErrorInvalidArgument) << name;
        EXPECT_EQ(fn(gpus[i], -1, &v), kErrorInvalidArgument) << name;
        EXPECT_EQ(fn(gpus[i], kClockSm, nullptr), kErrorInvalidArgument) << name;
      }
      unsigned v = 0;
      EXPECT_EQ(fn(bogus, kClockSm, &v), kErrorInvalidArgument) << name;
    };
  }
  c["nvmlDeviceGetMemoryInfo"] = [](const Fake& f, const json& node, const Handles& gpus,
                                    DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, Memory*)>("nvmlDeviceGetMemoryInfo");
    for (size_t i = 0; i < gpus.size(); ++i) {
      Memory m{};
      ASSERT_EQ(fn(gpus[i], &m), kSuccess);
      EXPECT_EQ(m.total, node["gpus"][i]["memory_mib"].get<unsigned long long>() << 20);
      EXPECT_EQ(m.free + m.used, m.total);
      EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
    }
    Memory m{};
    EXPECT_EQ(fn(bogus, &m), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetMemoryInfo_v2"] = [](const Fake& f, const json& node, const Handles& gpus,
                                       DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, MemoryV2*)>("nvmlDeviceGetMemoryInfo_v2");
    for (size_t i = 0; i < gpus.size(); ++i) {
      MemoryV2 m{};
      EXPECT_EQ(fn(gpus[i], &m), kErrorArgumentVersionMismatch);  // version unset
      m.version = kMemoryV2Version;
      ASSERT_EQ(fn(gpus[i], &m), kSuccess);
      EXPECT_EQ(m.total, node["gpus"][i]["memory_mib"].get<unsigned long long>() << 20);
      EXPECT_EQ(m.free + m.used + m.reserved, m.total);
      EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
    }
    MemoryV2 m{};
    m.version = kMemoryV2Version;
    EXPECT_EQ(fn(bogus, &m), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetBAR1MemoryInfo"] = [](const Fake& f, const json& node, const Handles& gpus,
                                        DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, Bar1Memory*)>("nvmlDeviceGetBAR1MemoryInfo");
    for (size_t i = 0; i < gpus.size(); ++i) {
      Bar1Memory m{};
      ASSERT_EQ(fn(gpus[i], &m), kSuccess);
      EXPECT_EQ(m.total, node["gpus"][i]["bar1_mib"].get<unsigned long long>() << 20);
      EXPECT_EQ(m.free + m.used, m.total);
      EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
    }
    Bar1Memory m{};
    EXPECT_EQ(fn(bogus, &m), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetCudaComputeCapability"] = [](const Fake& f, const json& node, const Handles& gpus,
                                               DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, int*, int*)>("nvmlDeviceGetCudaComputeCapability");
    for (size_t i = 0; i < gpus.size(); ++i) {
      int major = -1, minor = -1;
      ASSERT_EQ(fn(gpus[i], &major, &minor), kSuccess);
      EXPECT_EQ(std::to_string(major) + "." + std::to_string(minor),
                node["gpus"][i]["compute_capability"]);
      EXPECT_EQ(fn(gpus[i], nullptr, &minor), kErrorInvalidArgument);
    }
    int major = 0, minor = 0;
    EXPECT_EQ(fn(bogus, &major, &minor), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetArchitecture"] =
      UnsignedCheck("nvmlDeviceGetArchitecture", [](const json& g) -> std::optional<unsigned> {
        static const std::map<std::string, unsigned> kArch = {
            {"6.0", kArchPascal}, {"7.0", kArchVolta}, {"7.5", kArchTuring},
            {"8.0", kArchAmpere}, {"8.9", kArchAda},   {"9.0", kArchHopper}};
        return kArch.at(g["compute_capability"]);
      });
  c["nvmlDeviceGetBrand"] = [](const Fake& f, const json& node, const Handles& gpus,
                               DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, BrandType*)>("nvmlDeviceGetBrand");
    for (size_t i = 0; i < gpus.size(); ++i) {
      BrandType b = -1;
      ASSERT_EQ(fn(gpus[i], &b), kSuccess);
      EXPECT_EQ(b, *BrandFromName(node["gpus"][i].value("brand", std::string("nvidia"))));
      EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
    }
    BrandType b = 0;
    EXPECT_EQ(fn(bogus, &b), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetPciInfo_v3"] = [](const Fake& f, const json& node, const Handles& gpus,
                                    DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, PciInfo*)>("nvmlDeviceGetPciInfo_v3");
    for (size_t i = 0; i < gpus.size(); ++i) {
      PciInfo p{};
      ASSERT_EQ(fn(gpus[i], &p), kSuccess);
      EXPECT_EQ(CanonicalBusId(p.bus_id),
                CanonicalBusId(node["gpus"][i]["pci_bus_id"].get<std::string>()));
      EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
    }
    PciInfo p{};
    EXPECT_EQ(fn(bogus, &p), kErrorInvalidArgument);
  };
  // The legacy layout: the first 36 bytes, nothing written past them.
  for (const char* n : {"nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2"}) {
    c[n] = [n](const Fake& f, const json& node, const Handles& gpus, DeviceHandle bogus) {
      auto fn = f.Fn<Return (*)(DeviceHandle, PciInfo*)>(n);
      for (size_t i = 0; i < gpus.size(); ++i) {
        PciInfo p{};
        std::memset(p.bus_id, 'x', sizeof p.bus_id);
        ASSERT_EQ(fn(gpus[i], &p), kSuccess);
        EXPECT_EQ(CanonicalBusId(p.bus_id_legacy),
                  CanonicalBusId(node["gpus"][i]["pci_bus_id"].get<std::string>()));
        EXPECT_EQ(p.bus_id[0], 'x') << n << " wrote past the legacy layout";
        EXPECT_EQ(fn(gpus[i], nullptr), kErrorInvalidArgument);
      }
      PciInfo p{};
      EXPECT_EQ(fn(bogus, &p), kErrorInvalidArgument);
    };
  }
  // Topology: the pcie matrix of the description (default SYS).
  auto level_of = [](const json& node, size_t i, size_t j) -> int {
    if (i == j) return kTopologyInternal;
    if (!node.contains("pcie")) return kTopologySystem;
    static const std::map<std::string, int> kLevels = {{"PSB", kTopologyInternal},
                                                       {"PIX", kTopologySingle},
                                                       {"PXB", kTopologyMultiple},
                                                       {"PHB", kTopologyHostBridge},
                                                       {"NODE", kTopologyNode},
                                                       {"SYS", kTopologySystem},
                                                       {"-", -1}};
    return kLevels.at(node["pcie"][i][j]);
  };
  c["nvmlDeviceGetTopologyCommonAncestor"] = [level_of](const Fake& f, const json& node,
                                                        const Handles& gpus, DeviceHandle bogus) {
    auto fn =
        f.Fn<Return (*)(DeviceHandle, DeviceHandle, int*)>("nvmlDeviceGetTopologyCommonAncestor");
    for (size_t i = 0; i < gpus.size(); ++i) {
      for (size_t j = 0; j < gpus.size(); ++j) {
        int level = -2;
        const int want = level_of(node, i, j);
        ASSERT_EQ(fn(gpus[i], gpus[j], &level), want < 0 ? kErrorNotSupported : kSuccess);
        if (want >= 0) {
          EXPECT_EQ(level, want) << i << "," << j;
        }
      }
      int level = 0;
      EXPECT_EQ(fn(gpus[i], bogus, &level), kErrorInvalidArgument);
      EXPECT_EQ(fn(gpus[i], gpus[i], nullptr), kErrorInvalidArgument);
    }
  };
  c["nvmlDeviceGetTopologyNearestGpus"] = [level_of](const Fake& f, const json& node,
                                                     const Handles& gpus, DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, int, unsigned*, DeviceHandle*)>(
        "nvmlDeviceGetTopologyNearestGpus");
    for (size_t i = 0; i < gpus.size(); ++i) {
      for (int level : {kTopologySingle, kTopologyNode, kTopologySystem}) {
        Handles want;
        for (size_t j = 0; j < gpus.size(); ++j) {
          int l = level_of(node, i, j);
          if (j != i && l >= 0 && l <= level) want.push_back(gpus[j]);
        }
        unsigned count = 0;
        ASSERT_EQ(fn(gpus[i], level, &count, nullptr), kSuccess);
        EXPECT_EQ(count, want.size());
        Handles got(want.size() + 1);
        count = static_cast<unsigned>(got.size());
        ASSERT_EQ(fn(gpus[i], level, &count, got.data()), kSuccess);
        got.resize(count);
        EXPECT_EQ(got, want) << "gpu " << i << " level " << level;
        if (!want.empty()) {
          count = static_cast<unsigned>(want.size() - 1);
          EXPECT_EQ(fn(gpus[i], level, &count, got.data()), kErrorInsufficientSize);
          EXPECT_EQ(count, want.size());
        }
      }
      unsigned count = 0;
      EXPECT_EQ(fn(gpus[i], 7, &count, nullptr), kErrorInvalidArgument);
      EXPECT_EQ(fn(gpus[i], kTopologySystem, nullptr, nullptr), kErrorInvalidArgument);
      count = 3;
      EXPECT_EQ(fn(gpus[i], kTopologySystem, &count, nullptr), kErrorInvalidArgument);
    }
    unsigned count = 0;
    EXPECT_EQ(fn(bogus, kTopologySystem, &count, nullptr), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetP2PStatus"] = [level_of](const Fake& f, const json& node, const Handles& gpus,
                                           DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, DeviceHandle, int, int*)>("nvmlDeviceGetP2PStatus");
    for (size_t i = 0; i < gpus.size(); ++i) {
      for (size_t j = 0; j < gpus.size(); ++j) {
        int s = -1;
        if (i == j) {
          EXPECT_EQ(fn(gpus[i], gpus[j], kP2pRead, &s), kErrorInvalidArgument);
          continue;
        }
        const bool linked = Linked(node, i, j);
        const int l = level_of(node, i, j);
        const bool pcie = l >= 0 && l <= kTopologyHostBridge;
        ASSERT_EQ(fn(gpus[i], gpus[j], kP2pNvLink, &s), kSuccess);
        EXPECT_EQ(s, linked ? kP2pStatusOk : kP2pStatusNotSupported) << i << "," << j;
        ASSERT_EQ(fn(gpus[i], gpus[j], kP2pRead, &s), kSuccess);
        EXPECT_EQ(s, linked || pcie ? kP2pStatusOk : kP2pStatusTopologyNotSupported);
      }
      int s = 0;
      if (gpus.size() > 1) {
        EXPECT_EQ(fn(gpus[i], gpus[(i + 1) % gpus.size()], 5, &s), kErrorInvalidArgument);
        EXPECT_EQ(fn(gpus[i], gpus[(i + 1) % gpus.size()], kP2pRead, nullptr),
                  kErrorInvalidArgument);
      }
      EXPECT_EQ(fn(gpus[i], bogus, kP2pRead, &s), kErrorInvalidArgument);
    }
  };
  // NVLink: a GPU without links answers NOT_SUPPORTED; past its links, 2.
  auto link_check = [](const std::string& name,
                       std::function<Return(const Fake&, DeviceHandle, unsigned)> call) -> Check {
    return [=](const Fake& f, const json& node, const Handles& gpus, DeviceHandle bogus) {
      for (size_t i = 0; i < gpus.size(); ++i) {
        const json& g = node["gpus"][i];
        if (!g.contains("nvlinks")) {
          EXPECT_EQ(call(f, gpus[i], 0), kErrorNotSupported) << name;
          continue;
        }
        const unsigned n = static_cast<unsigned>(LinkCount(g));
        for (unsigned l = 0; l < n; ++l) {
          Return r = call(f, gpus[i], l);
          EXPECT_TRUE(r == kSuccess || r == kErrorNotSupported) << name << " " << r;
        }
        EXPECT_EQ(call(f, gpus[i], n), kErrorInvalidArgument) << name;
      }
      EXPECT_EQ(call(f, bogus, 0), kErrorInvalidArgument) << name;
    };
  };
  c["nvmlDeviceGetNvLinkState"] =
      link_check("nvmlDeviceGetNvLinkState", [](const Fake& f, DeviceHandle d, unsigned l) {
        int v = 0;
        return f.Fn<Return (*)(DeviceHandle, unsigned, int*)>("nvmlDeviceGetNvLinkState")(d, l, &v);
      });
  c["nvmlDeviceGetNvLinkRemotePciInfo_v2"] = link_check(
      "nvmlDeviceGetNvLinkRemotePciInfo_v2", [](const Fake& f, DeviceHandle d, unsigned l) {
        PciInfo p{};
        return f.Fn<Return (*)(DeviceHandle, unsigned, PciInfo*)>(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2")(d, l, &p);
      });
  c["nvmlDeviceGetNvLinkRemotePciInfo"] =
      link_check("nvmlDeviceGetNvLinkRemotePciInfo", [](const Fake& f, DeviceHandle d, unsigned l) {
        PciInfo p{};
        std::memset(p.bus_id, 'x', sizeof p.bus_id);
        Return r = f.Fn<Return (*)(DeviceHandle, unsigned, PciInfo*)>(
            "nvmlDeviceGetNvLinkRemotePciInfo")(d, l, &p);
        if (r == kSuccess) {
          EXPECT_TRUE(CanonicalBusId(p.bus_id_legacy).has_value()) << p.bus_id_legacy;
          EXPECT_EQ(p.bus_id[0], 'x');
        }
        return r;
      });
  c["nvmlDeviceGetNvLinkRemoteDeviceType"] = link_check(
      "nvmlDeviceGetNvLinkRemoteDeviceType", [](const Fake& f, DeviceHandle d, unsigned l) {
        int t = 0;
        return f.Fn<Return (*)(DeviceHandle, unsigned, int*)>(
            "nvmlDeviceGetNvLinkRemoteDeviceType")(d, l, &t);
      });
  c["nvmlDeviceGetNvLinkCapability"] = [link_check](const Fake& f, const json& node,
                                                    const Handles& gpus, DeviceHandle bogus) {
    auto fn =
        f.Fn<Return (*)(DeviceHandle, unsigned, int, unsigned*)>("nvmlDeviceGetNvLinkCapability");
    link_check("nvmlDeviceGetNvLinkCapability", [fn](const Fake&, DeviceHandle d, unsigned l) {
      unsigned v = 7;
      Return r = fn(d, l, kNvLinkCapValid, &v);
      if (r == kSuccess) {
        EXPECT_EQ(v, 1u);
      }
      return r;
    })(f, node, gpus, bogus);
    for (size_t i = 0; i < gpus.size(); ++i) {
      if (!node["gpus"][i].contains("nvlinks") || LinkCount(node["gpus"][i]) == 0) continue;
      unsigned v = 0;
      EXPECT_EQ(fn(gpus[i], 0, 6, &v), kErrorInvalidArgument);
      EXPECT_EQ(fn(gpus[i], 0, kNvLinkCapP2pSupported, nullptr), kErrorInvalidArgument);
    }
  };
  // MIG: disabled on MIG-capable GPUs (A100, H100), not supported elsewhere.
  c["nvmlDeviceGetMigMode"] = [](const Fake& f, const json& node, const Handles& gpus,
                                 DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, unsigned*, unsigned*)>("nvmlDeviceGetMigMode");
    for (size_t i = 0; i < gpus.size(); ++i) {
      unsigned cur = 9, pending = 9;
      if (!MigCapableCc(node["gpus"][i])) {
        EXPECT_EQ(fn(gpus[i], &cur, &pending), kErrorNotSupported);
        continue;
      }
      ASSERT_EQ(fn(gpus[i], &cur, &pending), kSuccess);
      EXPECT_EQ(cur, kMigDisabled);
      EXPECT_EQ(pending, kMigDisabled);
      EXPECT_EQ(fn(gpus[i], &cur, nullptr), kErrorInvalidArgument);
    }
    unsigned cur = 0, pending = 0;
    EXPECT_EQ(fn(bogus, &cur, &pending), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetMaxMigDeviceCount"] = UnsignedCheck(
      "nvmlDeviceGetMaxMigDeviceCount",
      [](const json& g) { return MigCapableCc(g) ? std::optional<unsigned>(0) : std::nullopt; });
  c["nvmlDeviceIsMigDeviceHandle"] = UnsignedCheck(
      "nvmlDeviceIsMigDeviceHandle", [](const json&) { return std::optional<unsigned>(0); });
  c["nvmlDeviceGetMigDeviceHandleByIndex"] = [](const Fake& f, const json& node,
                                                const Handles& gpus, DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, unsigned, DeviceHandle*)>(
        "nvmlDeviceGetMigDeviceHandleByIndex");
    DeviceHandle h = nullptr;
    for (size_t i = 0; i < gpus.size(); ++i) {
      const bool capable = MigCapableCc(node["gpus"][i]);
      EXPECT_EQ(fn(gpus[i], 0, &h), capable ? kErrorNotFound : kErrorNotSupported);
      if (capable) {
        EXPECT_EQ(fn(gpus[i], 0, nullptr), kErrorInvalidArgument);
      }
    }
    EXPECT_EQ(fn(bogus, 0, &h), kErrorInvalidArgument);
  };
  c["nvmlDeviceGetDeviceHandleFromMigDeviceHandle"] = [](const Fake& f, const json&,
                                                         const Handles& gpus, DeviceHandle bogus) {
    auto fn = f.Fn<Return (*)(DeviceHandle, DeviceHandle*)>(
        "nvmlDeviceGetDeviceHandleFromMigDeviceHandle");
    DeviceHandle h = nullptr;
    for (DeviceHandle g : gpus) EXPECT_EQ(fn(g, &h), kErrorInvalidArgument);
    EXPECT_EQ(fn(bogus, &h), kErrorInvalidArgument);
  };
  // Events: a set, a registration, a wait that times out (no events file).
  auto events = [](const Fake& f, const json&, const Handles& gpus, DeviceHandle bogus) {
    auto create = f.Fn<Return (*)(EventSetHandle*)>("nvmlEventSetCreate");
    auto supported =
        f.Fn<Return (*)(DeviceHandle, unsigned long long*)>("nvmlDeviceGetSupportedEventTypes");
    auto reg = f.Fn<Return (*)(DeviceHandle, unsigned long long, EventSetHandle)>(
        "nvmlDeviceRegisterEvents");
    auto wait1 = f.Fn<Return (*)(EventSetHandle, EventData*, unsigned)>("nvmlEventSetWait");
    auto wait2 = f.Fn<Return (*)(EventSetHandle, EventData*, unsigned)>("nvmlEventSetWait_v2");
    auto free_set = f.Fn<Return (*)(EventSetHandle)>("nvmlEventSetFree");
    EventSetHandle set = nullptr;
    ASSERT_EQ(create(&set), kSuccess);
    EXPECT_EQ(create(nullptr), kErrorInvalidArgument);
    for (DeviceHandle g : gpus) {
      unsigned long long types = 0;
      ASSERT_EQ(supported(g, &types), kSuccess);
      EXPECT_NE(types & kEventTypeXidCriticalError, 0u);
      EXPECT_EQ(supported(g, nullptr), kErrorInvalidArgument);
      EXPECT_EQ(reg(g, kEventTypeXidCriticalError, set), kSuccess);
      EXPECT_EQ(reg(g, kEventTypeXidCriticalError, nullptr), kErrorInvalidArgument);
    }
    unsigned long long types = 0;
    EXPECT_EQ(supported(bogus, &types), kErrorInvalidArgument);
    EXPECT_EQ(reg(bogus, kEventTypeXidCriticalError, set), kErrorInvalidArgument);
    EventData data{};
    EXPECT_EQ(wait1(set, &data, 0), kErrorTimeout);
    EXPECT_EQ(wait2(set, &data, 1), kErrorTimeout);
    EXPECT_EQ(wait2(set, nullptr, 0), kErrorInvalidArgument);
    EXPECT_EQ(wait2(nullptr, &data, 0), kErrorInvalidArgument);
    // A made-up set is refused, never dereferenced; so is a freed one.
    const auto fake_set = reinterpret_cast<EventSetHandle>(&data);
    EXPECT_EQ(reg(gpus[0], kEventTypeXidCriticalError, fake_set), kErrorInvalidArgument);
    EXPECT_EQ(wait2(fake_set, &data, 0), kErrorInvalidArgument);
    EXPECT_EQ(free_set(fake_set), kErrorInvalidArgument);
    EXPECT_EQ(free_set(set), kSuccess);
    EXPECT_EQ(free_set(set), kErrorInvalidArgument);
    EXPECT_EQ(wait1(set, &data, 0), kErrorInvalidArgument);
    EXPECT_EQ(free_set(nullptr), kErrorInvalidArgument);
  };
  for (const char* n :
       {"nvmlEventSetCreate", "nvmlDeviceGetSupportedEventTypes", "nvmlDeviceRegisterEvents",
        "nvmlEventSetWait", "nvmlEventSetWait_v2", "nvmlEventSetFree"}) {
    c[n] = events;
  }
  return c;
}

class FakeNvmlEveryFunctionTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FakeNvmlEveryFunctionTest, AnswersNvmlCodesAndTheDescription) {
  UseNode(GetParam());
  const json node = json::parse(std::ifstream(GetParam()));
  Fake f;
  const std::map<std::string, std::string> list = SymbolList();
  int x = 0;
  const auto bogus = reinterpret_cast<DeviceHandle>(&x);
  using DeviceFn = Return (*)(DeviceHandle);
  using NoArgFn = Return (*)();
  // Before nvmlInit every function without data answers UNINITIALIZED.
  for (const auto& [name, kind] : list) {
    if (f.Symbol(name) == nullptr) continue;
    if (kind == "device") {
      EXPECT_EQ(f.Fn<DeviceFn>(name)(bogus), kErrorUninitialized) << name;
    } else if (kind != "impl") {
      EXPECT_EQ(f.Fn<NoArgFn>(name)(), kErrorUninitialized) << name;
    }
  }
  ASSERT_EQ(f.Fn<NoArgFn>("nvmlInit")(), kSuccess);
  ASSERT_EQ(f.Fn<NoArgFn>("nvmlInit_v2")(), kSuccess);
  Handles gpus;
  auto by_index = f.Fn<Return (*)(unsigned, DeviceHandle*)>("nvmlDeviceGetHandleByIndex_v2");
  for (unsigned i = 0; i < node["gpus"].size(); ++i) {
    DeviceHandle h = nullptr;
    ASSERT_EQ(by_index(i, &h), kSuccess);
    gpus.push_back(h);
  }
  const std::map<std::string, Check> checks = Checks();
  for (const auto& [name, kind] : list) {
    SCOPED_TRACE(name);
    if (f.Symbol(name) == nullptr) continue;  // failed above; never call a null pointer
    if (kind == "impl") {
      auto it = checks.find(name);
      ASSERT_NE(it, checks.end()) << name << " is implemented but has no check";
      it->second(f, node, gpus, bogus);
    } else if (kind == "device") {
      for (DeviceHandle g : gpus) EXPECT_EQ(f.Fn<DeviceFn>(name)(g), kErrorNotSupported);
      EXPECT_EQ(f.Fn<DeviceFn>(name)(bogus), kErrorInvalidArgument);
      EXPECT_EQ(f.Fn<DeviceFn>(name)(nullptr), kErrorInvalidArgument);
    } else {
      Return r = f.Fn<NoArgFn>(name)();
      EXPECT_TRUE(IsNvmlCode(r)) << r;
      EXPECT_EQ(r, kind == "other" ? kErrorNotSupported : kErrorInvalidArgument);
    }
  }
  for (const auto& [name, check] : checks) {
    EXPECT_EQ(list.count(name), 1u) << name << " has a check but is not listed";
  }
  EXPECT_EQ(f.Fn<NoArgFn>("nvmlShutdown")(), kSuccess);
  EXPECT_EQ(f.Fn<NoArgFn>("nvmlShutdown")(), kSuccess);
  EXPECT_EQ(f.Fn<NoArgFn>("nvmlShutdown")(), kErrorUninitialized);
}

INSTANTIATE_TEST_SUITE_P(Presets, FakeNvmlEveryFunctionTest, ::testing::ValuesIn(NodeFiles()),
                         [](const ::testing::TestParamInfo<std::string>& p) {
                           std::string name = std::filesystem::path(p.param).stem().string();
                           for (char& ch : name) {
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return name;
                         });

}  // namespace
}  // namespace kdm::nvml
