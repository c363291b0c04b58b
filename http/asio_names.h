// The short names of Asio, Beast and their TLS layer that http/'s two
// Beast units (server.cc, client.cc) write with. Private to http/: not
// installed, included only by .cc files of this folder, so that no public
// header names a Boost type.
#ifndef KDM_HTTP_ASIO_NAMES_H_
#define KDM_HTTP_ASIO_NAMES_H_

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace kdm::http::asio_names {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = boost::asio::ip::tcp;

}  // namespace kdm::http::asio_names

#endif  // KDM_HTTP_ASIO_NAMES_H_
