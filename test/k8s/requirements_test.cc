#include "kdm/k8s/requirements.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace kdm::k8s {
namespace {

using ::testing::HasSubstr;

const std::map<std::string, std::string> kNode = {
    {"cuda", "12.4"}, {"driver", "550.54.15"}, {"arch", "9.0"}, {"brand", "Tesla"}};

// The attributes struct with these values as they are, unchecked: a node's
// values may come from another writer.
DeviceAttributes Attributes(const std::map<std::string, std::string>& values) {
  DeviceAttributes out;
  for (const auto& [key, value] : values) {
    std::optional<std::string>* field = out.Field(key);
    EXPECT_NE(field, nullptr) << key;
    if (field != nullptr) *field = value;
  }
  return out;
}

Status Check(const std::vector<std::pair<std::string, std::string>>& env,
             const std::map<std::string, std::string>& node = kNode) {
  StatusOr<RequirementSet> set = ParseRequirementEnv(env);
  EXPECT_TRUE(set.ok()) << set.status();
  if (!set.ok()) return set.status();
  return CheckRequirements(*set, Attributes(node));
}

std::string ParseError(std::string_view value) {
  StatusOr<Requirement> r = ParseRequirement("NVIDIA_REQUIRE_CUDA", value);
  EXPECT_FALSE(r.ok()) << value;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("NVIDIA_REQUIRE_CUDA: "));
  return r.status().message();
}

TEST(CompareVersionsTest, NumericPartByPart) {
  EXPECT_GT(*CompareVersions("12.10", "12.9"), 0);
  EXPECT_LT(*CompareVersions("12.9", "12.10"), 0);
  EXPECT_EQ(*CompareVersions("12", "12.0"), 0);
  EXPECT_EQ(*CompareVersions("12.0.0", "12"), 0);
  EXPECT_LT(*CompareVersions("12", "12.0.1"), 0);
  EXPECT_EQ(*CompareVersions("012.04", "12.4"), 0);
  EXPECT_GT(*CompareVersions("550.54.15", "470"), 0);
  // Parts beyond 64 bits still compare by value.
  EXPECT_GT(*CompareVersions("99999999999999999999999.1", "9999999999999999999999.9"), 0);
}

TEST(CompareVersionsTest, BadVersionsAreErrors) {
  for (std::string_view bad : {"", "12.", ".12", "12..1", "12a", "v12", "-1", "1 2"}) {
    EXPECT_EQ(CompareVersions(bad, "1").status().code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_EQ(CompareVersions("1", bad).status().code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_FALSE(CompareVersions(std::string(kMaxVersionBytes + 1, '1'), "1").ok());
}

TEST(ParseRequirementTest, GroupsAndConstraints) {
  StatusOr<Requirement> r =
      ParseRequirement("NVIDIA_REQUIRE_CUDA", "cuda>=12.2 brand=tesla,driver>=470,driver<471");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->groups.size(), 2u);
  ASSERT_EQ(r->groups[0].size(), 1u);
  EXPECT_EQ(r->groups[0][0], (Constraint{"cuda", RequirementOp::kGe, "12.2", "cuda>=12.2"}));
  ASSERT_EQ(r->groups[1].size(), 3u);
  EXPECT_EQ(r->groups[1][0], (Constraint{"brand", RequirementOp::kEq, "tesla", "brand=tesla"}));
  EXPECT_EQ(r->groups[1][2], (Constraint{"driver", RequirementOp::kLt, "471", "driver<471"}));
}

TEST(ParseRequirementTest, EveryOperator) {
  std::vector<std::pair<std::string, RequirementOp>> ops = {
      {"=", RequirementOp::kEq}, {"==", RequirementOp::kEq}, {"!=", RequirementOp::kNe},
      {"<", RequirementOp::kLt}, {"<=", RequirementOp::kLe}, {">", RequirementOp::kGt},
      {">=", RequirementOp::kGe}};
  for (const auto& [text, op] : ops) {
    StatusOr<Requirement> r = ParseRequirement("V", "arch" + text + "8.0");
    ASSERT_TRUE(r.ok()) << text << ": " << r.status();
    EXPECT_EQ(r->groups[0][0].op, op) << text;
    EXPECT_EQ(r->groups[0][0].value, "8.0") << text;
  }
}

TEST(ParseRequirementTest, BlankValueIsNoRequirement) {
  for (std::string_view blank : {"", "   ", "\t \n"}) {
    StatusOr<Requirement> r = ParseRequirement("V", blank);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->groups.empty());
  }
  // Several blanks between groups are one separator.
  StatusOr<Requirement> r = ParseRequirement("V", "  cuda>=1 \t  cuda<2  ");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->groups.size(), 2u);
}

