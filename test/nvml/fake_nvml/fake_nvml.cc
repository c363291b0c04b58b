// The fake libnvidia-ml.so.1: the C functions kdm calls (nvml/nvml_api.h) and
// every other NVML function NVIDIA's k8s-device-plugin binds
// (exported_symbols.txt), answering from a JSON node description instead of a
// GPU, and NVML_ERROR_NOT_SUPPORTED where the description has no data. Built
// into the build tree only (never installed); docs/nvml.md, "The fake NVML",
// describes the description, the answers, the failure switches and the event
// channel.
//
//   KDM_FAKE_NVML_NODE           the node description (read by nvmlInit_v2)
//   KDM_FAKE_NVML_EVENTS         a file of event lines read by nvmlEventSetWait_v2
//   KDM_FAKE_NVML_REPLAY_EVENTS  1: a set also receives the lines written
//                                before its registration (a test switch)
//
// A description that cannot be read or is wrong makes nvmlInit_v2 answer
// NVML_ERROR_UNKNOWN, and nvmlErrorString of it names the file and the JSON
// path at fault, so the caller prints a clear error instead of crashing.
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fake_nvml_api.h"
#include "kdm/base/sync.h"
#include "kdm/nvml/discovery.h"
#include "kdm/nvml/nvml_api.h"
#include "kdm/nvml/topology_from_nvml.h"

namespace {

using json = nlohmann::json;
using namespace kdm::nvml;  // NOLINT: the fake speaks NVML's names

constexpr const char* kNodeEnv = "KDM_FAKE_NVML_NODE";
constexpr const char* kEventsEnv = "KDM_FAKE_NVML_EVENTS";
constexpr std::uintmax_t kMaxDescriptionBytes = 16 << 20;
constexpr unsigned long long kAllEvents =
    kEventTypeSingleBitEccError | kEventTypeDoubleBitEccError | kEventTypeXidCriticalError;

constexpr const char* kReplayEnv = "KDM_FAKE_NVML_REPLAY_EVENTS";
constexpr size_t kClockTypes = 4;  // NVML_CLOCK_GRAPHICS, _SM, _MEM, _VIDEO
constexpr const char* kClockNames[kClockTypes] = {"graphics", "sm", "memory", "video"};
constexpr const char* kPcieLinkNames[4] = {"max_gen", "max_width", "gen", "width"};
constexpr unsigned kSerialBufferSize = 30;  // NVML_DEVICE_SERIAL_BUFFER_SIZE

struct FakeLink {
  bool enabled = true;
  int type = kNvLinkDeviceTypeGpu;
  std::string remote_bus_id;  // NVML's spelling
};

struct FakeGpu {
  std::string uuid;
  std::string name;
  unsigned minor = 0;
  unsigned long long memory_bytes = 0;
  int cc_major = 0;
  int cc_minor = 0;
  int brand = 0;
  PciInfo pci{};
  bool has_nvlink = false;
  std::vector<FakeLink> links;
  unsigned long long supported_events = kAllEvents;
  std::map<std::string, int> fail;
  std::atomic<bool> lost{false};
  // Optional data: a query whose datum the description lacks answers
  // NVML_ERROR_NOT_SUPPORTED, as NVML does on hardware without the sensor.
  std::optional<std::string> serial;
  std::optional<unsigned> power_limit_mw;
  std::optional<unsigned> power_usage_mw;
  std::optional<unsigned long long> bar1_bytes;
  // max_gen, max_width, gen, width
  std::array<std::optional<unsigned>, 4> pcie_link;
  // by nvmlClockType_t: graphics, sm, memory, video
  std::array<std::optional<unsigned>, kClockTypes> clocks_mhz;
  std::array<std::optional<unsigned>, kClockTypes> max_clocks_mhz;
};

struct FakeNode {
  std::string driver_version;
  int cuda_driver_version = 0;
  std::map<std::string, int> fail;
  std::vector<std::unique_ptr<FakeGpu>> gpus;
  // levels[i][j]; kErrorNotSupported answered where the description has "-".
  std::vector<std::vector<int>> levels;
};

constexpr int kLevelNotSupported = -1;

struct Registration {
  unsigned long long types = 0;
  // Lines starting before this offset of the events file happened before
  // the registration: never delivered (0 under KDM_FAKE_NVML_REPLAY_EVENTS).
  std::uintmax_t from = 0;
};

struct EventSet {
  std::map<FakeGpu*, Registration> registered;
  std::uintmax_t offset = 0;  // of the events file, consumed up to here
};

kdm::Mutex g_mu;
int g_init_count ABSL_GUARDED_BY(g_mu) = 0;
std::unique_ptr<FakeNode> g_node ABSL_GUARDED_BY(g_mu);
// The last load error, for nvmlErrorString(NVML_ERROR_UNKNOWN). An object,
// not a leaked pointer: dlclose would leave a heap string unreachable, which
// LeakSanitizer reports. The text handed out stays valid until the next
// failed nvmlInit_v2 or the library's unloading; callers copy it at once.
std::string g_load_error ABSL_GUARDED_BY(g_mu);
// The live event sets, owned here (freed at unloading too): a handle that is
// not one of them answers NVML_ERROR_INVALID_ARGUMENT instead of being
// dereferenced, so a freed or made-up set cannot crash the caller.
std::map<EventSetHandle, std::unique_ptr<EventSet>> g_sets ABSL_GUARDED_BY(g_mu);

EventSet* FindSet(EventSetHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  auto it = g_sets.find(handle);
  return it == g_sets.end() ? nullptr : it->second.get();
}

// --- the description ----------------------------------------------------

struct BadDescription {
  std::string message;
};

[[noreturn]] void Bad(const std::string& path, const std::string& what) {
  throw BadDescription{path + ": " + what};
}

std::string TypeName(const json& j) { return j.type_name(); }

const json& Field(const json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end()) Bad(path, std::string("missing \"") + key + "\"");
  return *it;
}

void CheckKeys(const json& obj, const std::string& path, std::set<std::string> known) {
  if (!obj.is_object()) Bad(path, "expected an object, got " + TypeName(obj));
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!known.count(it.key())) Bad(path, "unknown key \"" + it.key() + "\"");
  }
}

std::string String(const json& j, const std::string& path, size_t max = 4096) {
  if (!j.is_string()) Bad(path, "expected a string, got " + TypeName(j));
  std::string s = j.get<std::string>();
  if (s.size() > max) Bad(path, "longer than " + std::to_string(max) + " bytes");
  return s;
}

