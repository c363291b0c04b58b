#include "kdm/test/kube/test_pki.h"

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <atomic>
#include <memory>

namespace kdm::kube::test {
namespace {

struct Deleter {
  void operator()(EVP_PKEY* p) const { EVP_PKEY_free(p); }
  void operator()(X509* p) const { X509_free(p); }
  void operator()(BIO* p) const { BIO_free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter>;
using Cert = std::unique_ptr<X509, Deleter>;

Status OpenSslFailure(const char* what) {
  char buf[256];
  ERR_error_string_n(ERR_get_error(), buf, sizeof buf);
  ERR_clear_error();
  return InternalError(std::string("test PKI: ") + what + ": " + buf);
}

struct Issued {
  Key key;
  Cert cert;
};

// A new key and a certificate for it, signed by `issuer` (self-signed when
// null). `extensions` are (nid, value) pairs in openssl.cnf syntax.
StatusOr<Issued> Issue(const std::string& cn, const Issued* issuer,
                       std::initializer_list<std::pair<int, const char*>> extensions) {
  static std::atomic<long> serial{1};  // NOLINT(runtime/int): OpenSSL's type
  Key key(EVP_EC_gen("P-256"));
  if (!key) return OpenSslFailure("EC key");
  Cert cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial.fetch_add(1));
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509* issuer_cert = issuer != nullptr ? issuer->cert.get() : cert.get();
  EVP_PKEY* issuer_key = issuer != nullptr ? issuer->key.get() : key.get();
  X509_set_issuer_name(cert.get(), X509_get_subject_name(issuer_cert));
  X509_set_pubkey(cert.get(), key.get());
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_cert, cert.get(), nullptr, nullptr, 0);
  for (const auto& [nid, value] : extensions) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (ext == nullptr) return OpenSslFailure(value);
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), issuer_key, EVP_sha256()) == 0) return OpenSslFailure("sign");
  return Issued{std::move(key), std::move(cert)};
}

KeyAndCert Pem(const Issued& issued) {
  KeyAndCert out;
  std::unique_ptr<BIO, Deleter> kb(BIO_new(BIO_s_mem()));
  PEM_write_bio_PrivateKey(kb.get(), issued.key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  char* data = nullptr;
  long n = BIO_get_mem_data(kb.get(), &data);  // NOLINT(runtime/int)
  out.key_pem.assign(data, static_cast<size_t>(n));
  std::unique_ptr<BIO, Deleter> cb(BIO_new(BIO_s_mem()));
  PEM_write_bio_X509(cb.get(), issued.cert.get());
  n = BIO_get_mem_data(cb.get(), &data);
  out.cert_pem.assign(data, static_cast<size_t>(n));
  return out;
}

StatusOr<Issued> IssueCa(const std::string& cn) {
  return Issue(cn, nullptr,
               {{NID_basic_constraints, "critical,CA:TRUE"},
                {NID_key_usage, "critical,keyCertSign,cRLSign"},
                {NID_subject_key_identifier, "hash"}});
}

StatusOr<Issued> IssueServer(const Issued& ca, const char* names = "IP:127.0.0.1,DNS:localhost") {
  return Issue("kdm-test-apiserver", &ca,
               {{NID_basic_constraints, "critical,CA:FALSE"},
                {NID_key_usage, "critical,digitalSignature"},
                {NID_ext_key_usage, "serverAuth"},
                {NID_subject_alt_name, names}});
}

}  // namespace

StatusOr<TestPki> MakeTestPki() {
  KDM_ASSIGN_OR_RETURN(Issued ca, IssueCa("kdm-test-ca"));
  KDM_ASSIGN_OR_RETURN(Issued server, IssueServer(ca));
  KDM_ASSIGN_OR_RETURN(Issued client, Issue("kdm-test-client", &ca,
                                            {{NID_basic_constraints, "critical,CA:FALSE"},
                                             {NID_key_usage, "critical,digitalSignature"},
                                             {NID_ext_key_usage, "clientAuth"}}));
  KDM_ASSIGN_OR_RETURN(Issued wrong_name, IssueServer(ca, "DNS:elsewhere.example"));
  KDM_ASSIGN_OR_RETURN(Issued other_ca, IssueCa("kdm-test-other-ca"));
  KDM_ASSIGN_OR_RETURN(Issued other_server, IssueServer(other_ca));
  TestPki pki;
  pki.ca = Pem(ca);
  pki.server = Pem(server);
  pki.client = Pem(client);
  pki.wrong_name_server = Pem(wrong_name);
  pki.other_ca = Pem(other_ca);
  pki.other_server = Pem(other_server);
  return pki;
}

}  // namespace kdm::kube::test
