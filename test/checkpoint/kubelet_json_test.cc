// The kubelet checkpoint codec against the golden vectors in testdata/
// (files and checksums from a real kubelet, and the exact hashed text).
#include "kdm/checkpoint/kubelet_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace kdm::checkpoint {
namespace {

using testing::Entry;
using ::testing::HasSubstr;
using testing::ReadFile;
using testing::TestdataCheckpoints;
using testing::TestdataDir;

std::string Vector(const std::string& name) { return ReadFile(TestdataDir() + "/" + name); }

TEST(KubeletJsonGolden, TestdataIsPresent) {
  std::vector<std::string> names = TestdataCheckpoints();
  EXPECT_THAT(names, ::testing::Contains("multi"));
  EXPECT_THAT(names, ::testing::Contains("one-pod"));
}

TEST(KubeletJsonGolden, RenderingMatchesTheHashedTextExactly) {
  for (std::string name : {"multi", "one-pod"}) {
    SCOPED_TRACE(name);
    StatusOr<KubeletFile> file = ParseKubeletCheckpoint(Vector(name + ".json"));
    ASSERT_TRUE(file.ok()) << file.status();
    std::string expected = Vector(name + ".rendering.txt");
    while (!expected.empty() && expected.back() == '\n') expected.pop_back();
    EXPECT_EQ(RenderKubeletData(file->data), expected);
    EXPECT_EQ(Fnv32a(expected), file->checksum);
  }
}

TEST(KubeletJsonGolden, EveryVectorDecodesWithItsChecksumVerified) {
  for (const std::string& name : TestdataCheckpoints()) {
    SCOPED_TRACE(name);
    StatusOr<KubeletFile> file = ParseKubeletCheckpoint(Vector(name + ".json"));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(KubeletChecksum(file->data), file->checksum);
    StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(Vector(name + ".json"));
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_FALSE(data->entries.empty());
  }
}

TEST(KubeletJsonGolden, ReEncodingAVectorGivesBackTheSameBytes) {
  // The vectors are in the kubelet's canonical form, sorted by key, so the
  // encoder must reproduce them byte for byte.
  for (const std::string& name : TestdataCheckpoints()) {
    SCOPED_TRACE(name);
    std::string original = Vector(name + ".json");
    while (!original.empty() && original.back() == '\n') original.pop_back();
    StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(original);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ(EncodeKubeletCheckpoint(*data), original);
  }
}

TEST(KubeletJsonGolden, MultiDecodesToTheExpectedEntries) {
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(Vector("multi.json"));
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_EQ(data->entries.size(), 3u);
  EXPECT_EQ(data->entries[0], Entry("uid-a", "init", "example.com/fpga", {{-1, {"fpga-1"}}}, ""));
  EXPECT_EQ(data->entries[1],
            Entry("uid-a", "main", "nvidia.com/gpu", {{0, {"GPU-1"}}, {1, {"GPU-5", "GPU-4"}}},
                  std::string("\x22\x00", 2)));
  EXPECT_EQ(data->entries[2].alloc_response.size(), 34u);
  EXPECT_EQ(data->registered_devices.at("nvidia.com/gpu"),
            (std::vector<std::string>{"GPU-0", "GPU-1", "GPU-2", "GPU-4", "GPU-5"}));
  EXPECT_EQ(data->boot_id, "");
}

TEST(KubeletJsonEncode, EncodedOutputAlwaysVerifies) {
  CheckpointData data;
  data.entries.push_back(Entry("p<1>", "c&\"q\"\n", "r/x", {{10, {"a"}}, {2, {"b"}}, {-1, {}}},
                               std::string("\x00\xff\x10", 3)));
  data.entries.push_back(Entry("p2", "c", "r/x", {}, ""));
  data.registered_devices["r/x"] = {"a", "b", "\u2028"};
  data.registered_devices["empty/r"] = {};
  std::string text = EncodeKubeletCheckpoint(data);
  StatusOr<CheckpointData> back = DecodeKubeletCheckpoint(text);
  ASSERT_TRUE(back.ok()) << back.status() << "\n" << text;
  EXPECT_EQ(back->entries, data.entries);
  EXPECT_EQ(back->registered_devices, data.registered_devices);
}

TEST(KubeletJsonEncode, WritesWhatGoWrites) {
  CheckpointData data;
  data.entries.push_back(Entry("u", "c<&>", "r", {{10, {"a"}}, {2, {"b"}}, {-1, {"z"}}}, "\x01"));
  std::string text = EncodeKubeletCheckpoint(data);
  // Map keys sorted as strings, HTML characters escaped, base64 padded.
  EXPECT_THAT(text, HasSubstr(R"("DeviceIDs":{"-1":["z"],"10":["a"],"2":["b"]})"));
  EXPECT_THAT(text, HasSubstr(R"("ContainerName":"c\u003c\u0026\u003e")"));
  EXPECT_THAT(text, HasSubstr(R"("AllocResp":"AQ==")"));
  EXPECT_THAT(text, HasSubstr(R"("RegisteredDevices":{})"));
}

TEST(KubeletJsonEncode, EmptyStateIsNullEntriesAndEmptyRegistered) {
  std::string text = EncodeKubeletCheckpoint(CheckpointData{});
  KubeletData expected;
  expected.registered_devices.emplace();
  EXPECT_EQ(text, R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":)" +
                      std::to_string(KubeletChecksum(expected)) + "}");
  EXPECT_EQ(RenderKubeletData(expected),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint."
            "PodDevicesEntry)<nil> "
            "RegisteredDevices:(map[string][]string)map[]}");
  EXPECT_TRUE(DecodeKubeletCheckpoint(text).ok());
}

TEST(KubeletJsonEncode, InvalidUtf8IsWrittenAndHashedAsReplacementCharacters) {
  CheckpointData data;
  data.entries.push_back(Entry("bad\xff", "c", "r", {{0, {"id\xc3"}}}));
  std::string text = EncodeKubeletCheckpoint(data);
  EXPECT_THAT(text, HasSubstr(R"("PodUID":"bad\ufffd")"));
  StatusOr<CheckpointData> back = DecodeKubeletCheckpoint(text);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->entries[0].pod_uid, "bad\xEF\xBF\xBD");
}

