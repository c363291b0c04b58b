// kdm's own declarations of the part of NVML (the NVIDIA Management Library,
// libnvidia-ml.so.1) that kdm calls. There is no NVML header in Debian and kdm
// never links against the library: it is opened with dlopen at run time
// (library.h), so these declarations are the whole contract. docs/nvml.md
// lists the functions, what each answers and where kdm uses it.
//
// The types keep NVML's C layout exactly (the static_asserts below check the
// sizes a mismatch would break); the names are kdm's, except the function
// pointer types, which are named after the C function they point to. The
// fake library in test/nvml/fake_nvml/ defines the same C functions with these
// types, so a change here changes both sides at once.
//
// Thread-safety: declarations only.
#ifndef KDM_NVML_NVML_API_H_
#define KDM_NVML_NVML_API_H_

#include <cstddef>

namespace kdm::nvml {

// nvmlReturn_t: an int. The values kdm names; any other is passed through
// (ErrorString names it).
using Return = int;
inline constexpr Return kSuccess = 0;
inline constexpr Return kErrorUninitialized = 1;
inline constexpr Return kErrorInvalidArgument = 2;
inline constexpr Return kErrorNotSupported = 3;
inline constexpr Return kErrorNoPermission = 4;
inline constexpr Return kErrorNotFound = 6;
inline constexpr Return kErrorInsufficientSize = 7;
inline constexpr Return kErrorDriverNotLoaded = 9;
inline constexpr Return kErrorTimeout = 10;
inline constexpr Return kErrorLibraryNotFound = 12;
inline constexpr Return kErrorGpuIsLost = 15;
inline constexpr Return kErrorUnknown = 999;

// Opaque handles (nvmlDevice_t, nvmlEventSet_t): pointers NVML hands out and
// takes back; kdm never looks inside.
struct DeviceOpaque;
struct EventSetOpaque;
using DeviceHandle = DeviceOpaque*;
using EventSetHandle = EventSetOpaque*;

// Buffer sizes NVML documents for its string answers.
inline constexpr unsigned kDriverVersionBufferSize = 80;  // nvmlSystemGetDriverVersion
inline constexpr unsigned kUuidBufferSize = 80;           // nvmlDeviceGetUUID
inline constexpr unsigned kNameBufferSize = 96;           // nvmlDeviceGetName

// nvmlPciInfo_t, version 3 (filled by nvmlDeviceGetPciInfo_v3 and
// nvmlDeviceGetNvLinkRemotePciInfo_v2). busId has an 8-digit domain
// ("00000000:1B:00.0"); busIdLegacy the older 4-digit one. The _v1/_v2
// functions fill a 52-byte layout: kdm never calls them.
struct PciInfo {
  char bus_id_legacy[16];
  unsigned domain;
  unsigned bus;
  unsigned device;
  unsigned pci_device_id;
  unsigned pci_sub_system_id;
  char bus_id[32];
};
static_assert(sizeof(PciInfo) == 68, "nvmlPciInfo_t v3 is 68 bytes");
static_assert(offsetof(PciInfo, bus_id) == 36, "nvmlPciInfo_t v3 busId offset");

// nvmlMemory_t: bytes.
struct Memory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
static_assert(sizeof(Memory) == 24, "nvmlMemory_t is 24 bytes");

// nvmlEventData_t: what nvmlEventSetWait_v2 fills. event_data is the Xid for
// a critical Xid event; the instance ids are 0xFFFFFFFF outside MIG.
struct EventData {
  DeviceHandle device;
  unsigned long long event_type;
  unsigned long long event_data;
  unsigned gpu_instance_id;
  unsigned compute_instance_id;
};
static_assert(sizeof(EventData) == 32, "nvmlEventData_t is 32 bytes");
static_assert(offsetof(EventData, gpu_instance_id) == 24, "nvmlEventData_t layout");

// Event types (a bit mask).
inline constexpr unsigned long long kEventTypeSingleBitEccError = 0x1;
inline constexpr unsigned long long kEventTypeDoubleBitEccError = 0x2;
inline constexpr unsigned long long kEventTypeXidCriticalError = 0x8;
inline constexpr unsigned kNoInstanceId = 0xFFFFFFFF;

// nvmlGpuTopologyLevel_t: the closest common ancestor of two GPUs.
inline constexpr int kTopologyInternal = 0;
inline constexpr int kTopologySingle = 10;      // PIX
inline constexpr int kTopologyMultiple = 20;    // PXB
inline constexpr int kTopologyHostBridge = 30;  // PHB
inline constexpr int kTopologyNode = 40;        // NODE
inline constexpr int kTopologySystem = 50;      // SYS

// nvmlIntNvLinkDeviceType_t: what sits at the far end of an NVLink.
inline constexpr int kNvLinkDeviceTypeGpu = 0;
inline constexpr int kNvLinkDeviceTypeIbmNpu = 1;
inline constexpr int kNvLinkDeviceTypeSwitch = 2;
inline constexpr int kNvLinkDeviceTypeUnknown = 0xFF;

// NVML_NVLINK_MAX_LINKS in current headers (18 earlier, 12 before). kdm asks
// for links 0..kMaxNvLinks-1; past a GPU's own links NVML answers
// kErrorInvalidArgument, and a GPU without NVLink kErrorNotSupported.
inline constexpr unsigned kMaxNvLinks = 36;

// nvmlFeatureState_t of nvmlDeviceGetNvLinkState.
inline constexpr int kFeatureDisabled = 0;
inline constexpr int kFeatureEnabled = 1;

// nvmlBrandType_t values, 0..16 (NVML_BRAND_UNKNOWN .. NVML_BRAND_TITAN_RTX).
using BrandType = int;

// The C functions, as function pointer types named after them.
extern "C" {
using nvmlInit_v2_t = Return (*)();
using nvmlShutdown_t = Return (*)();
using nvmlErrorString_t = const char* (*)(Return);
using nvmlSystemGetDriverVersion_t = Return (*)(char* version, unsigned length);
using nvmlSystemGetCudaDriverVersion_t = Return (*)(int* version);
using nvmlSystemGetCudaDriverVersion_v2_t = Return (*)(int* version);
using nvmlDeviceGetCount_v2_t = Return (*)(unsigned* count);
using nvmlDeviceGetHandleByIndex_v2_t = Return (*)(unsigned index, DeviceHandle* device);
using nvmlDeviceGetUUID_t = Return (*)(DeviceHandle device, char* uuid, unsigned length);
using nvmlDeviceGetName_t = Return (*)(DeviceHandle device, char* name, unsigned length);
using nvmlDeviceGetMinorNumber_t = Return (*)(DeviceHandle device, unsigned* minor);
using nvmlDeviceGetMemoryInfo_t = Return (*)(DeviceHandle device, Memory* memory);
using nvmlDeviceGetCudaComputeCapability_t = Return (*)(DeviceHandle device, int* major,
                                                        int* minor);
using nvmlDeviceGetBrand_t = Return (*)(DeviceHandle device, BrandType* brand);
using nvmlDeviceGetPciInfo_v3_t = Return (*)(DeviceHandle device, PciInfo* pci);
using nvmlDeviceGetTopologyCommonAncestor_t = Return (*)(DeviceHandle a, DeviceHandle b,
                                                         int* level);
using nvmlDeviceGetNvLinkState_t = Return (*)(DeviceHandle device, unsigned link, int* enabled);
using nvmlDeviceGetNvLinkRemotePciInfo_v2_t = Return (*)(DeviceHandle device, unsigned link,
                                                         PciInfo* pci);
using nvmlDeviceGetNvLinkRemoteDeviceType_t = Return (*)(DeviceHandle device, unsigned link,
                                                         int* type);
using nvmlEventSetCreate_t = Return (*)(EventSetHandle* set);
using nvmlDeviceGetSupportedEventTypes_t = Return (*)(DeviceHandle device,
                                                      unsigned long long* types);
using nvmlDeviceRegisterEvents_t = Return (*)(DeviceHandle device, unsigned long long types,
                                              EventSetHandle set);
using nvmlEventSetWait_v2_t = Return (*)(EventSetHandle set, EventData* data, unsigned timeout_ms);
using nvmlEventSetFree_t = Return (*)(EventSetHandle set);
}

}  // namespace kdm::nvml

#endif  // KDM_NVML_NVML_API_H_