long long Integer(const json& j, const std::string& path, long long lo, long long hi) {
  if (!j.is_number_integer()) Bad(path, "expected an integer, got " + TypeName(j));
  if (j.is_number_unsigned() && j.get<unsigned long long>() > static_cast<unsigned long long>(hi)) {
    Bad(path, std::to_string(j.get<unsigned long long>()) + " is out of range [" +
                  std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  long long v = j.get<long long>();
  if (v < lo || v > hi) {
    Bad(path, std::to_string(v) + " is out of range [" + std::to_string(lo) + ", " +
                  std::to_string(hi) + "]");
  }
  return v;
}

std::map<std::string, int> Failures(const json& j, const std::string& path,
                                    const std::set<std::string>& known) {
  CheckKeys(j, path, known);
  std::map<std::string, int> out;
  for (auto it = j.begin(); it != j.end(); ++it) {
    out[it.key()] = static_cast<int>(Integer(*it, path + "." + it.key(), 1, 999));
  }
  return out;
}

void FillPci(const std::string& bus_id, const std::string& path, PciInfo& pci) {
  auto canonical = CanonicalBusId(bus_id);
  if (!canonical) Bad(path, "'" + bus_id + "' is not a PCI bus id (dddd:bb:dd.f)");
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  std::sscanf(canonical->c_str(), "%x:%x:%x.%x", &domain, &bus, &device, &function);
  pci = PciInfo{};
  pci.domain = domain;
  pci.bus = bus;
  pci.device = device;
  pci.pci_device_id = 0x233010de;
  std::snprintf(pci.bus_id, sizeof pci.bus_id, "%08X:%02X:%02X.%X", domain, bus, device, function);
  std::snprintf(pci.bus_id_legacy, sizeof pci.bus_id_legacy, "%04X:%02X:%02X.%X", domain, bus,
                device, function);
}

int LevelFromName(const json& cell, const std::string& path) {
  std::string name = String(cell, path, 16);
  if (name == "-") return kLevelNotSupported;
  static const std::map<std::string, int> kLevels = {
      {"PSB", kTopologyInternal},   {"PIX", kTopologySingle}, {"PXB", kTopologyMultiple},
      {"PHB", kTopologyHostBridge}, {"NODE", kTopologyNode},  {"SYS", kTopologySystem}};
  auto it = kLevels.find(name);
  if (it == kLevels.end()) Bad(path, "'" + name + "' is not one of PSB PIX PXB PHB NODE SYS -");
  return it->second;
}

// An optional unsigned field of `obj`, in [0, hi].
std::optional<unsigned long long> OptionalUnsigned(const json& obj, const std::string& path,
                                                   const char* key, long long hi) {
  if (!obj.contains(key)) return std::nullopt;
  return static_cast<unsigned long long>(Integer(obj[key], path + "." + key, 0, hi));
}

// A {"name": n, ...} object of optional unsigned values, in the order of `names`.
template <size_t N>
void OptionalTable(const json& g, const std::string& path, const char* key,
                   const char* const (&names)[N], std::array<std::optional<unsigned>, N>& out) {
  if (!g.contains(key)) return;
  const std::string p = path + "." + key;
  std::set<std::string> known(std::begin(names), std::end(names));
  CheckKeys(g[key], p, known);
  for (size_t i = 0; i < N; ++i) {
    if (auto v = OptionalUnsigned(g[key], p, names[i], 1 << 20)) out[i] = static_cast<unsigned>(*v);
  }
}

void ParseOptionalData(const json& g, const std::string& p, FakeGpu& gpu) {
  if (g.contains("serial")) {
    gpu.serial = String(g["serial"], p + ".serial", kSerialBufferSize - 1);
  }
  if (auto v = OptionalUnsigned(g, p, "power_limit_mw", 1 << 24)) gpu.power_limit_mw = *v;
  if (auto v = OptionalUnsigned(g, p, "power_usage_mw", 1 << 24)) gpu.power_usage_mw = *v;
  if (auto v = OptionalUnsigned(g, p, "bar1_mib", 1LL << 40)) gpu.bar1_bytes = *v * 1024 * 1024;
  OptionalTable(g, p, "pcie_link", kPcieLinkNames, gpu.pcie_link);
  OptionalTable(g, p, "clocks_mhz", kClockNames, gpu.clocks_mhz);
  OptionalTable(g, p, "max_clocks_mhz", kClockNames, gpu.max_clocks_mhz);
}

std::unique_ptr<FakeNode> ParseNode(const json& doc) {
  auto node = std::make_unique<FakeNode>();
  CheckKeys(doc, "$", {"driver_version", "cuda_driver_version", "fail", "gpus", "pcie", "comment"});
  node->driver_version = String(Field(doc, "$", "driver_version"), "$.driver_version", 79);
  node->cuda_driver_version = static_cast<int>(
      Integer(Field(doc, "$", "cuda_driver_version"), "$.cuda_driver_version", 0, 1000000));
  if (doc.contains("fail")) {
    node->fail = Failures(doc["fail"], "$.fail",
                          {"init", "driver_version", "cuda_v2", "cuda", "count", "event_set"});
  }
  const json& gpus = Field(doc, "$", "gpus");
  if (!gpus.is_array()) Bad("$.gpus", "expected an array, got " + TypeName(gpus));
  if (gpus.size() > 1024) Bad("$.gpus", "more than 1024 GPUs");
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string p = "$.gpus[" + std::to_string(i) + "]";
    const json& g = gpus[i];
    CheckKeys(
        g, p,
        {"uuid", "name", "minor", "memory_mib", "pci_bus_id", "numa", "cpus", "compute_capability",
         "brand", "nvlinks", "supported_events", "fail", "serial", "power_limit_mw",
         "power_usage_mw", "bar1_mib", "pcie_link", "clocks_mhz", "max_clocks_mhz"});
    auto gpu = std::make_unique<FakeGpu>();
    gpu->uuid = String(Field(g, p, "uuid"), p + ".uuid");
    if (gpu->uuid.empty()) Bad(p + ".uuid", "empty");
    gpu->name = String(Field(g, p, "name"), p + ".name");
    gpu->minor = static_cast<unsigned>(Integer(Field(g, p, "minor"), p + ".minor", 0, 1 << 20));
    gpu->memory_bytes = static_cast<unsigned long long>(
                            Integer(Field(g, p, "memory_mib"), p + ".memory_mib", 0, 1LL << 40)) *
                        1024 * 1024;
    FillPci(String(Field(g, p, "pci_bus_id"), p + ".pci_bus_id", 64), p + ".pci_bus_id", gpu->pci);
    if (g.contains("numa") && !g["numa"].is_null()) Integer(g["numa"], p + ".numa", -1, 1 << 16);
    if (g.contains("cpus")) String(g["cpus"], p + ".cpus");
    std::string cc = String(Field(g, p, "compute_capability"), p + ".compute_capability", 16);
    int consumed = 0;
    if (std::sscanf(cc.c_str(), "%d.%d%n", &gpu->cc_major, &gpu->cc_minor, &consumed) != 2 ||
        consumed != static_cast<int>(cc.size()) || gpu->cc_major < 0 || gpu->cc_minor < 0) {
      Bad(p + ".compute_capability", "'" + cc + "' is not MAJOR.MINOR");
    }
    if (g.contains("brand")) {
      std::string brand = String(g["brand"], p + ".brand", 32);
      auto b = BrandFromName(brand);
      if (!b) Bad(p + ".brand", "unknown brand '" + brand + "'");
      gpu->brand = *b;
    } else {
      gpu->brand = *BrandFromName("nvidia");
    }
    ParseOptionalData(g, p, *gpu);
    if (g.contains("supported_events")) {
      const json& ev = g["supported_events"];
      if (!ev.is_array()) Bad(p + ".supported_events", "expected an array, got " + TypeName(ev));
      gpu->supported_events = 0;
      for (size_t e = 0; e < ev.size(); ++e) {
        std::string name = String(ev[e], p + ".supported_events[" + std::to_string(e) + "]", 32);
        if (name == "xid") {
          gpu->supported_events |= kEventTypeXidCriticalError;
        } else if (name == "ecc_single") {
          gpu->supported_events |= kEventTypeSingleBitEccError;
        } else if (name == "ecc_double") {
          gpu->supported_events |= kEventTypeDoubleBitEccError;
        } else {
          Bad(p + ".supported_events[" + std::to_string(e) + "]",
              "'" + name + "' is not xid, ecc_single or ecc_double");
        }
      }
    }
    if (g.contains("fail")) {
      gpu->fail =
          Failures(g["fail"], p + ".fail",
                   {"handle", "uuid", "name", "minor", "memory", "compute_capability", "brand",
                    "pci", "nvlink_state", "nvlink_remote", "ancestor", "supported_events",
                    "register_events", "serial", "power", "pcie_link", "clocks", "mig"});
    }
    node->gpus.push_back(std::move(gpu));
  }
  // NVLinks, once every GPU's bus id is known.
  for (size_t i = 0; i < gpus.size(); ++i) {
    const std::string p = "$.gpus[" + std::to_string(i) + "].nvlinks";
    FakeGpu& gpu = *node->gpus[i];
    if (!gpus[i].contains("nvlinks")) continue;
    const json& links = gpus[i]["nvlinks"];
    if (!links.is_array()) Bad(p, "expected an array, got " + TypeName(links));
    gpu.has_nvlink = true;
    for (size_t l = 0; l < links.size(); ++l) {
      const std::string lp = p + "[" + std::to_string(l) + "]";
      const json& e = links[l];
      CheckKeys(e, lp, {"gpu", "switch", "remote_bus_id", "type", "disabled", "count"});
      FakeLink link;
      if (e.contains("disabled")) {
        link.enabled = false;
        int n = static_cast<int>(Integer(e["disabled"], lp + ".disabled", 0, kMaxNvLinks));
        if (e.size() != 1) Bad(lp, "\"disabled\" takes no other key");
        for (int k = 0; k < n; ++k) gpu.links.push_back(link);
        continue;
      }
      int count = static_cast<int>(Integer(Field(e, lp, "count"), lp + ".count", 0, kMaxNvLinks));
      int targets = e.contains("gpu") + e.contains("switch") + e.contains("remote_bus_id");
      if (targets != 1) Bad(lp, "give exactly one of \"gpu\", \"switch\", \"remote_bus_id\"");
      if (e.contains("gpu")) {
        const json& t = e["gpu"];
        const FakeGpu* remote = nullptr;
        if (t.is_string()) {
          for (const auto& other : node->gpus) {
            if (other->uuid == t.get<std::string>()) remote = other.get();
          }
          if (remote == nullptr) Bad(lp + ".gpu", "no GPU has uuid '" + t.get<std::string>() + "'");
        } else {
          remote =
              node->gpus[Integer(t, lp + ".gpu", 0, static_cast<long long>(node->gpus.size()) - 1)]
                  .get();
        }
        link.type = kNvLinkDeviceTypeGpu;
        link.remote_bus_id = remote->pci.bus_id;
      } else if (e.contains("switch")) {
        link.type = kNvLinkDeviceTypeSwitch;
        PciInfo pci;
        FillPci(String(e["switch"], lp + ".switch", 64), lp + ".switch", pci);
        link.remote_bus_id = pci.bus_id;
      } else {
        PciInfo pci;
        FillPci(String(e["remote_bus_id"], lp + ".remote_bus_id", 64), lp + ".remote_bus_id", pci);
        link.remote_bus_id = pci.bus_id;
        link.type = e.contains("type") ? static_cast<int>(Integer(e["type"], lp + ".type", 0, 255))
                                       : kNvLinkDeviceTypeGpu;
      }
      for (int k = 0; k < count; ++k) gpu.links.push_back(link);
    }
    if (gpu.links.size() > kMaxNvLinks) {
      Bad(p, std::to_string(gpu.links.size()) + " links, more than " + std::to_string(kMaxNvLinks));
    }
  }
  const size_t n = node->gpus.size();
  node->levels.assign(n, std::vector<int>(n, kTopologySystem));
  if (doc.contains("pcie")) {
    const json& m = doc["pcie"];
    if (!m.is_array() || m.size() != n) {
      Bad("$.pcie", "expected an array of " + std::to_string(n) + " rows");
    }
    for (size_t i = 0; i < n; ++i) {
      const std::string rp = "$.pcie[" + std::to_string(i) + "]";
      if (!m[i].is_array() || m[i].size() != n) {
        Bad(rp, "expected an array of " + std::to_string(n) + " cells");
      }
      for (size_t j = 0; j < n; ++j) {
        const std::string cp = rp + "[" + std::to_string(j) + "]";
        if (i == j) {
          if (String(m[i][j], cp, 16) != "X") Bad(cp, "the diagonal must be \"X\"");
          continue;
        }
        node->levels[i][j] = LevelFromName(m[i][j], cp);
      }
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (node->levels[i][j] != node->levels[j][i]) {
          Bad("$.pcie[" + std::to_string(i) + "][" + std::to_string(j) + "]",
              "differs from $.pcie[" + std::to_string(j) + "][" + std::to_string(i) + "]");
        }
      }
    }
  }
  return node;
}

