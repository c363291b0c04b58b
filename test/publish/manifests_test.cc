// The deploy manifests of `kdm publish` (deploy/publish/, shown in
// docs/publish.md): they parse, docs/publish.md shows each file as it is,
// and the ValidatingAdmissionPolicy that confines each node's publisher to
// the kdm.io/devices annotation of its own Node (issue 28, item 14) names
// the right kinds, service account, resources and fields. No API server runs
// here, so the CEL is checked for what it refers to, not evaluated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kdm::publish {
namespace {

using ::testing::HasSubstr;

const std::string kSourceDir = KDM_SOURCE_DIR;

std::string ReadSource(const std::string& path) {
  std::ifstream in(kSourceDir + "/" + path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::vector<YAML::Node> Documents(const std::string& path) {
  const std::string text = ReadSource(path);
  EXPECT_FALSE(text.empty()) << path;
  try {
    return YAML::LoadAll(text);
  } catch (const YAML::Exception& e) {
    ADD_FAILURE() << path << ": " << e.what();
    return {};
  }
}

// The document of `kind` in `docs`, or a null node.
YAML::Node OfKind(const std::vector<YAML::Node>& docs, const std::string& kind) {
  for (const YAML::Node& d : docs) {
    if (d["kind"] && d["kind"].as<std::string>() == kind) return d;
  }
  return YAML::Node();
}

TEST(PublishManifestsTest, EveryManifestParsesAndTheDocsShowItAsItIs) {
  const std::string docs = ReadSource("docs/publish.md");
  for (const char* path : {"deploy/publish/rbac.yaml", "deploy/publish/daemonset.yaml",
                           "deploy/publish/admission-policy.yaml"}) {
    std::vector<YAML::Node> d = Documents(path);
    EXPECT_FALSE(d.empty()) << path;
    for (const YAML::Node& doc : d) {
      EXPECT_TRUE(doc["apiVersion"] && doc["kind"] && doc["metadata"]["name"]) << path;
    }
    EXPECT_NE(docs.find(ReadSource(path)), std::string::npos)
        << "docs/publish.md does not show " << path << " as it is";
  }
  std::vector<YAML::Node> rbac = Documents("deploy/publish/rbac.yaml");
  YAML::Node sa = OfKind(rbac, "ServiceAccount");
  ASSERT_TRUE(sa) << "no ServiceAccount";
  EXPECT_EQ(sa["metadata"]["name"].as<std::string>(), "kdm-publish");
  EXPECT_EQ(sa["metadata"]["namespace"].as<std::string>(), "kdm");
}

TEST(PublishManifestsTest, AdmissionPolicyConfinesThePublisherToItsOwnNodesAnnotation) {
  std::vector<YAML::Node> docs = Documents("deploy/publish/admission-policy.yaml");
  YAML::Node policy = OfKind(docs, "ValidatingAdmissionPolicy");
  YAML::Node binding = OfKind(docs, "ValidatingAdmissionPolicyBinding");
  ASSERT_TRUE(policy) << "no ValidatingAdmissionPolicy";
  ASSERT_TRUE(binding) << "no ValidatingAdmissionPolicyBinding";
  EXPECT_EQ(policy["apiVersion"].as<std::string>(), "admissionregistration.k8s.io/v1");
  EXPECT_EQ(binding["apiVersion"].as<std::string>(), "admissionregistration.k8s.io/v1");

  // The binding denies (not only warns or audits) with this policy.
  const std::string name = policy["metadata"]["name"].as<std::string>();
  EXPECT_EQ(binding["spec"]["policyName"].as<std::string>(), name);
  ASSERT_TRUE(binding["spec"]["validationActions"].IsSequence());
  EXPECT_EQ(binding["spec"]["validationActions"][0].as<std::string>(), "Deny");
  EXPECT_EQ(policy["spec"]["failurePolicy"].as<std::string>(), "Fail");

  // Updates (a PATCH is one) of the core group's nodes, the main resource.
  YAML::Node rules = policy["spec"]["matchConstraints"]["resourceRules"];
  ASSERT_TRUE(rules.IsSequence());
  ASSERT_EQ(rules.size(), 1u);
  EXPECT_EQ(rules[0]["apiGroups"][0].as<std::string>(), "");
  EXPECT_EQ(rules[0]["resources"][0].as<std::string>(), "nodes");
  EXPECT_EQ(rules[0]["operations"][0].as<std::string>(), "UPDATE");

  // Only the publisher's service account (rbac.yaml's) is matched.
  YAML::Node conditions = policy["spec"]["matchConditions"];
  ASSERT_TRUE(conditions.IsSequence());
  ASSERT_EQ(conditions.size(), 1u);
  EXPECT_THAT(conditions[0]["expression"].as<std::string>(),
              HasSubstr("request.userInfo.username == "
                        "'system:serviceaccount:kdm:kdm-publish'"));

  // Each validation, by what it refers to.
  std::vector<std::string> expressions;
  for (const YAML::Node& v : policy["spec"]["validations"]) {
    expressions.push_back(v["expression"].as<std::string>());
    EXPECT_TRUE(v["message"] || v["messageExpression"]) << expressions.back();
  }
  auto any_with = [&](std::vector<std::string> parts) {
    for (const std::string& e : expressions) {
      bool all = true;
      for (const std::string& p : parts) all = all && e.find(p) != std::string::npos;
      if (all) return true;
    }
    return false;
  };
  // Its own Node: the name bound to the token.
  EXPECT_TRUE(any_with({"request.userInfo.extra['authentication.kubernetes.io/node-name']",
                        "== object.metadata.name", "has(request.userInfo.extra)"}));
  // No annotation but ours, in either direction (none added, none removed).
  EXPECT_TRUE(any_with({"object.metadata.annotations.all(", "oldObject.metadata.annotations.all(",
                        "k == 'kdm.io/devices'"}));
  EXPECT_TRUE(any_with({"object.metadata.labels == oldObject.metadata.labels"}));
  EXPECT_TRUE(any_with({"object.spec == oldObject.spec"}));
  EXPECT_TRUE(any_with({"object.status == oldObject.status"}));
  EXPECT_TRUE(any_with({"object.metadata.ownerReferences == oldObject.metadata.ownerReferences",
                        "object.metadata.finalizers == oldObject.metadata.finalizers"}));
  // Brackets balance in every expression (a cheap syntax check).
  for (const std::string& e : expressions) {
    int depth = 0;
    for (char c : e) {
      depth += (c == '(' || c == '[') - (c == ')' || c == ']');
      EXPECT_GE(depth, 0) << e;
    }
    EXPECT_EQ(depth, 0) << e;
  }
}

}  // namespace
}  // namespace kdm::publish