TEST(KubeletJsonRender, NullsAndEmptiesRenderDifferently) {
  KubeletData data;
  KubeletEntry e;
  e.pod_uid = "u";
  e.device_ids.emplace();
  (*e.device_ids)[-1] = std::nullopt;
  (*e.device_ids)[3] = std::vector<std::string>{};
  data.entries = std::vector<KubeletEntry>{e, KubeletEntry{}};
  data.registered_devices.emplace();
  (*data.registered_devices)["b"] = std::nullopt;
  (*data.registered_devices)["a"] = std::vector<std::string>{"x"};
  EXPECT_EQ(RenderKubeletData(data),
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint."
            "PodDevicesEntry)["
            "{PodUID:(string)u ContainerName:(string) ResourceName:(string) "
            "DeviceIDs:(checkpoint.DevicesPerNUMA)map[-1:<nil> 3:[]] "
            "AllocResp:([]uint8)<nil>} "
            "{PodUID:(string) ContainerName:(string) ResourceName:(string) "
            "DeviceIDs:(checkpoint.DevicesPerNUMA)<nil> AllocResp:([]uint8)<nil>}] "
            "RegisteredDevices:(map[string][]string)map[a:[x] b:<nil>]}");
}

TEST(KubeletJsonDecode, NullsAreKeptForTheChecksum) {
  std::string json =
      R"({"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"r",)"
      R"("DeviceIDs":{"0":null},"AllocResp":null}],"RegisteredDevices":null},"Checksum":0})";
  StatusOr<KubeletFile> file = ParseKubeletCheckpoint(json);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_FALSE(file->data.registered_devices.has_value());
  EXPECT_FALSE((*file->data.entries)[0].alloc_response.has_value());
  EXPECT_FALSE((*file->data.entries)[0].device_ids->at(0).has_value());
  std::string fixed =
      json.substr(0, json.size() - 2) + std::to_string(KubeletChecksum(file->data)) + "}";
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(fixed);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->entries[0].device_ids.at(0), std::vector<std::string>{});
}