std::unique_ptr<FakeNode> LoadNode(std::string* error) {
  const char* path = std::getenv(kNodeEnv);
  if (path == nullptr || *path == '\0') {
    *error = std::string("fake NVML: ") + kNodeEnv + " is not set";
    return nullptr;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    *error = std::string("fake NVML: cannot open ") + path + ": " + std::strerror(errno);
    return nullptr;
  }
  std::string text;
  std::ostringstream buffer;
  buffer << in.rdbuf();
  text = buffer.str();
  if (text.size() > kMaxDescriptionBytes) {
    *error = std::string("fake NVML: ") + path + ": larger than " +
             std::to_string(kMaxDescriptionBytes) + " bytes";
    return nullptr;
  }
  json doc;
  try {
    doc = json::parse(text);
  } catch (const json::exception& e) {
    *error = std::string("fake NVML: ") + path + ": not JSON: " + e.what();
    return nullptr;
  }
  try {
    return ParseNode(doc);
  } catch (const BadDescription& e) {
    *error = std::string("fake NVML: ") + path + ": " + e.message;
  } catch (const json::exception& e) {
    *error = std::string("fake NVML: ") + path + ": " + e.what();
  }
  return nullptr;
}

// --- state -----------------------------------------------------------------

// The GPU a handle names, or nullptr.
FakeGpu* Gpu(DeviceHandle handle) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (g_node == nullptr) return nullptr;
  for (const auto& gpu : g_node->gpus) {
    if (reinterpret_cast<DeviceHandle>(gpu.get()) == handle) return gpu.get();
  }
  return nullptr;
}

