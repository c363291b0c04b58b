// The one place where a filesystem path becomes a gRPC unix socket target.
//
// Every kdm gRPC server and every dial over a unix socket (registration,
// plugin endpoints, pod-resources, the SDK's registration dial, `kdm
// conform`, `kdm get`) passes its path through UnixSocketTarget, so that a
// path works as the user typed it: relative (`node/x.sock`, `./x.sock`),
// with `..`, with spaces, or absolute.
//
// Why not "unix://" + path: gRPC reads the first component after "unix://"
// as an authority (host name), so "unix://node/x.sock" names /x.sock on a
// host "node" and binding fails. The target used here is "unix:" followed by
// the absolute path, which gRPC reads as a path whatever the characters; the
// three characters gRPC's URI parser treats specially in a path ('%', '?',
// '#') are percent-encoded, as servers and dials both decode them.
//
// The absolute form is computed against the working directory at the time
// of the call (kdm never changes its working directory) and normalised
// lexically (`a/./b/../c` → `a/c`), as Go's filepath.Abs does: a `..` after
// a symlink is taken lexically, not through the link.
//
// A unix socket path holds at most kMaxUnixSocketPathLength (107) bytes
// (sockaddr_un.sun_path less its NUL); a longer absolute path is refused
// here with a message naming the path, its length and the limit, rather
// than by gRPC with its own text.
//
// Thread-safety: pure functions of their argument and the working directory.
//
// Example:
//   kdm::StatusOr<std::string> target = kdm::pluginapi::UnixSocketTarget("node/kubelet.sock");
//   if (!target.ok()) return target.status().WithPrefix("--root");
//   builder.AddListeningPort(*target, grpc::InsecureServerCredentials());
#ifndef KDM_PLUGINAPI_UNIX_TARGET_H_
#define KDM_PLUGINAPI_UNIX_TARGET_H_

#include <string>
#include <string_view>

#include "kdm/base/status.h"

namespace kdm::pluginapi {

// The absolute, lexically normal form of the socket path `path`, e.g.
// "node/../node/x.sock" from /home/me → "/home/me/node/x.sock".
// INVALID_ARGUMENT (message names the path) when `path` is empty, holds a
// NUL byte, names a directory (ends in "/", "." or ".."), or when its
// absolute form is longer than kMaxUnixSocketPathLength bytes
// ("<path> is N bytes, longer than the 107 bytes a unix socket path allows").
// UNAVAILABLE when the working directory cannot be read.
StatusOr<std::string> AbsoluteSocketPath(std::string_view path);

// The gRPC target of the unix socket at `path`: "unix:" + the percent-
// encoded AbsoluteSocketPath(path), for ServerBuilder::AddListeningPort and
// grpc::CreateChannel alike. Fails as AbsoluteSocketPath does.
StatusOr<std::string> UnixSocketTarget(std::string_view path);

}  // namespace kdm::pluginapi

#endif  // KDM_PLUGINAPI_UNIX_TARGET_H_