TEST(ParseRequirementTest, BadInputNamesTheToken) {
  EXPECT_THAT(ParseError("cdua>=12"), HasSubstr("unknown key 'cdua' in 'cdua>=12'"));
  EXPECT_THAT(ParseError("CUDA>=12"), HasSubstr("unknown key 'CUDA'"));
  EXPECT_THAT(ParseError(">=12"), HasSubstr("no key in '>=12'"));
  EXPECT_THAT(ParseError("cuda"), HasSubstr("no operator"));
  EXPECT_THAT(ParseError("cuda~12"), HasSubstr("no operator"));
  EXPECT_THAT(ParseError("cuda=>12"), HasSubstr("not a version: '>12' in 'cuda=>12'"));
  EXPECT_THAT(ParseError("cuda>="), HasSubstr("an empty version in 'cuda>='"));
  EXPECT_THAT(ParseError("cuda>=12."), HasSubstr("empty version part"));
  EXPECT_THAT(ParseError("cuda>=12.x"), HasSubstr("not a version: '12.x'"));
  EXPECT_THAT(ParseError("cuda>=12,,driver>1"), HasSubstr("an empty constraint in"));
  EXPECT_THAT(ParseError("cuda>=12,"), HasSubstr("an empty constraint"));
  EXPECT_THAT(ParseError(",cuda>=12"), HasSubstr("an empty constraint"));
  EXPECT_THAT(ParseError("brand>tesla"), HasSubstr("brand takes only =, == or !="));
  EXPECT_THAT(ParseError("brand="), HasSubstr("bad brand name ''"));
  EXPECT_THAT(ParseError("brand=te$la"), HasSubstr("bad brand name 'te$la'"));
  // Control bytes and quotes are not echoed as they are.
  EXPECT_THAT(ParseError(std::string("cuda>=1\x01'2")), HasSubstr("'1??2'"));
}

TEST(ParseRequirementTest, HugeValuesAreRefused) {
  std::string huge;
  while (huge.size() <= kMaxRequirementBytes) huge += "cuda>=1 ";
  EXPECT_THAT(ParseError(huge), HasSubstr("the limit is 4096"));
  // A long token is shown cut.
  std::string long_key(1000, 'a');
  std::string message = ParseError(long_key + ">=1");
  EXPECT_LT(message.size(), 400u);
  EXPECT_THAT(message, HasSubstr("..."));
}

TEST(CheckRequirementsTest, MetAndUnmet) {
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"}}).ok());
  Status s = Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=12.2"}}, {{"cuda", "11.8"}});
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(), "NVIDIA_REQUIRE_CUDA: cuda 11.8 does not satisfy cuda>=12.2");
  // 12.10 is newer than 12.9.
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_CUDA", "cuda>12.9"}}, {{"cuda", "12.10"}}).ok());
  EXPECT_FALSE(Check({{"NVIDIA_REQUIRE_CUDA", "cuda>12.10"}}, {{"cuda", "12.9"}}).ok());
}

TEST(CheckRequirementsTest, EveryOperatorAgainstTheNode) {
  struct Case {
    std::string constraint;
    bool met;
  };
  for (const Case& c : std::vector<Case>{{"cuda=12.4", true},
                                         {"cuda==12.4.0", true},
                                         {"cuda!=12.4", false},
                                         {"cuda!=12.3", true},
                                         {"cuda<12.4", false},
                                         {"cuda<12.5", true},
                                         {"cuda<=12.4", true},
                                         {"cuda>12.4", false},
                                         {"cuda>=12.4", true},
                                         {"driver>=550.54.14", true},
                                         {"driver<550.54.15", false},
                                         {"arch>=8.0", true},
                                         {"arch==8.0", false},
                                         {"brand=tesla", true},
                                         {"brand==TESLA", true},
                                         {"brand!=tesla", false},
                                         {"brand=quadro", false}}) {
    EXPECT_EQ(Check({{"NVIDIA_REQUIRE_X", c.constraint}}).ok(), c.met) << c.constraint;
  }
}

TEST(CheckRequirementsTest, CommasAndSpacesOr) {
  const std::string image = "cuda>=12.2 brand=tesla,driver>=470,driver<471";
  // First group holds.
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_CUDA", image}}).ok());
  // Second group holds.
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_CUDA", image}},
                    {{"cuda", "11.0"}, {"brand", "tesla"}, {"driver", "470.82"}})
                  .ok());
  // Neither: each group's first failure is named.
  Status s = Check({{"NVIDIA_REQUIRE_CUDA", image}},
                   {{"cuda", "11.0"}, {"brand", "tesla"}, {"driver", "471.1"}});
  EXPECT_EQ(s.message(),
            "NVIDIA_REQUIRE_CUDA: cuda 11.0 does not satisfy cuda>=12.2 or driver 471.1 does "
            "not satisfy driver<471");
}