int NodeFail(const char* what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  auto it = g_node->fail.find(what);
  return it == g_node->fail.end() ? kSuccess : it->second;
}

int GpuFail(const FakeGpu& gpu, const char* what) {
  if (gpu.lost.load()) return kErrorGpuIsLost;
  auto it = gpu.fail.find(what);
  return it == gpu.fail.end() ? kSuccess : it->second;
}

// Looks up the GPU of `handle` and checks its failure switch `what`; on
// success *out is the GPU.
int Enter(DeviceHandle handle, const char* what, FakeGpu** out)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (g_node == nullptr) return kErrorUninitialized;
  FakeGpu* gpu = Gpu(handle);
  if (gpu == nullptr) return kErrorInvalidArgument;
  if (int r = GpuFail(*gpu, what); r != kSuccess) return r;
  *out = gpu;
  return kSuccess;
}

// The GPU's NVML index.
unsigned IndexOf(const FakeGpu* gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  for (size_t i = 0; i < g_node->gpus.size(); ++i) {
    if (g_node->gpus[i].get() == gpu) return static_cast<unsigned>(i);
  }
  return 0;
}

// The architecture of a compute capability, as NVML names it.
unsigned ArchitectureOf(const FakeGpu& gpu) {
  switch (gpu.cc_major) {
    case 3:
      return kArchKepler;
    case 5:
      return kArchMaxwell;
    case 6:
      return kArchPascal;
    case 7:
      return gpu.cc_minor >= 5 ? kArchTuring : kArchVolta;
    case 8:
      return gpu.cc_minor == 9 ? kArchAda : kArchAmpere;
    case 9:
      return kArchHopper;
    case 10:
    case 12:
      return kArchBlackwell;
    default:
      return kArchUnknown;
  }
}

// MIG exists on GA100 (compute capability 8.0: A100, A30) and GH100 (9.0).
bool MigCapable(const FakeGpu& gpu) {
  return (gpu.cc_major == 8 && gpu.cc_minor == 0) || (gpu.cc_major == 9 && gpu.cc_minor == 0);
}

// Whether two GPUs reach each other over NVLink: an enabled link from one to
// the other, or both to the same NVSwitch.
bool NvLinked(const FakeGpu& a, const FakeGpu& b) {
  for (const FakeLink& la : a.links) {
    if (!la.enabled) continue;
    if (la.type == kNvLinkDeviceTypeGpu && la.remote_bus_id == b.pci.bus_id) return true;
    if (la.type != kNvLinkDeviceTypeSwitch) continue;
    for (const FakeLink& lb : b.links) {
      if (lb.enabled && lb.type == kNvLinkDeviceTypeSwitch &&
          lb.remote_bus_id == la.remote_bus_id) {
        return true;
      }
    }
  }
  return false;
}

int CopyString(const std::string& s, char* out, unsigned length) {
  if (out == nullptr) return kErrorInvalidArgument;
  if (s.size() + 1 > length) return kErrorInsufficientSize;
  std::memcpy(out, s.c_str(), s.size() + 1);
  return kSuccess;
}

// The events file's size now: where lines injected from now on start.
std::uintmax_t EventsFileSize() {
  const char* path = std::getenv(kEventsEnv);
  if (path == nullptr || *path == '\0') return 0;
  std::error_code ec;
  std::uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

// KDM_FAKE_NVML_REPLAY_EVENTS=1: a set also receives the lines written
// before its registration (a test switch; off by default, as NVML behaves).
bool ReplayEvents() {
  const char* v = std::getenv(kReplayEnv);
  return v != nullptr && std::string(v) == "1";
}

// One event line: "xid <uuid> <n>", "ecc <uuid>" or "lost <uuid>".
struct EventLine {
  std::string kind;
  std::string uuid;
  unsigned long long xid = 0;
};

std::optional<EventLine> ParseEventLine(const std::string& line) {
  std::istringstream in(line);
  EventLine e;
  if (!(in >> e.kind >> e.uuid)) return std::nullopt;
  if (e.kind == "xid") {
    if (!(in >> e.xid)) return std::nullopt;
  } else if (e.kind != "ecc" && e.kind != "lost") {
    return std::nullopt;
  }
  std::string rest;
  if (in >> rest) return std::nullopt;
  return e;
}

// Reads the complete lines of the events file past `set.offset` and answers
// the first that concerns the set; kErrorTimeout when none does (yet).
int NextEvent(EventSet& set, EventData* data) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  const char* path = std::getenv(kEventsEnv);
  if (path == nullptr || *path == '\0') return kErrorTimeout;
  std::ifstream in(path, std::ios::binary);
  if (!in) return kErrorTimeout;
  in.seekg(static_cast<std::streamoff>(set.offset));
  std::string line;
  while (std::getline(in, line)) {
    if (in.eof()) break;  // no newline yet: a line still being written
    const std::uintmax_t start = set.offset;
    set.offset += line.size() + 1;
    if (line.empty() || line[0] == '#') continue;
    auto e = ParseEventLine(line);
    if (!e) {
      std::fprintf(stderr, "fake NVML: %s: ignoring event line '%s'\n", path, line.c_str());
      continue;
    }
    FakeGpu* gpu = nullptr;
    for (const auto& g : g_node->gpus) {
      if (g->uuid == e->uuid) gpu = g.get();
    }
    if (gpu == nullptr) {
      std::fprintf(stderr, "fake NVML: %s: no GPU has uuid '%s'\n", path, e->uuid.c_str());
      continue;
    }
    auto reg = set.registered.find(gpu);
    // Real NVML delivers only what happens after the registration.
    const bool after = reg != set.registered.end() && start >= reg->second.from;
    if (e->kind == "lost") {
      gpu->lost = true;
      if (after) return kErrorGpuIsLost;
      continue;
    }
    unsigned long long type =
        e->kind == "xid" ? kEventTypeXidCriticalError : kEventTypeDoubleBitEccError;
    if (!after || (reg->second.types & type) == 0) continue;
    *data = EventData{};
    data->device = reinterpret_cast<DeviceHandle>(gpu);
    data->event_type = type;
    data->event_data = e->kind == "xid" ? e->xid : 0;
    data->gpu_instance_id = kNoInstanceId;
    data->compute_instance_id = kNoInstanceId;
    return kSuccess;
  }
  return kErrorTimeout;
}

// One optional unsigned datum of a GPU: NOT_SUPPORTED where the
// description has none.
Return AnswerOptional(DeviceHandle device, const char* what,
                      std::optional<unsigned> FakeGpu::*field, unsigned* out) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, what, &gpu); r != kSuccess) return r;
  if (out == nullptr) return kErrorInvalidArgument;
  if (!(gpu->*field)) return kErrorNotSupported;
  *out = *(gpu->*field);
  return kSuccess;
}

