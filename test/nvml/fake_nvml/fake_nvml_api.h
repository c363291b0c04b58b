// The part of NVML's C API the fake libnvidia-ml.so.1 answers beyond what kdm
// itself calls (nvml/nvml_api.h): types, layouts and values, shared by the
// fake and its tests. Names are kdm's; layouts are NVML's (checked below).
#ifndef KDM_TEST_NVML_FAKE_NVML_FAKE_NVML_API_H_
#define KDM_TEST_NVML_FAKE_NVML_FAKE_NVML_API_H_

#include <cstddef>

#include "kdm/nvml/nvml_api.h"

namespace kdm::nvml {

// nvmlReturn_t values past the ones kdm names.
inline constexpr Return kErrorAlreadyInitialized = 5;
inline constexpr Return kErrorInsufficientPower = 8;
inline constexpr Return kErrorIrqIssue = 11;
inline constexpr Return kErrorFunctionNotFound = 13;
inline constexpr Return kErrorCorruptedInforom = 14;
inline constexpr Return kErrorResetRequired = 16;
inline constexpr Return kErrorOperatingSystem = 17;
inline constexpr Return kErrorLibRmVersionMismatch = 18;
inline constexpr Return kErrorInUse = 19;
inline constexpr Return kErrorMemory = 20;
inline constexpr Return kErrorNoData = 21;
inline constexpr Return kErrorVgpuEccNotSupported = 22;
inline constexpr Return kErrorInsufficientResources = 23;
inline constexpr Return kErrorFreqNotSupported = 24;
inline constexpr Return kErrorArgumentVersionMismatch = 25;
inline constexpr Return kErrorDeprecated = 26;
inline constexpr Return kErrorNotReady = 27;
inline constexpr Return kErrorGpuNotFound = 28;
inline constexpr Return kErrorInvalidState = 29;
inline constexpr Return kErrorResetTypeNotSupported = 30;

// nvmlBAR1Memory_t: bytes.
struct Bar1Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(Bar1Memory) == 24, "nvmlBAR1Memory_t is 24 bytes");

// nvmlMemory_v2_t: the caller sets `version` to kMemoryV2Version.
struct MemoryV2 {
  unsigned version;
  unsigned long long total;
  unsigned long long reserved;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(MemoryV2) == 40, "nvmlMemory_v2_t is 40 bytes");
// NVML's struct version: the size, with the version number in the top byte.
inline constexpr unsigned kMemoryV2Version = sizeof(MemoryV2) | (2u << 24);

// nvmlClockType_t.
inline constexpr int kClockGraphics = 0;
inline constexpr int kClockSm = 1;
inline constexpr int kClockMem = 2;
inline constexpr int kClockVideo = 3;

// nvmlDeviceArchitecture_t.
inline constexpr unsigned kArchKepler = 2;
inline constexpr unsigned kArchMaxwell = 3;
inline constexpr unsigned kArchPascal = 4;
inline constexpr unsigned kArchVolta = 5;
inline constexpr unsigned kArchTuring = 6;
inline constexpr unsigned kArchAmpere = 7;
inline constexpr unsigned kArchAda = 8;
inline constexpr unsigned kArchHopper = 9;
inline constexpr unsigned kArchBlackwell = 10;
inline constexpr unsigned kArchUnknown = 0xffffffff;

// nvmlGpuP2PCapsIndex_t and nvmlGpuP2PStatus_t.
inline constexpr int kP2pRead = 0;
inline constexpr int kP2pWrite = 1;
inline constexpr int kP2pNvLink = 2;
inline constexpr int kP2pAtomics = 3;
inline constexpr int kP2pPci = 4;
inline constexpr int kP2pStatusOk = 0;
inline constexpr int kP2pStatusTopologyNotSupported = 3;  // IOH_TOPOLOGY_NOT_SUPPORTED
inline constexpr int kP2pStatusNotSupported = 5;

// nvmlNvLinkCapability_t.
inline constexpr int kNvLinkCapP2pSupported = 0;
inline constexpr int kNvLinkCapSysmemAccess = 1;
inline constexpr int kNvLinkCapP2pAtomics = 2;
inline constexpr int kNvLinkCapSysmemAtomics = 3;
inline constexpr int kNvLinkCapSliBridge = 4;
inline constexpr int kNvLinkCapValid = 5;

// NVML_DEVICE_MIG_DISABLE / _ENABLE.
inline constexpr unsigned kMigDisabled = 0;
inline constexpr unsigned kMigEnabled = 1;

}  // namespace kdm::nvml

#endif  // KDM_TEST_NVML_FAKE_NVML_FAKE_NVML_API_H_
