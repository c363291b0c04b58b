// kdm::kube::test: certificates made at test time with OpenSSL's API (no key
// is ever committed): a CA, a server certificate it signs for 127.0.0.1 and
// localhost, a client certificate it signs (mTLS), and a second, unrelated
// CA with its own server certificate (a server the client must refuse).
//
// Keys are EC P-256 (fast to make); certificates are valid from an hour ago
// for a day. Thread-safety: plain values.
//
// Example:
//   StatusOr<TestPki> pki = MakeTestPki();
//   options.cert_pem = pki->server.cert_pem;
#ifndef KDM_TEST_KUBE_TEST_PKI_H_
#define KDM_TEST_KUBE_TEST_PKI_H_

#include <string>

#include "kdm/base/status.h"

namespace kdm::kube::test {

struct KeyAndCert {
  std::string key_pem;
  std::string cert_pem;
};

struct TestPki {
  KeyAndCert ca;
  KeyAndCert server;             // signed by ca; SAN IP:127.0.0.1, DNS:localhost
  KeyAndCert client;             // signed by ca; CN kdm-test-client, clientAuth
  KeyAndCert wrong_name_server;  // signed by ca; SAN DNS:elsewhere.example only
  KeyAndCert other_ca;
  KeyAndCert other_server;  // signed by other_ca; same names as server
};

StatusOr<TestPki> MakeTestPki();

}  // namespace kdm::kube::test

#endif  // KDM_TEST_KUBE_TEST_PKI_H_