TEST(CheckRequirementsTest, SeveralVariablesAnd) {
  EXPECT_TRUE(
      Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=12"}, {"NVIDIA_REQUIRE_ARCH", "arch>=9"}}).ok());
  Status s = Check({{"PATH", "/bin"},
                    {"NVIDIA_REQUIRE_CUDA", "cuda>=12"},
                    {"NVIDIA_REQUIRE_ARCH", "arch>=9.1"}});
  EXPECT_EQ(s.message(), "NVIDIA_REQUIRE_ARCH: arch 9.0 does not satisfy arch>=9.1");
}

TEST(CheckRequirementsTest, UnknownOrBadNodeValues) {
  Status s = Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=12"}}, {{"driver", "550"}});
  EXPECT_EQ(s.message(),
            "NVIDIA_REQUIRE_CUDA: cuda is not known on this node, required by cuda>=12");
  s = Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=12"}}, {{"cuda", "twelve\n"}});
  EXPECT_EQ(s.message(),
            "NVIDIA_REQUIRE_CUDA: cuda 'twelve?' on this node is not a version, required by "
            "cuda>=12");
  s = Check({{"NVIDIA_REQUIRE_BRAND", "brand=tesla"}}, {{"brand", "a b"}});
  EXPECT_EQ(s.message(), "NVIDIA_REQUIRE_BRAND: brand 'a b' does not satisfy brand=tesla");
}

TEST(CheckRequirementsTest, DisableRequire) {
  for (std::string_view on : {"true", "TRUE", "True", "1"}) {
    StatusOr<RequirementSet> set = ParseRequirementEnv(
        {{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}, {"NVIDIA_DISABLE_REQUIRE", std::string(on)}});
    ASSERT_TRUE(set.ok()) << set.status();
    EXPECT_TRUE(set->disabled);
    EXPECT_TRUE(CheckRequirements(*set, Attributes(kNode)).ok());
  }
  // Disabled: a malformed requirement cannot reject the container either.
  EXPECT_TRUE(
      ParseRequirementEnv({{"NVIDIA_DISABLE_REQUIRE", "true"}, {"NVIDIA_REQUIRE_CUDA", "garbage"}})
          .ok());
  for (std::string_view off : {"false", "0", "", "yes-please"}) {
    EXPECT_FALSE(
        Check({{"NVIDIA_REQUIRE_CUDA", "cuda>=99"}, {"NVIDIA_DISABLE_REQUIRE", std::string(off)}})
            .ok())
        << off;
  }
}

TEST(CheckRequirementsTest, OnlyRequireVariablesCount) {
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_", "garbage"},
                     {"NVIDIA_REQUIRED", "x"},
                     {"XNVIDIA_REQUIRE_CUDA", "cuda>=99"},
                     {"NVIDIA_REQUIRE_CUDA", ""}})
                  .ok());
  StatusOr<RequirementSet> bad = ParseRequirementEnv(
      {{"NVIDIA_REQUIRE_CUDA", "cuda>=1"}, {"NVIDIA_REQUIRE_DRIVER", "drvier>1"}});
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("NVIDIA_REQUIRE_DRIVER: unknown key 'drvier'"));
}

// Issue 28: the message named every failing alternative, so a 4 KiB value
// of 455 of them gave a 17.8 KB message, repeated for every node of an
// extender answer. The first few are named, the rest counted, and the
// message is bounded whatever the value.
TEST(CheckRequirementsTest, ManyFailingAlternativesGiveABoundedMessage) {
  std::string value;
  for (int i = 0; i < 455; ++i) value += (i ? " " : "") + std::string("cuda>=99");
  ASSERT_EQ(value.size(), 4094u);
  Status s = Check({{"NVIDIA_REQUIRE_CUDA", value}}, {{"cuda", "12.4"}});
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(s.message(),
            "NVIDIA_REQUIRE_CUDA: cuda 12.4 does not satisfy cuda>=99 or cuda 12.4 does not "
            "satisfy cuda>=99 or cuda 12.4 does not satisfy cuda>=99 or ... and 452 more "
            "alternatives");
  EXPECT_LE(s.message().size(), kMaxRequirementMessageBytes);
  // A last alternative that holds still passes.
  const std::string last_holds = value.substr(0, value.size() - 8) + "cuda>=12";
  EXPECT_TRUE(Check({{"NVIDIA_REQUIRE_CUDA", last_holds}}, {{"cuda", "12.4"}}).ok());
}

TEST(CheckRequirementsTest, AVariableNameOfAnyLengthGivesABoundedMessage) {
  // A 100 KB variable name (outside text, UTF-8) with a failing value.
  std::string name = "NVIDIA_REQUIRE_";
  while (name.size() < 100000) name += "\xc3\xa9";  // é
  Status s = Check({{name, "cuda>=99"}}, {{"cuda", "12.4"}});
  ASSERT_EQ(s.code(), StatusCode::kFailedPrecondition);
  const std::string message(s.message());
  EXPECT_LE(message.size(), kMaxRequirementMessageBytes);
  EXPECT_EQ(message.substr(0, 15), "NVIDIA_REQUIRE_");
  EXPECT_EQ(message.substr(message.size() - 3), "...");
  // Cut between characters: what is left before "..." is whole characters.
  const std::string kept = message.substr(15, message.size() - 18);
  EXPECT_EQ(kept.size() % 2, 0u);
  EXPECT_EQ(static_cast<unsigned char>(kept.front()), 0xc3);
}

}  // namespace
}  // namespace kdm::k8s
