// The Kubernetes name rules (k8s/names.h): DNS-1123 labels and subdomains,
// qualified name parts, extended resource names.
#include "kdm/k8s/names.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kdm::k8s {
namespace {

TEST(NamesTest, ExtendedResourceNames) {
  for (std::string ok : std::vector<std::string>{
           "vendor.com/gpu", "nvidia.com/gpu", "a/b", "x.y.z/A_b-c.D",
           "example.com/" + std::string(63, 'g'), std::string(253, 'v') + "/gpu"}) {
    EXPECT_TRUE(IsExtendedResourceName(ok)) << ok;
  }
  for (std::string bad : std::vector<std::string>{
           "", "gpu", "/gpu", "vendor.com/", "kubernetes.io/gpu", "x.kubernetes.io/gpu",
           "requests.vendor.com/gpu", "Vendor.com/gpu", "vendor.com/-gpu", "vendor.com/gpu.",
           "vendor.com/a/b", "vendor..com/gpu", "vendor.com./gpu", "-v.com/gpu", "v_x.com/gpu",
           "vendor.com/g pu", "example.com/" + std::string(64, 'g'),
           std::string(254, 'v') + "/gpu"}) {
    EXPECT_FALSE(IsExtendedResourceName(bad)) << bad;
  }
}

TEST(NamesTest, Dns1123Labels) {
  for (std::string ok : std::vector<std::string>{"a", "0", "default", "ml-team", "a-1-b",
                                                 std::string(kMaxDns1123LabelLength, 'n')}) {
    EXPECT_TRUE(IsDns1123Label(ok)) << ok;
  }
  for (std::string bad : std::vector<std::string>{"", "-a", "a-", "A", "mL", "a.b", "a_b", "a b",
                                                  "a/b", "é", std::string("a\0b", 3),
                                                  std::string(kMaxDns1123LabelLength + 1, 'n')}) {
    EXPECT_FALSE(IsDns1123Label(bad)) << bad;
  }
}

TEST(NamesTest, Dns1123Subdomains) {
  // No limit per dot-separated part, only on the whole (as in Kubernetes).
  for (std::string ok :
       std::vector<std::string>{"a", "pod-1", "a.b.c", "vendor.com", std::string(70, 'p') + ".x",
                                std::string(kMaxDns1123SubdomainLength, 'p')}) {
    EXPECT_TRUE(IsDns1123Subdomain(ok)) << ok;
  }
  for (std::string bad : std::vector<std::string>{
           "", ".", "a.", ".a", "a..b", "-a.b", "a-.b", "a.-b", "A.b", "a_b", "a b",
           std::string("a.\0b", 4), std::string(kMaxDns1123SubdomainLength + 1, 'p')}) {
    EXPECT_FALSE(IsDns1123Subdomain(bad)) << bad;
  }
}

TEST(NamesTest, QualifiedNameParts) {
  for (std::string ok : std::vector<std::string>{"gpu", "G", "A_b-c.D", "0x",
                                                 std::string(kMaxQualifiedNamePartLength, 'g')}) {
    EXPECT_TRUE(IsQualifiedNamePart(ok)) << ok;
  }
  for (std::string bad : std::vector<std::string>{
           "", "_g", "g_", ".g", "g.", "-g", "g-", "g/h", "g h", "g:h", std::string("g\0h", 3),
           std::string(kMaxQualifiedNamePartLength + 1, 'g')}) {
    EXPECT_FALSE(IsQualifiedNamePart(bad)) << bad;
  }
}

}  // namespace
}  // namespace kdm::k8s