TEST(KubeletJsonDecode, NullFileIsEmpty) {
  std::string json = R"({"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":)" +
                     std::to_string(KubeletChecksum(KubeletData{})) + "}";
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(json);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(*data, CheckpointData{});
}

TEST(KubeletJsonDecode, BadChecksumNamesBothValues) {
  std::string json = Vector("one-pod.json");
  size_t at = json.find("4138818769");
  ASSERT_NE(at, std::string::npos);
  json.replace(at, 10, "4138818768");
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(json);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(data.status().message(), HasSubstr("4138818768"));
  EXPECT_THAT(data.status().message(), HasSubstr("4138818769"));
  EXPECT_TRUE(DecodeKubeletCheckpoint(json, /*verify_checksum=*/false).ok());
}

TEST(KubeletJsonDecode, ChangedDataFailsTheChecksum) {
  std::string json = Vector("multi.json");
  size_t at = json.find("GPU-5");
  json.replace(at, 5, "GPU-6");
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(json);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("checksum mismatch"));
}

TEST(KubeletJsonDecode, BadBase64NamesTheEntryAndTheByte) {
  std::string json = Vector("multi.json");
  size_t at = json.find("\"IgA=\"");
  json.replace(at, 6, "\"Ig!=\"");
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(json, /*verify_checksum=*/false);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("Data.PodDeviceEntries[1].AllocResp"));
  EXPECT_THAT(data.status().message(), HasSubstr("byte 2"));
}

struct BadCase {
  const char* name;
  std::string json;
  const char* want;  // a substring of the error
};

TEST(KubeletJsonDecode, WrongTypesNameTheField) {
  const BadCase cases[] = {
      {"top level array", "[1]", "top level: expected an object, got array"},
      {"Data string", R"({"Data":"x"})", "Data: expected an object, got string"},
      {"entries object", R"({"Data":{"PodDeviceEntries":{}}})",
       "Data.PodDeviceEntries: expected a list"},
      {"entry number", R"({"Data":{"PodDeviceEntries":[5]}})",
       "Data.PodDeviceEntries[0]: expected an object"},
      {"PodUID number", R"({"Data":{"PodDeviceEntries":[{"PodUID":5}]}})",
       "Data.PodDeviceEntries[0].PodUID: expected a string, got number"},
      {"DeviceIDs list", R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":[]}]}})",
       "Data.PodDeviceEntries[0].DeviceIDs: expected an object"},
      {"NUMA key", R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":{"zero":["a"]}}]}})",
       "key \"zero\" is not a NUMA node number"},
      {"ids string", R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":"a"}}]}})",
       "Data.PodDeviceEntries[0].DeviceIDs[\"0\"]: expected a list of strings, "
       "got string"},
      {"id number", R"({"Data":{"PodDeviceEntries":[{"DeviceIDs":{"0":["a",7]}}]}})",
       "Data.PodDeviceEntries[0].DeviceIDs[\"0\"][1]: expected a string, got "
       "number"},
      {"AllocResp number", R"({"Data":{"PodDeviceEntries":[{"AllocResp":12}]}})",
       "Data.PodDeviceEntries[0].AllocResp: expected a base64 string"},
      {"registered list", R"({"Data":{"RegisteredDevices":[]}})",
       "Data.RegisteredDevices: expected an object"},
      {"registered id", R"({"Data":{"RegisteredDevices":{"r":[true]}}})",
       "Data.RegisteredDevices[\"r\"][0]: expected a string, got boolean"},
      {"checksum negative", R"({"Checksum":-1})", "Checksum: expected an unsigned integer"},
      {"checksum float", R"({"Checksum":1.5})", "Checksum: expected an unsigned integer"},
      {"checksum string", R"({"Checksum":"1"})",
       "Checksum: expected an unsigned integer, got string"},
  };
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(c.json, /*verify_checksum=*/false);
    ASSERT_FALSE(data.ok());
    EXPECT_EQ(data.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(), HasSubstr(c.want));
  }
}

