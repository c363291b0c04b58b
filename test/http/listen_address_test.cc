// ParseListenAddress: what HOST:PORT means for every kdm server, and the
// error each malformed address gets.
#include "kdm/http/listen_address.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace kdm::http {
namespace {

using ::testing::HasSubstr;

TEST(ParseListenAddressTest, ReadsIpv4BracketedIpv6LocalhostNamesAndAnEmptyHost) {
  struct Case {
    std::string text, host;
    uint16_t port;
  };
  for (const Case& c :
       {Case{"127.0.0.1:8080", "127.0.0.1", 8080}, Case{"[::1]:0", "::1", 0},
        Case{"[fe80::1:2]:65535", "fe80::1:2", 65535}, Case{"localhost:9400", "127.0.0.1", 9400},
        Case{"node-1.example.com:443", "node-1.example.com", 443}, Case{":8888", "0.0.0.0", 8888},
        Case{"0.0.0.0:00080", "0.0.0.0", 80}}) {
    auto a = ParseListenAddress(c.text);
    ASSERT_TRUE(a.ok()) << c.text << ": " << a.status();
    EXPECT_EQ(a->host, c.host) << c.text;
    EXPECT_EQ(a->port, c.port) << c.text;
  }
  EXPECT_EQ(ParseListenAddress("[::1]:80")->ToString(), "[::1]:80");
  EXPECT_EQ(ParseListenAddress("127.0.0.1:0")->ToString(), "127.0.0.1:0");
}

// Each bad address, and the words its error must contain.
struct BadAddress {
  std::string text;
  std::string why;
};

void ExpectRefused(const std::vector<BadAddress>& cases) {
  for (const BadAddress& c : cases) {
    auto a = ParseListenAddress(c.text, "--listen");
    ASSERT_FALSE(a.ok()) << c.text;
    EXPECT_EQ(a.status().code(), StatusCode::kInvalidArgument) << c.text;
    const std::string m(a.status().message());
    EXPECT_THAT(m, HasSubstr("--listen \"" + c.text + "\"")) << c.text;
    EXPECT_THAT(m, HasSubstr(c.why)) << c.text;
    EXPECT_THAT(m, HasSubstr("want HOST:PORT")) << c.text;
  }
}

TEST(ParseListenAddressTest, GarbageIsRefused) {
  ExpectRefused({{"", "is empty"},
                 {"nonsense", "has no port"},
                 {"\x01\x02:80", "neither an IP address nor a DNS name"},
                 {"a b:80", "neither an IP address nor a DNS name"},
                 {"-bad-.example:80", "neither an IP address nor a DNS name"},
                 {"host..x:80", "neither an IP address nor a DNS name"},
                 {"[::1]x:80", "has no port"}});
}

TEST(ParseListenAddressTest, AMissingPortIsRefused) {
  ExpectRefused({{"127.0.0.1", "has no port"},
                 {"127.0.0.1:", "has no port"},
                 {"[::1]", "has no port"},
                 {"[::1]:", "has no port"},
                 {"[::1", "no closing ']'"}});
}

TEST(ParseListenAddressTest, PortsOutside0To65535AreRefused) {
  ExpectRefused({{"127.0.0.1:65536", "invalid port"},
                 {"127.0.0.1:99999", "invalid port"},
                 {"127.0.0.1:4294967297", "invalid port"},
                 {"127.0.0.1:-1", "invalid port"},
                 {"127.0.0.1:+80", "invalid port"},
                 {"127.0.0.1:9x", "invalid port"},
                 {"127.0.0.1: 80", "invalid port"}});
}

TEST(ParseListenAddressTest, Ipv6NeedsBrackets) {
  ExpectRefused({{"::1:80", "needs brackets around an IPv6 host"},
                 {":::80", "needs brackets around an IPv6 host"},
                 {"fe80::1:8080", "needs brackets around an IPv6 host"},
                 {"[127.0.0.1]:80", "not an IPv6 address"},
                 {"[localhost]:80", "not an IPv6 address"}});
}

TEST(ParseListenAddressTest, EmptyHostsOtherThanTheAllInterfacesFormAreRefused) {
  // ":PORT" means every interface; an empty host in any other form is an error.
  ExpectRefused({{":", "has no port"}, {"[]:80", "empty IPv6 address"}});
}

TEST(ParseListenAddressTest, ALongAddressIsCutInTheError) {
  const std::string text(10'000, 'a');
  auto a = ParseListenAddress(text);
  ASSERT_FALSE(a.ok());
  EXPECT_LT(a.status().message().size(), 400u);
  EXPECT_THAT(std::string(a.status().message()), HasSubstr("listen address \"aaaa"));
}

}  // namespace
}  // namespace kdm::http
