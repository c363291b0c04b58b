// kdm::nvml::Library: libnvidia-ml opened with dlopen, initialised, and every
// NVML function kdm calls resolved once. Nothing in kdm links against NVML, so
// a kdm binary runs on a machine without a GPU; only the commands that need
// NVML (`kdm topo --nvml`, `kdm plugin --nvml`) load it, and a machine without
// it gets one clear line instead of a loader crash.
//
// Load() opens the library (RTLD_NOW | RTLD_LOCAL), resolves every function
// below (all are required except nvmlDeviceGetBrand), then calls nvmlInit_v2.
// The destructor calls nvmlShutdown and dlclose. NVML counts its
// initialisations, so two Library objects in one process are fine.
//
// Thread-safety: immutable after Load(); NVML's own functions may be called
// from any thread, so a Library may be shared by any number of threads (the
// health thread and the gRPC threads of a plugin). It must outlive every
// handle it handed out.
//
// Example:
//   kdm::StatusOr<std::unique_ptr<Library>> lib = Library::Load();
//   if (!lib.ok()) { std::cerr << lib.status().message() << "\n"; return 2; }
//   unsigned count = 0;
//   kdm::Status s = (*lib)->Check((*lib)->api().DeviceGetCount_v2(&count),
//                                 "nvmlDeviceGetCount_v2");
#ifndef KDM_NVML_LIBRARY_H_
#define KDM_NVML_LIBRARY_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "kdm/base/status.h"
#include "kdm/nvml/nvml_api.h"

namespace kdm::nvml {

// The library name the driver installs; Load() with no path opens it through
// the dynamic loader's search path.
inline constexpr std::string_view kDefaultLibraryName = "libnvidia-ml.so.1";

// Every NVML function kdm calls, resolved. Members are named after the C
// function without its "nvml" prefix. All are non-null after Load(), except
// DeviceGetBrand (NVML without it reports brand "unknown").
struct Api {
  nvmlInit_v2_t Init_v2 = nullptr;
  nvmlShutdown_t Shutdown = nullptr;
  nvmlErrorString_t ErrorString = nullptr;
  nvmlSystemGetDriverVersion_t SystemGetDriverVersion = nullptr;
  nvmlSystemGetCudaDriverVersion_t SystemGetCudaDriverVersion = nullptr;
  nvmlSystemGetCudaDriverVersion_v2_t SystemGetCudaDriverVersion_v2 = nullptr;
  nvmlDeviceGetCount_v2_t DeviceGetCount_v2 = nullptr;
  nvmlDeviceGetHandleByIndex_v2_t DeviceGetHandleByIndex_v2 = nullptr;
  nvmlDeviceGetUUID_t DeviceGetUUID = nullptr;
  nvmlDeviceGetName_t DeviceGetName = nullptr;
  nvmlDeviceGetMinorNumber_t DeviceGetMinorNumber = nullptr;
  nvmlDeviceGetMemoryInfo_t DeviceGetMemoryInfo = nullptr;
  nvmlDeviceGetCudaComputeCapability_t DeviceGetCudaComputeCapability = nullptr;
  nvmlDeviceGetBrand_t DeviceGetBrand = nullptr;  // optional
  nvmlDeviceGetPciInfo_v3_t DeviceGetPciInfo_v3 = nullptr;
  nvmlDeviceGetTopologyCommonAncestor_t DeviceGetTopologyCommonAncestor = nullptr;
  nvmlDeviceGetNvLinkState_t DeviceGetNvLinkState = nullptr;
  nvmlDeviceGetNvLinkRemotePciInfo_v2_t DeviceGetNvLinkRemotePciInfo_v2 = nullptr;
  nvmlDeviceGetNvLinkRemoteDeviceType_t DeviceGetNvLinkRemoteDeviceType = nullptr;
  nvmlEventSetCreate_t EventSetCreate = nullptr;
  nvmlDeviceGetSupportedEventTypes_t DeviceGetSupportedEventTypes = nullptr;
  nvmlDeviceRegisterEvents_t DeviceRegisterEvents = nullptr;
  nvmlEventSetWait_v2_t EventSetWait_v2 = nullptr;
  nvmlEventSetFree_t EventSetFree = nullptr;
};

class Library {
 public:
  // Opens `path` (empty: kDefaultLibraryName through the loader's search
  // path; with a '/' exactly that file), resolves Api and calls nvmlInit_v2.
  // On failure nothing stays open, and the Status's message is one line:
  //  - the library cannot be opened: NOT_FOUND,
  //    "NVML not found: <dlerror text>; is the NVIDIA driver installed?";
  //  - a required function is missing: FAILED_PRECONDITION naming the
  //    function and the library;
  //  - nvmlInit_v2 fails: the code of NvmlCode(ret), "nvmlInit_v2: <the
  //    library's nvmlErrorString text> (NVML error <ret>)".
  static StatusOr<std::unique_ptr<Library>> Load(std::string_view path = {});

  // nvmlShutdown, then dlclose.
  ~Library();
  Library(const Library&) = delete;
  Library& operator=(const Library&) = delete;

  // The resolved functions.
  const Api& api() const { return api_; }
  // The path Load() was given (or kDefaultLibraryName).
  const std::string& path() const { return path_; }

  // The library's nvmlErrorString(ret); "NVML error <ret>" when it answers
  // null or an empty string.
  std::string ErrorString(Return ret) const;
  // OK for kSuccess; otherwise a Status with NvmlCode(ret) and the message
  // "<what>: <ErrorString(ret)> (NVML error <ret>)".
  Status Check(Return ret, std::string_view what) const;

  // The driver version ("550.54.15"), from nvmlSystemGetDriverVersion.
  StatusOr<std::string> DriverVersion() const;
  // The CUDA driver version as NVML encodes it (12040 for 12.4), from
  // nvmlSystemGetCudaDriverVersion_v2, or from the unversioned function when
  // _v2 fails (it answers kErrorLibraryNotFound without libcuda.so.1). The
  // error names both calls when both fail.
  StatusOr<int> CudaDriverVersion() const;

 private:
  Library(void* handle, std::string path, const Api& api)
      : handle_(handle), path_(std::move(path)), api_(api) {}

  void* handle_;
  std::string path_;
  Api api_;
};

// The kdm::StatusCode for an NVML return code: 2 INVALID_ARGUMENT,
// 3 UNIMPLEMENTED, 4 PERMISSION_DENIED, 6 and 12 NOT_FOUND, 7 OUT_OF_RANGE,
// 10 DEADLINE_EXCEEDED, 1 and 9 FAILED_PRECONDITION, 15 UNAVAILABLE, any other
// UNKNOWN (kSuccess: OK).
StatusCode NvmlCode(Return ret);

// "12.4" for 12040 (major = v / 1000, minor = v % 1000 / 10).
std::string FormatCudaVersion(int version);

}  // namespace kdm::nvml

#endif  // KDM_NVML_LIBRARY_H_
