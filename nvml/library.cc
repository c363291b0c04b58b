#include "kdm/nvml/library.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <utility>

namespace kdm::nvml {
namespace {

// dlerror's text on one line (it never holds a newline in glibc, but the
// promise of one line is ours to keep).
std::string OneLine(const char* text) {
  std::string in = text != nullptr ? text : "unknown dlopen error";
  // The loader's and the driver's text: one line, other control bytes shown
  // as \xNN (an escape sequence in an error string reaches a terminal).
  std::string out;
  for (char c : in) {
    auto u = static_cast<unsigned char>(c);
    if (c == '\n' || c == '\r') {
      out += ' ';
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  return out;
}

template <typename Fn>
Status Resolve(void* handle, const std::string& path, const char* name, bool required, Fn* out) {
  dlerror();
  void* symbol = dlsym(handle, name);
  if (symbol == nullptr) {
    if (!required) return OkStatus();
    return FailedPreconditionError("NVML library " + path + " lacks " + name + ": " +
                                   OneLine(dlerror()));
  }
  *out = reinterpret_cast<Fn>(symbol);
  return OkStatus();
}

Status ResolveAll(void* handle, const std::string& path, Api& api) {
#define KDM_NVML_RESOLVE(member, required) \
  KDM_RETURN_IF_ERROR(Resolve(handle, path, "nvml" #member, required, &api.member))
  KDM_NVML_RESOLVE(Init_v2, true);
  KDM_NVML_RESOLVE(Shutdown, true);
  KDM_NVML_RESOLVE(ErrorString, true);
  KDM_NVML_RESOLVE(SystemGetDriverVersion, true);
  KDM_NVML_RESOLVE(SystemGetCudaDriverVersion, true);
  KDM_NVML_RESOLVE(SystemGetCudaDriverVersion_v2, true);
  KDM_NVML_RESOLVE(DeviceGetCount_v2, true);
  KDM_NVML_RESOLVE(DeviceGetHandleByIndex_v2, true);
  KDM_NVML_RESOLVE(DeviceGetUUID, true);
  KDM_NVML_RESOLVE(DeviceGetName, true);
  KDM_NVML_RESOLVE(DeviceGetMinorNumber, true);
  KDM_NVML_RESOLVE(DeviceGetMemoryInfo, true);
  KDM_NVML_RESOLVE(DeviceGetCudaComputeCapability, true);
  KDM_NVML_RESOLVE(DeviceGetBrand, false);
  KDM_NVML_RESOLVE(DeviceGetPciInfo_v3, true);
  KDM_NVML_RESOLVE(DeviceGetTopologyCommonAncestor, true);
  KDM_NVML_RESOLVE(DeviceGetNvLinkState, true);
  KDM_NVML_RESOLVE(DeviceGetNvLinkRemotePciInfo_v2, true);
  KDM_NVML_RESOLVE(DeviceGetNvLinkRemoteDeviceType, true);
  KDM_NVML_RESOLVE(EventSetCreate, true);
  KDM_NVML_RESOLVE(DeviceGetSupportedEventTypes, true);
  KDM_NVML_RESOLVE(DeviceRegisterEvents, true);
  KDM_NVML_RESOLVE(EventSetWait_v2, true);
  KDM_NVML_RESOLVE(EventSetFree, true);
#undef KDM_NVML_RESOLVE
  return OkStatus();
}

}  // namespace

StatusCode NvmlCode(Return ret) {
  switch (ret) {
    case kSuccess:
      return StatusCode::kOk;
    case kErrorUninitialized:
    case kErrorDriverNotLoaded:
      return StatusCode::kFailedPrecondition;
    case kErrorInvalidArgument:
      return StatusCode::kInvalidArgument;
    case kErrorNotSupported:
      return StatusCode::kUnimplemented;
    case kErrorNoPermission:
      return StatusCode::kPermissionDenied;
    case kErrorNotFound:
    case kErrorLibraryNotFound:
      return StatusCode::kNotFound;
    case kErrorInsufficientSize:
      return StatusCode::kOutOfRange;
    case kErrorTimeout:
      return StatusCode::kDeadlineExceeded;
    case kErrorGpuIsLost:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kUnknown;
  }
}

std::string FormatCudaVersion(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

StatusOr<std::unique_ptr<Library>> Library::Load(std::string_view path) {
  std::string name = path.empty() ? std::string(kDefaultLibraryName) : std::string(path);
  dlerror();
  void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return NotFoundError("NVML not found: " + OneLine(dlerror()) +
                         "; is the NVIDIA driver installed?");
  }
  Api api;
  if (Status s = ResolveAll(handle, name, api); !s.ok()) {
    dlclose(handle);
    return s;
  }
  std::unique_ptr<Library> library(new Library(handle, name, api));
  if (Return ret = api.Init_v2(); ret != kSuccess) {
    Status s = library->Check(ret, "nvmlInit_v2");
    // Not initialised: close without nvmlShutdown.
    library->api_.Shutdown = nullptr;
    return s;
  }
  return library;
}

Library::~Library() {
  if (api_.Shutdown != nullptr) api_.Shutdown();
  dlclose(handle_);
}

std::string Library::ErrorString(Return ret) const {
  const char* text = api_.ErrorString(ret);
  if (text == nullptr || *text == '\0') return "NVML error " + std::to_string(ret);
  return OneLine(text);
}

Status Library::Check(Return ret, std::string_view what) const {
  if (ret == kSuccess) return OkStatus();
  return Status(NvmlCode(ret), std::string(what) + ": " + ErrorString(ret) + " (NVML error " +
                                   std::to_string(ret) + ")");
}

StatusOr<std::string> Library::DriverVersion() const {
  char buffer[kDriverVersionBufferSize] = {};
  KDM_RETURN_IF_ERROR(
      Check(api_.SystemGetDriverVersion(buffer, sizeof buffer), "nvmlSystemGetDriverVersion"));
  buffer[sizeof buffer - 1] = '\0';
  return std::string(buffer);
}

StatusOr<int> Library::CudaDriverVersion() const {
  int version = 0;
  Return v2 = api_.SystemGetCudaDriverVersion_v2(&version);
  if (v2 == kSuccess) return version;
  Return v1 = api_.SystemGetCudaDriverVersion(&version);
  if (v1 == kSuccess) return version;
  Status first = Check(v2, "nvmlSystemGetCudaDriverVersion_v2");
  Status second = Check(v1, "nvmlSystemGetCudaDriverVersion");
  return Status(second.code(), first.message() + "; " + second.message());
}

}  // namespace kdm::nvml