// One cell of an optional table (PCIe link, clocks).
template <size_t N>
Return AnswerTable(DeviceHandle device, const char* what,
                   std::array<std::optional<unsigned>, N> FakeGpu::*table, unsigned i,
                   unsigned* out) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, what, &gpu); r != kSuccess) return r;
  if (out == nullptr || i >= N) return kErrorInvalidArgument;
  const std::optional<unsigned>& v = (gpu->*table)[i];
  if (!v) return kErrorNotSupported;
  *out = *v;
  return kSuccess;
}

}  // namespace

// --- the C functions ---------------------------------------------------------

extern "C" {

__attribute__((visibility("default"))) Return nvmlInit_v2() {
  kdm::MutexLock lock(&g_mu);
  if (g_init_count > 0) {
    ++g_init_count;
    return kSuccess;
  }
  std::string error;
  std::unique_ptr<FakeNode> node = LoadNode(&error);
  if (node == nullptr) {
    g_load_error = error;
    return kErrorUnknown;
  }
  auto it = node->fail.find("init");
  if (it != node->fail.end()) return it->second;
  g_node = std::move(node);
  ++g_init_count;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlShutdown() {
  kdm::MutexLock lock(&g_mu);
  if (g_init_count == 0) return kErrorUninitialized;
  if (--g_init_count == 0) g_node.reset();
  return kSuccess;
}

__attribute__((visibility("default"))) const char* nvmlErrorString(Return ret) {
  switch (ret) {
    case kSuccess:
      return "Success";
    case kErrorUninitialized:
      return "Uninitialized";
    case kErrorInvalidArgument:
      return "Invalid Argument";
    case kErrorNotSupported:
      return "Not Supported";
    case kErrorNoPermission:
      return "Insufficient Permissions";
    case kErrorAlreadyInitialized:
      return "Already Initialized";
    case kErrorNotFound:
      return "Not Found";
    case kErrorInsufficientSize:
      return "Insufficient Size";
    case kErrorInsufficientPower:
      return "Insufficient External Power";
    case kErrorDriverNotLoaded:
      return "Driver Not Loaded";
    case kErrorTimeout:
      return "Timeout";
    case kErrorIrqIssue:
      return "Interrupt request issue";
    case kErrorLibraryNotFound:
      return "NVML Shared Library Not Found";
    case kErrorFunctionNotFound:
      return "Function Not Found";
    case kErrorCorruptedInforom:
      return "Corrupted infoROM";
    case kErrorGpuIsLost:
      return "GPU is lost";
    case kErrorResetRequired:
      return "GPU requires restart";
    case kErrorOperatingSystem:
      return "The operating system has blocked the request";
    case kErrorLibRmVersionMismatch:
      return "RM has detected an NVML/RM version mismatch";
    case kErrorInUse:
      return "In use by another client";
    case kErrorMemory:
      return "Insufficient Memory";
    case kErrorNoData:
      return "No data";
    case kErrorVgpuEccNotSupported:
      return "The requested vgpu operation is not available on target device, because ECC is "
             "enabled";
    case kErrorInsufficientResources:
      return "Insufficient resources";
    case kErrorFreqNotSupported:
      return "Frequency not supported";
    case kErrorArgumentVersionMismatch:
      return "Argument version mismatch";
    case kErrorDeprecated:
      return "Deprecated";
    case kErrorNotReady:
      return "Not ready";
    case kErrorGpuNotFound:
      return "GPU not found";
    case kErrorInvalidState:
      return "Invalid state";
    case kErrorResetTypeNotSupported:
      return "Reset type not supported";
    case kErrorUnknown: {
      kdm::MutexLock lock(&g_mu);
      return g_load_error.empty() ? "Unknown Error" : g_load_error.c_str();
    }
    default:
      return "Unknown Error";
  }
}

__attribute__((visibility("default"))) Return nvmlSystemGetDriverVersion(char* version,
                                                                         unsigned length) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (int r = NodeFail("driver_version"); r != kSuccess) return r;
  return CopyString(g_node->driver_version, version, length);
}

__attribute__((visibility("default"))) Return nvmlSystemGetCudaDriverVersion(int* version) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (version == nullptr) return kErrorInvalidArgument;
  if (int r = NodeFail("cuda"); r != kSuccess) return r;
  *version = g_node->cuda_driver_version;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlSystemGetCudaDriverVersion_v2(int* version) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (version == nullptr) return kErrorInvalidArgument;
  if (int r = NodeFail("cuda_v2"); r != kSuccess) return r;
  *version = g_node->cuda_driver_version;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetCount_v2(unsigned* count) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (count == nullptr) return kErrorInvalidArgument;
  if (int r = NodeFail("count"); r != kSuccess) return r;
  *count = static_cast<unsigned>(g_node->gpus.size());
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetHandleByIndex_v2(unsigned index,
                                                                            DeviceHandle* device) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (device == nullptr || index >= g_node->gpus.size()) return kErrorInvalidArgument;
  FakeGpu& gpu = *g_node->gpus[index];
  if (int r = GpuFail(gpu, "handle"); r != kSuccess) return r;
  *device = reinterpret_cast<DeviceHandle>(&gpu);
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetUUID(DeviceHandle device, char* uuid,
                                                                unsigned length) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "uuid", &gpu); r != kSuccess) return r;
  return CopyString(gpu->uuid, uuid, length);
}

__attribute__((visibility("default"))) Return nvmlDeviceGetName(DeviceHandle device, char* name,
                                                                unsigned length) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "name", &gpu); r != kSuccess) return r;
  return CopyString(gpu->name, name, length);
}

__attribute__((visibility("default"))) Return nvmlDeviceGetMinorNumber(DeviceHandle device,
                                                                       unsigned* minor) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "minor", &gpu); r != kSuccess) return r;
  if (minor == nullptr) return kErrorInvalidArgument;
  *minor = gpu->minor;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetMemoryInfo(DeviceHandle device,
                                                                      Memory* memory) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "memory", &gpu); r != kSuccess) return r;
  if (memory == nullptr) return kErrorInvalidArgument;
  memory->total = gpu->memory_bytes;
  memory->used = gpu->memory_bytes / 100;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetCudaComputeCapability(
    DeviceHandle device, int* major, int* minor) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "compute_capability", &gpu); r != kSuccess) return r;
  if (major == nullptr || minor == nullptr) return kErrorInvalidArgument;
  *major = gpu->cc_major;
  *minor = gpu->cc_minor;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetBrand(DeviceHandle device,
                                                                 BrandType* brand) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "brand", &gpu); r != kSuccess) return r;
  if (brand == nullptr) return kErrorInvalidArgument;
  *brand = gpu->brand;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetPciInfo_v3(DeviceHandle device,
                                                                      PciInfo* pci) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "pci", &gpu); r != kSuccess) return r;
  if (pci == nullptr) return kErrorInvalidArgument;
  *pci = gpu->pci;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetTopologyCommonAncestor(DeviceHandle a,
                                                                                  DeviceHandle b,
                                                                                  int* level) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* ga = nullptr;
  FakeGpu* gb = nullptr;
  if (int r = Enter(a, "ancestor", &ga); r != kSuccess) return r;
  if (int r = Enter(b, "ancestor", &gb); r != kSuccess) return r;
  if (level == nullptr) return kErrorInvalidArgument;
  size_t i = 0, j = 0;
  for (size_t k = 0; k < g_node->gpus.size(); ++k) {
    if (g_node->gpus[k].get() == ga) i = k;
    if (g_node->gpus[k].get() == gb) j = k;
  }
  if (i == j) {
    *level = kTopologyInternal;
    return kSuccess;
  }
  if (g_node->levels[i][j] == kLevelNotSupported) return kErrorNotSupported;
  *level = g_node->levels[i][j];
  return kSuccess;
}

