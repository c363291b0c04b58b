// The pure rules of kdm::conformance (validators.h) and the catalogue, table
// driven: each rule with values it must accept and values it must refuse.
#include "kdm/conformance/validators.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "kdm/conformance/check.h"

namespace kdm::conformance {
namespace {

using ::testing::HasSubstr;

struct Case {
  std::string value;
  bool ok;
};

TEST(CatalogueTest, IdsAreUniqueAndInTheAgreedOrder) {
  std::vector<std::string> ids;
  for (const CheckInfo& c : Catalogue()) {
    ids.push_back(c.id);
    EXPECT_FALSE(c.description.empty()) << c.id;
    EXPECT_THAT(c.spec_clause, HasSubstr("docs/")) << c.id;
  }
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), ids.size());
  ASSERT_EQ(ids.size(), 27u);
  EXPECT_EQ(ids.front(), "reg.version");
  EXPECT_EQ(ids[4], "lw.first-snapshot");
  // health.trigger watches stream 1 before lw.full-snapshots ends it.
  EXPECT_EQ(ids[8], "health.trigger");
  EXPECT_EQ(ids[9], "lw.full-snapshots");
  EXPECT_EQ(ids[24], "lw.stream-drop");
  // health.reconnect after lw.stream-drop (whose failure it defers to).
  EXPECT_EQ(ids[25], "health.reconnect");
  EXPECT_EQ(ids.back(), "reg.restart");
}

TEST(CatalogueTest, FindCheckAndGroup) {
  ASSERT_NE(FindCheck("alloc.permissions"), nullptr);
  EXPECT_EQ(FindCheck("alloc.permissions")->id, "alloc.permissions");
  EXPECT_EQ(FindCheck("alloc"), nullptr);
  EXPECT_EQ(FindCheck(""), nullptr);
  EXPECT_EQ(FindCheck("ALLOC.PERMISSIONS"), nullptr);
  EXPECT_EQ(CheckGroup("pref.must-include"), "pref");
  EXPECT_EQ(CheckGroup("nodot"), "nodot");
  EXPECT_EQ(VerdictName(Verdict::kPass), "PASS");
  EXPECT_EQ(VerdictName(Verdict::kFail), "FAIL");
  EXPECT_EQ(VerdictName(Verdict::kSkip), "SKIP");
}

TEST(ValidatorsTest, DeviceIds) {
  EXPECT_TRUE(CheckDeviceIds({}).ok());
  EXPECT_TRUE(CheckDeviceIds({"GPU0", "GPU1", std::string(63, 'a')}).ok());
  Status dup = CheckDeviceIds({"GPU0", "GPU1", "GPU0"});
  EXPECT_EQ(dup.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(dup.message(), HasSubstr("\"GPU0\" is listed twice"));
  EXPECT_THAT(CheckDeviceIds({"a", ""}).message(), HasSubstr("empty id"));
  EXPECT_THAT(CheckDeviceIds({std::string(64, 'a')}).message(), HasSubstr("64 characters"));
  EXPECT_FALSE(CheckDeviceIds({std::string(1 << 20, 'x')}).ok());  // huge
}

TEST(ValidatorsTest, Health) {
  for (const Case& c : std::vector<Case>{{"Healthy", true},
                                         {"Unhealthy", true},
                                         {"healthy", false},
                                         {"HEALTHY", false},
                                         {"", false},
                                         {"Healthy ", false},
                                         {std::string("Healthy\0", 8), false}}) {
    EXPECT_EQ(CheckHealth(c.value).ok(), c.ok) << "\"" << c.value << "\"";
  }
  EXPECT_THAT(CheckHealth("healthy").message(), HasSubstr("\"healthy\""));
}

TEST(ValidatorsTest, NumaNode) {
  EXPECT_TRUE(CheckNumaNode(0).ok());
  EXPECT_TRUE(CheckNumaNode(7).ok());
  EXPECT_TRUE(CheckNumaNode(INT64_MAX).ok());
  EXPECT_FALSE(CheckNumaNode(-1).ok());
  EXPECT_FALSE(CheckNumaNode(INT64_MIN).ok());
  EXPECT_THAT(CheckNumaNode(-1).message(), HasSubstr("-1"));
}

TEST(ValidatorsTest, AbsolutePaths) {
  for (const Case& c : std::vector<Case>{{"/dev/nvidia0", true},
                                         {"/", true},
                                         {"/a/..b/c", true},
                                         {"/a/b../c", true},
                                         {"/a/./b", true},
                                         {"dev/nvidia0", false},
                                         {"", false},
                                         {"./dev", false},
                                         {"/dev/../etc/shadow", false},
                                         {"/..", false},
                                         {"/a/..", false},
                                         {"../x", false}}) {
    EXPECT_EQ(CheckAbsolutePath(c.value, "host_path").ok(), c.ok) << "\"" << c.value << "\"";
  }
  EXPECT_THAT(CheckAbsolutePath("dev/nvidia0", "device spec host_path").message(),
              HasSubstr("device spec host_path \"dev/nvidia0\" is not absolute"));
}

TEST(ValidatorsTest, Permissions) {
  for (const Case& c : std::vector<Case>{{"r", true},
                                         {"rw", true},
                                         {"rwm", true},
                                         {"mwr", true},
                                         {"", false},
                                         {"rwx", false},
                                         {"rr", false},
                                         {"RW", false},
                                         {"rw ", false},
                                         {std::string(1000, 'r'), false}}) {
    EXPECT_EQ(CheckPermissions(c.value).ok(), c.ok) << "\"" << c.value << "\"";
  }
  EXPECT_THAT(CheckPermissions("rwx").message(), HasSubstr("\"x\""));
}

TEST(ValidatorsTest, EnvNames) {
  for (const Case& c : std::vector<Case>{{"NVIDIA_VISIBLE_DEVICES", true},
                                         {"a", true},
                                         {"_x", true},
                                         {"-x.y_z9", true},
                                         {".dot", true},
                                         {"1 BAD=NAME", false},
                                         {"1ABC", false},
                                         {"", false},
                                         {"A=B", false},
                                         {"A B", false},
                                         {"Ä", false},
                                         {"A\nB", false}}) {
    EXPECT_EQ(CheckEnvName(c.value).ok(), c.ok) << "\"" << c.value << "\"";
  }
  EXPECT_THAT(CheckEnvName("1 BAD=NAME").message(), HasSubstr("\"1 BAD=NAME\""));
}

TEST(ValidatorsTest, CdiNames) {
  for (const Case& c : std::vector<Case>{{"nvidia.com/gpu=GPU0", true},
                                         {"example.com/fpga=fpga-0", true},
                                         {"vendor/class=name", true},
                                         {"a-b.c/c_l.a-ss=n:a.m_e-1", true},
                                         {"gpu0", false},
                                         {"nvidia.com/gpu", false},
                                         {"nvidia.com/gpu=", false},
                                         {"/gpu=x", false},
                                         {"nvidia.com/=x", false},
                                         {"-bad.com/gpu=x", false},
                                         {"bad..com/gpu=x", false},
                                         {"nvidia.com/_gpu=x", false},
                                         {"nvidia.com/gpu=a b", false},
                                         {"nvidia.com/gpu=a/b", false},
                                         {"nvidia.com/g/pu=a", false}}) {
    EXPECT_EQ(CheckCdiName(c.value).ok(), c.ok) << "\"" << c.value << "\"";
  }
  EXPECT_THAT(CheckCdiName("gpu0").message(), HasSubstr("\"gpu0\""));
}

}  // namespace
}  // namespace kdm::conformance