TEST(KubeletJsonDecode, TruncatedFilesAreRejectedAtEveryLength) {
  std::string json = Vector("multi.json");
  while (!json.empty() && json.back() == '\n') json.pop_back();
  for (size_t n = 0; n < json.size(); ++n) {
    StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(json.substr(0, n));
    ASSERT_FALSE(data.ok()) << "length " << n;
    if (n > 0) {
      EXPECT_THAT(data.status().message(), HasSubstr("not valid JSON")) << "length " << n;
    }
  }
}

TEST(KubeletJsonDecode, GarbageIsAClearError) {
  StatusOr<CheckpointData> data = DecodeKubeletCheckpoint(std::string("\x00\x01\xfe garbage", 11));
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(), HasSubstr("not valid JSON"));
}

TEST(KubeletJsonDecode, FieldNamesMatchCaseInsensitivelyAsInGo) {
  StatusOr<KubeletFile> file =
      ParseKubeletCheckpoint(R"({"data":{"poddeviceentries":[{"poduid":"u"}]},"checksum":7})");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file->data.entries)[0].pod_uid, "u");
  EXPECT_EQ(file->checksum, 7u);
}

TEST(Base64, RoundTripsEveryLength) {
  std::string bytes;
  for (int n = 0; n < 40; ++n) {
    StatusOr<std::string> back = Base64Decode(Base64Encode(bytes));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, bytes);
    bytes += static_cast<char>(n * 37 + 200);
  }
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(Base64Encode("foob"), "Zm9vYg==");
}

TEST(Base64, SkipsNewlinesLikeGo) {
  StatusOr<std::string> out = Base64Decode("Zm9v\r\nYmFy\n");
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, "foobar");
}

TEST(Base64, RejectsBadInputNamingTheByte) {
  struct {
    const char* text;
    const char* want;
  } const cases[] = {
      {"Zm9vY", "byte 5: input ends inside a 4-character group"},
      {"Zm9", "input ends inside"},
      {"Zm=v", "byte 2: unexpected '='"},
      {"Z===", "byte 1: unexpected '='"},
      {"Zg==Zg==", "byte 2: unexpected '='"},
      {"Zm9v-A==", "byte 4: '-' is not in the base64 alphabet"},
      {"Zm9v YmFy", "byte 4: ' ' is not in the base64 alphabet"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.text);
    StatusOr<std::string> out = Base64Decode(c.text);
    ASSERT_FALSE(out.ok());
    EXPECT_THAT(out.status().message(), HasSubstr(c.want));
  }
}

TEST(Fnv32a, KnownValues) {
  EXPECT_EQ(Fnv32a(""), 2166136261u);
  EXPECT_EQ(Fnv32a("a"), 0xe40c292cu);
  EXPECT_EQ(Fnv32a("foobar"), 0xbf9cf968u);
}

// Found with the fuzz finding PodManifestRegression.JsonTextAfterNulByteIgnored
// (fuzz/regressions/kubelet_checkpoint/text-after-nul-byte-ignored):
// nlohmann's parser stops at a NUL byte, so a checkpoint with anything after
// one decoded as if the rest were not there; the kubelet's Go decoder
// refuses such a file.
TEST(KubeletJsonRegression, TextAfterNulByteIgnored) {
  const std::string good = EncodeKubeletCheckpoint(CheckpointData{});
  ASSERT_TRUE(DecodeKubeletCheckpoint(good).ok());
  const std::string bad = good + std::string("\0{\"Data\":", 9);
  auto decoded = DecodeKubeletCheckpoint(bad);
  ASSERT_FALSE(decoded.ok());
  EXPECT_EQ(decoded.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(decoded.status().message().find("NUL byte at offset " + std::to_string(good.size())),
            std::string::npos)
      << decoded.status();
}

}  // namespace
}  // namespace kdm::checkpoint