// A link's GPU, after the checks every link function shares.
static Return EnterLink(DeviceHandle device, unsigned link, const char* what, FakeGpu** out)
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (int r = Enter(device, what, out); r != kSuccess) return r;
  if (!(*out)->has_nvlink) return kErrorNotSupported;
  if (link >= (*out)->links.size()) return kErrorInvalidArgument;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetNvLinkState(DeviceHandle device,
                                                                       unsigned link,
                                                                       int* enabled) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterLink(device, link, "nvlink_state", &gpu); r != kSuccess) return r;
  if (enabled == nullptr) return kErrorInvalidArgument;
  *enabled = gpu->links[link].enabled ? kFeatureEnabled : kFeatureDisabled;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetNvLinkRemotePciInfo_v2(
    DeviceHandle device, unsigned link, PciInfo* pci) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterLink(device, link, "nvlink_remote", &gpu); r != kSuccess) return r;
  if (pci == nullptr) return kErrorInvalidArgument;
  if (!gpu->links[link].enabled) return kErrorNotSupported;
  try {
    FillPci(gpu->links[link].remote_bus_id, "", *pci);
  } catch (const BadDescription&) {
    return kErrorUnknown;
  }
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetNvLinkRemoteDeviceType(
    DeviceHandle device, unsigned link, int* type) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterLink(device, link, "nvlink_remote", &gpu); r != kSuccess) return r;
  if (type == nullptr) return kErrorInvalidArgument;
  if (!gpu->links[link].enabled) return kErrorNotSupported;
  *type = gpu->links[link].type;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlEventSetCreate(EventSetHandle* set) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (set == nullptr) return kErrorInvalidArgument;
  if (int r = NodeFail("event_set"); r != kSuccess) return r;
  auto owned = std::make_unique<EventSet>();
  *set = reinterpret_cast<EventSetHandle>(owned.get());
  g_sets[*set] = std::move(owned);
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceGetSupportedEventTypes(
    DeviceHandle device, unsigned long long* types) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "supported_events", &gpu); r != kSuccess) return r;
  if (types == nullptr) return kErrorInvalidArgument;
  *types = gpu->supported_events;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlDeviceRegisterEvents(DeviceHandle device,
                                                                       unsigned long long types,
                                                                       EventSetHandle set) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "register_events", &gpu); r != kSuccess) return r;
  EventSet* events = FindSet(set);
  if (events == nullptr) return kErrorInvalidArgument;
  // All or nothing: an unsupported type registers nothing.
  if ((types & ~gpu->supported_events) != 0) return kErrorNotSupported;
  Registration& reg = events->registered[gpu];
  if (reg.types == 0) reg.from = ReplayEvents() ? 0 : EventsFileSize();
  reg.types |= types;
  return kSuccess;
}

