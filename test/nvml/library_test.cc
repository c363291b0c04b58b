// The loader: opening NVML, missing libraries and functions, NVML errors by
// name, and the CUDA version's fallback.
#include "kdm/nvml/library.h"

#include <gtest/gtest.h>

#include "nvml_test_util.h"

namespace kdm::nvml {
namespace {

using test::kFakeLibrary;
using test::TempDir;
using test::TwoGpuNode;
using test::UseNode;

TEST(LibraryTest, MissingLibraryIsOneLineNamingTheDriver) {
  auto lib = Library::Load("/nonexistent/dir/libnvidia-ml.so.1");
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kNotFound);
  const std::string& m = lib.status().message();
  EXPECT_EQ(m.rfind("NVML not found: /nonexistent/dir/libnvidia-ml.so.1: ", 0), 0u) << m;
  EXPECT_NE(m.find("; is the NVIDIA driver installed?"), std::string::npos) << m;
  EXPECT_EQ(m.substr(m.size() - 33), "; is the NVIDIA driver installed?") << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

TEST(LibraryTest, DefaultNameIsLibnvidiaMl) {
  EXPECT_EQ(kDefaultLibraryName, "libnvidia-ml.so.1");
  // This machine has no NVIDIA driver (the tests never need one): the
  // default name goes through the loader's search path and is not found.
  if (Library::Load().ok()) return;  // a real driver is installed: nothing more to check
  auto lib = Library::Load();
  EXPECT_NE(lib.status().message().find("libnvidia-ml.so.1"), std::string::npos)
      << lib.status().message();
}

TEST(LibraryTest, MissingFunctionIsNamed) {
  auto lib = Library::Load(KDM_NVML_MISSING_SYMBOL_LIBRARY);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(lib.status().message().find("lacks nvmlShutdown"), std::string::npos)
      << lib.status().message();
  EXPECT_NE(lib.status().message().find(KDM_NVML_MISSING_SYMBOL_LIBRARY), std::string::npos);
}

TEST(LibraryTest, LoadsTheFakeAndResolvesEveryFunction) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode()));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  const Api& api = (*lib)->api();
  EXPECT_NE(api.EventSetCreate, nullptr);
  EXPECT_NE(api.DeviceGetSupportedEventTypes, nullptr);
  EXPECT_NE(api.DeviceRegisterEvents, nullptr);
  EXPECT_NE(api.EventSetWait_v2, nullptr);
  EXPECT_NE(api.EventSetFree, nullptr);
  EXPECT_NE(api.DeviceGetBrand, nullptr);
  unsigned count = 0;
  ASSERT_TRUE((*lib)->Check(api.DeviceGetCount_v2(&count), "count").ok());
  EXPECT_EQ(count, 2u);
  EXPECT_EQ((*lib)->path(), kFakeLibrary);
}

TEST(LibraryTest, TwoLibrariesCountInitialisations) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode()));
  auto first = Library::Load(kFakeLibrary);
  ASSERT_TRUE(first.ok()) << first.status();
  {
    auto second = Library::Load(kFakeLibrary);
    ASSERT_TRUE(second.ok()) << second.status();
  }
  unsigned count = 0;
  EXPECT_TRUE((*first)->Check((*first)->api().DeviceGetCount_v2(&count), "count").ok());
}

TEST(LibraryTest, InitErrorIsNamedWithNvmlErrorString) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode(R"( "fail": {"init": 9},)")));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_FALSE(lib.ok());
  EXPECT_EQ(lib.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(lib.status().message(), "nvmlInit_v2: Driver Not Loaded (NVML error 9)");
}

TEST(LibraryTest, CheckNamesTheCallAndTheError) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode()));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  Status s = (*lib)->Check(kErrorGpuIsLost, "nvmlDeviceGetUUID(GPU 0)");
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "nvmlDeviceGetUUID(GPU 0): GPU is lost (NVML error 15)");
  EXPECT_TRUE((*lib)->Check(kSuccess, "x").ok());
  EXPECT_EQ((*lib)->ErrorString(kErrorTimeout), "Timeout");
  EXPECT_EQ((*lib)->ErrorString(kErrorNotSupported), "Not Supported");
}

TEST(LibraryTest, CudaVersionFromV2) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode()));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto v = (*lib)->CudaDriverVersion();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 12040);
  EXPECT_EQ(FormatCudaVersion(*v), "12.4");
  auto d = (*lib)->DriverVersion();
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, "550.54.15");
}

TEST(LibraryTest, CudaVersionFallsBackWhenV2AnswersLibraryNotFound) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode(R"( "fail": {"cuda_v2": 12},)")));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto v = (*lib)->CudaDriverVersion();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, 12040);
}

TEST(LibraryTest, CudaVersionNamesBothCallsWhenBothFail) {
  TempDir dir;
  UseNode(dir.Write("node.json", TwoGpuNode(R"( "fail": {"cuda_v2": 12, "cuda": 3},)")));
  auto lib = Library::Load(kFakeLibrary);
  ASSERT_TRUE(lib.ok()) << lib.status();
  auto v = (*lib)->CudaDriverVersion();
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().message(),
            "nvmlSystemGetCudaDriverVersion_v2: NVML Shared Library Not Found (NVML error 12); "
            "nvmlSystemGetCudaDriverVersion: Not Supported (NVML error 3)");
}

TEST(LibraryTest, FormatCudaVersion) {
  EXPECT_EQ(FormatCudaVersion(12040), "12.4");
  EXPECT_EQ(FormatCudaVersion(11080), "11.8");
  EXPECT_EQ(FormatCudaVersion(12100), "12.10");
  EXPECT_EQ(FormatCudaVersion(0), "0.0");
}

TEST(LibraryTest, NvmlCodes) {
  EXPECT_EQ(NvmlCode(kSuccess), StatusCode::kOk);
  EXPECT_EQ(NvmlCode(kErrorInvalidArgument), StatusCode::kInvalidArgument);
  EXPECT_EQ(NvmlCode(kErrorNotSupported), StatusCode::kUnimplemented);
  EXPECT_EQ(NvmlCode(kErrorNoPermission), StatusCode::kPermissionDenied);
  EXPECT_EQ(NvmlCode(kErrorLibraryNotFound), StatusCode::kNotFound);
  EXPECT_EQ(NvmlCode(kErrorTimeout), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(NvmlCode(kErrorGpuIsLost), StatusCode::kUnavailable);
  EXPECT_EQ(NvmlCode(12345), StatusCode::kUnknown);
}

}  // namespace
}  // namespace kdm::nvml