__attribute__((visibility("default"))) Return nvmlEventSetWait_v2(EventSetHandle set,
                                                                  EventData* data,
                                                                  unsigned timeout_ms) {
  if (data == nullptr) return kErrorInvalidArgument;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    {
      kdm::MutexLock lock(&g_mu);
      if (g_node == nullptr) return kErrorUninitialized;
      EventSet* events = FindSet(set);  // again each time: it may be freed meanwhile
      if (events == nullptr) return kErrorInvalidArgument;
      if (int r = NextEvent(*events, data); r != kErrorTimeout) return r;
    }
    if (std::chrono::steady_clock::now() >= deadline) return kErrorTimeout;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

__attribute__((visibility("default"))) Return nvmlEventSetFree(EventSetHandle set) {
  kdm::MutexLock lock(&g_mu);
  return g_sets.erase(set) == 1 ? kSuccess : kErrorInvalidArgument;
}

// --- more of NVML: what NVIDIA's k8s-device-plugin and nvidia-smi-style tools
// query (docs/nvml.md, "What the fake exports"). exported_symbols.txt lists
// every exported function and what kind it is.

#define KDM_FAKE_NVML_EXPORT __attribute__((visibility("default")))

KDM_FAKE_NVML_EXPORT Return nvmlInit() { return nvmlInit_v2(); }

// The flags (NVML_INIT_FLAG_NO_GPUS, _NO_ATTACH) change nothing here.
KDM_FAKE_NVML_EXPORT Return nvmlInitWithFlags(unsigned /*flags*/) { return nvmlInit_v2(); }

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetCount(unsigned* count) {
  return nvmlDeviceGetCount_v2(count);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByIndex(unsigned index, DeviceHandle* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

// NVML's version string: the CUDA major version, then the driver version.
KDM_FAKE_NVML_EXPORT Return nvmlSystemGetNVMLVersion(char* version, unsigned length) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  return CopyString(
      std::to_string(g_node->cuda_driver_version / 1000) + "." + g_node->driver_version, version,
      length);
}

// No GPU is excluded, and the fake has no S-class units.
KDM_FAKE_NVML_EXPORT Return nvmlGetExcludedDeviceCount(unsigned* count) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (count == nullptr) return kErrorInvalidArgument;
  *count = 0;
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlUnitGetCount(unsigned* count) {
  return nvmlGetExcludedDeviceCount(count);
}

// The first GPU whose `key` answers `want`, as a handle: NVML's lookups.
static Return FindHandle(const char* want, DeviceHandle* device,
                         bool (*matches)(const FakeGpu&, const std::string&))
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (g_node == nullptr) return kErrorUninitialized;
  if (want == nullptr || device == nullptr) return kErrorInvalidArgument;
  const std::string w(want, strnlen(want, 256));
  for (const auto& gpu : g_node->gpus) {
    if (!matches(*gpu, w)) continue;
    if (int r = GpuFail(*gpu, "handle"); r != kSuccess) return r;
    *device = reinterpret_cast<DeviceHandle>(gpu.get());
    return kSuccess;
  }
  return kErrorNotFound;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByUUID(const char* uuid, DeviceHandle* device) {
  kdm::MutexLock lock(&g_mu);
  return FindHandle(uuid, device,
                    [](const FakeGpu& g, const std::string& w) { return g.uuid == w; });
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetHandleBySerial(const char* serial, DeviceHandle* device) {
  kdm::MutexLock lock(&g_mu);
  return FindHandle(serial, device, [](const FakeGpu& g, const std::string& w) {
    return g.serial.has_value() && *g.serial == w;
  });
}

// Any spelling of the bus id (4- or 8-digit domain, either case); one that
// is no bus id at all is an invalid argument.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id,
                                                             DeviceHandle* device) {
  kdm::MutexLock lock(&g_mu);
  if (g_node == nullptr) return kErrorUninitialized;
  if (bus_id == nullptr || device == nullptr) return kErrorInvalidArgument;
  auto canonical = CanonicalBusId(std::string(bus_id, strnlen(bus_id, 64)));
  if (!canonical) return kErrorInvalidArgument;
  return FindHandle(canonical->c_str(), device, [](const FakeGpu& g, const std::string& w) {
    return CanonicalBusId(g.pci.bus_id) == w;
  });
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetHandleByPciBusId(const char* bus_id,
                                                          DeviceHandle* device) {
  return nvmlDeviceGetHandleByPciBusId_v2(bus_id, device);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetIndex(DeviceHandle device, unsigned* index) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "handle", &gpu); r != kSuccess) return r;
  if (index == nullptr) return kErrorInvalidArgument;
  *index = IndexOf(gpu);
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetSerial(DeviceHandle device, char* serial,
                                                unsigned length) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "serial", &gpu); r != kSuccess) return r;
  if (serial == nullptr) return kErrorInvalidArgument;
  if (!gpu->serial) return kErrorNotSupported;
  return CopyString(*gpu->serial, serial, length);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetPowerManagementLimit(DeviceHandle device,
                                                              unsigned* limit_mw) {
  return AnswerOptional(device, "power", &FakeGpu::power_limit_mw, limit_mw);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetEnforcedPowerLimit(DeviceHandle device,
                                                            unsigned* limit_mw) {
  return AnswerOptional(device, "power", &FakeGpu::power_limit_mw, limit_mw);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetPowerUsage(DeviceHandle device, unsigned* usage_mw) {
  return AnswerOptional(device, "power", &FakeGpu::power_usage_mw, usage_mw);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMaxPcieLinkGeneration(DeviceHandle device, unsigned* gen) {
  return AnswerTable(device, "pcie_link", &FakeGpu::pcie_link, 0, gen);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMaxPcieLinkWidth(DeviceHandle device, unsigned* width) {
  return AnswerTable(device, "pcie_link", &FakeGpu::pcie_link, 1, width);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetCurrPcieLinkGeneration(DeviceHandle device,
                                                                unsigned* gen) {
  return AnswerTable(device, "pcie_link", &FakeGpu::pcie_link, 2, gen);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetCurrPcieLinkWidth(DeviceHandle device, unsigned* width) {
  return AnswerTable(device, "pcie_link", &FakeGpu::pcie_link, 3, width);
}

// `type` is an nvmlClockType_t: 0 graphics, 1 SM, 2 memory, 3 video.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetClockInfo(DeviceHandle device, int type, unsigned* mhz) {
  if (type < 0) return kErrorInvalidArgument;
  return AnswerTable(device, "clocks", &FakeGpu::clocks_mhz, static_cast<unsigned>(type), mhz);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMaxClockInfo(DeviceHandle device, int type,
                                                      unsigned* mhz) {
  if (type < 0) return kErrorInvalidArgument;
  return AnswerTable(device, "clocks", &FakeGpu::max_clocks_mhz, static_cast<unsigned>(type), mhz);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetBAR1MemoryInfo(DeviceHandle device, Bar1Memory* bar1) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "memory", &gpu); r != kSuccess) return r;
  if (bar1 == nullptr) return kErrorInvalidArgument;
  if (!gpu->bar1_bytes) return kErrorNotSupported;
  bar1->total = *gpu->bar1_bytes;
  bar1->used = *gpu->bar1_bytes / 100;
  bar1->free = bar1->total - bar1->used;
  return kSuccess;
}

// nvmlMemory_v2_t: the caller sets `version`; another answers 25
// (NVML_ERROR_ARGUMENT_VERSION_MISMATCH). Nothing reserved, 1% used.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMemoryInfo_v2(DeviceHandle device, MemoryV2* memory) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "memory", &gpu); r != kSuccess) return r;
  if (memory == nullptr) return kErrorInvalidArgument;
  if (memory->version != kMemoryV2Version) return kErrorArgumentVersionMismatch;
  memory->total = gpu->memory_bytes;
  memory->reserved = 0;
  memory->used = gpu->memory_bytes / 100;
  memory->free = memory->total - memory->used;
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetArchitecture(DeviceHandle device, unsigned* arch) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "compute_capability", &gpu); r != kSuccess) return r;
  if (arch == nullptr) return kErrorInvalidArgument;
  *arch = ArchitectureOf(*gpu);
  return kSuccess;
}

// Each other GPU whose common ancestor with `device` is `level` or nearer.
// *count 0 with no array asks for the number; a smaller *count answers
// INSUFFICIENT_SIZE with the number needed.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetTopologyNearestGpus(DeviceHandle device, int level,
                                                             unsigned* count,
                                                             DeviceHandle* devices) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "ancestor", &gpu); r != kSuccess) return r;
  static const std::set<int> kLevels = {kTopologyInternal,   kTopologySingle, kTopologyMultiple,
                                        kTopologyHostBridge, kTopologyNode,   kTopologySystem};
  if (count == nullptr || !kLevels.count(level)) return kErrorInvalidArgument;
  if (devices == nullptr && *count != 0) return kErrorInvalidArgument;
  const size_t i = IndexOf(gpu);
  std::vector<DeviceHandle> near;
  for (size_t j = 0; j < g_node->gpus.size(); ++j) {
    const int l = g_node->levels[i][j];
    if (j != i && l != kLevelNotSupported && l <= level) {
      near.push_back(reinterpret_cast<DeviceHandle>(g_node->gpus[j].get()));
    }
  }
  if (devices == nullptr) {
    *count = static_cast<unsigned>(near.size());
    return kSuccess;
  }
  if (*count < near.size()) {
    *count = static_cast<unsigned>(near.size());
    return kErrorInsufficientSize;
  }
  std::copy(near.begin(), near.end(), devices);
  *count = static_cast<unsigned>(near.size());
  return kSuccess;
}

// Peer access between two GPUs (nvmlGpuP2PCapsIndex_t `index`): over NVLink
// when they share a link or a switch; read, write and PCI also through a PCIe
// switch or host bridge; atomics over NVLink only.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetP2PStatus(DeviceHandle a, DeviceHandle b, int index,
                                                   int* status) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* ga = nullptr;
  FakeGpu* gb = nullptr;
  if (int r = Enter(a, "ancestor", &ga); r != kSuccess) return r;
  if (int r = Enter(b, "ancestor", &gb); r != kSuccess) return r;
  if (status == nullptr || index < kP2pRead || index > kP2pPci || ga == gb) {
    return kErrorInvalidArgument;
  }
  const bool nvlink = NvLinked(*ga, *gb);
  const int level = g_node->levels[IndexOf(ga)][IndexOf(gb)];
  const bool pcie = level != kLevelNotSupported && level <= kTopologyHostBridge;
  switch (index) {
    case kP2pNvLink:
    case kP2pAtomics:
      *status = nvlink ? kP2pStatusOk : kP2pStatusNotSupported;
      break;
    default:
      *status = nvlink || pcie ? kP2pStatusOk : kP2pStatusTopologyNotSupported;
      break;
  }
  return kSuccess;
}

// nvmlNvLinkCapability_t `capability`: an enabled link to a GPU or switch
// supports peer access, system memory access and peer atomics, not system
// memory atomics or SLI; every link of the GPU is valid.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetNvLinkCapability(DeviceHandle device, unsigned link,
                                                          int capability, unsigned* result) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterLink(device, link, "nvlink_state", &gpu); r != kSuccess) return r;
  if (result == nullptr || capability < 0 || capability > kNvLinkCapValid) {
    return kErrorInvalidArgument;
  }
  const FakeLink& l = gpu->links[link];
  const bool peer =
      l.enabled && (l.type == kNvLinkDeviceTypeGpu || l.type == kNvLinkDeviceTypeSwitch);
  switch (capability) {
    case kNvLinkCapValid:
      *result = 1;
      break;
    case kNvLinkCapP2pSupported:
    case kNvLinkCapP2pAtomics:
      *result = peer ? 1 : 0;
      break;
    case kNvLinkCapSysmemAccess:
      *result = l.enabled ? 1 : 0;
      break;
    default:
      *result = 0;
      break;
  }
  return kSuccess;
}

// MIG: the description has no MIG data yet, so a MIG-capable GPU (compute
// capability 8.0 or 9.0: A100, A30, H100, H200) has MIG disabled, and any
// other answers NOT_SUPPORTED. No MIG device handle exists.
static Return EnterMig(DeviceHandle device, FakeGpu** gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(g_mu) {
  if (int r = Enter(device, "mig", gpu); r != kSuccess) return r;
  return MigCapable(**gpu) ? kSuccess : kErrorNotSupported;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMigMode(DeviceHandle device, unsigned* current,
                                                 unsigned* pending) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterMig(device, &gpu); r != kSuccess) return r;
  if (current == nullptr || pending == nullptr) return kErrorInvalidArgument;
  *current = kMigDisabled;
  *pending = kMigDisabled;
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMaxMigDeviceCount(DeviceHandle device, unsigned* count) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterMig(device, &gpu); r != kSuccess) return r;
  if (count == nullptr) return kErrorInvalidArgument;
  *count = 0;  // MIG disabled
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetMigDeviceHandleByIndex(DeviceHandle device,
                                                                unsigned /*index*/,
                                                                DeviceHandle* mig) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = EnterMig(device, &gpu); r != kSuccess) return r;
  if (mig == nullptr) return kErrorInvalidArgument;
  return kErrorNotFound;  // no MIG device at any index
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceIsMigDeviceHandle(DeviceHandle device, unsigned* is_mig) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "mig", &gpu); r != kSuccess) return r;
  if (is_mig == nullptr) return kErrorInvalidArgument;
  *is_mig = 0;
  return kSuccess;
}

// Every handle the fake hands out is a whole GPU's, never a MIG device's.
KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetDeviceHandleFromMigDeviceHandle(DeviceHandle mig,
                                                                         DeviceHandle* device) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(mig, "mig", &gpu); r != kSuccess) return r;
  if (device == nullptr) return kErrorInvalidArgument;
  return kErrorInvalidArgument;
}

// The _v1/_v2 PCI queries fill the legacy 52-byte nvmlPciInfo_t: its first 36
// bytes are laid out as version 3's (the 4-digit-domain bus id, domain, bus,
// device, ids), and nothing past them is written.
constexpr size_t kLegacyPciBytes = offsetof(PciInfo, bus_id);

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetPciInfo_v2(DeviceHandle device, PciInfo* pci) {
  PciInfo full{};
  if (Return r = nvmlDeviceGetPciInfo_v3(device, pci == nullptr ? nullptr : &full); r != kSuccess) {
    return r;
  }
  std::memcpy(pci, &full, kLegacyPciBytes);
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetPciInfo(DeviceHandle device, PciInfo* pci) {
  return nvmlDeviceGetPciInfo_v2(device, pci);
}

KDM_FAKE_NVML_EXPORT Return nvmlDeviceGetNvLinkRemotePciInfo(DeviceHandle device, unsigned link,
                                                             PciInfo* pci) {
  PciInfo full{};
  if (Return r =
          nvmlDeviceGetNvLinkRemotePciInfo_v2(device, link, pci == nullptr ? nullptr : &full);
      r != kSuccess) {
    return r;
  }
  std::memcpy(pci, &full, kLegacyPciBytes);
  return kSuccess;
}

KDM_FAKE_NVML_EXPORT Return nvmlEventSetWait(EventSetHandle set, EventData* data,
                                             unsigned timeout_ms) {
  return nvmlEventSetWait_v2(set, data, timeout_ms);
}

// --- the rest of the API: answers without data ------------------------------
//
// Each function below takes its real arguments; it reads only the first
// (the calling convention leaves the others unread and unharmed) and writes
// nothing, so no argument can make it crash:
//   device    NOT_SUPPORTED for a GPU's handle (the description has no data
//             for it), INVALID_ARGUMENT for any other handle;
//   instance  INVALID_ARGUMENT: no GPU or compute instance exists (MIG off);
//   unit      INVALID_ARGUMENT: there are no S-class units;
//   other     NOT_SUPPORTED (vGPU, GPM, confidential computing, system
//             events and settings, drain states, ...).
// Each answers UNINITIALIZED before nvmlInit.

static Return StubDevice(DeviceHandle device) {
  kdm::MutexLock lock(&g_mu);
  FakeGpu* gpu = nullptr;
  if (int r = Enter(device, "handle", &gpu); r != kSuccess) return r;
  return kErrorNotSupported;
}

static Return StubAnswer(Return answer) {
  kdm::MutexLock lock(&g_mu);
  return g_node == nullptr ? kErrorUninitialized : answer;
}

#define KDM_FAKE_NVML_STUB_DEVICE(name) \
  KDM_FAKE_NVML_EXPORT Return name(DeviceHandle device) { return StubDevice(device); }
#define KDM_FAKE_NVML_STUB_INSTANCE(name) \
  KDM_FAKE_NVML_EXPORT Return name() { return StubAnswer(kErrorInvalidArgument); }
#define KDM_FAKE_NVML_STUB_UNIT(name) \
  KDM_FAKE_NVML_EXPORT Return name() { return StubAnswer(kErrorInvalidArgument); }
#define KDM_FAKE_NVML_STUB_OTHER(name) \
  KDM_FAKE_NVML_EXPORT Return name() { return StubAnswer(kErrorNotSupported); }
#include "stubs.inc"  // NOLINT(build/include): one macro line per function
#undef KDM_FAKE_NVML_STUB_DEVICE
#undef KDM_FAKE_NVML_STUB_INSTANCE
#undef KDM_FAKE_NVML_STUB_UNIT
#undef KDM_FAKE_NVML_STUB_OTHER

}  // extern "C"
