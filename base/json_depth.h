// kdm::FindJsonDepthViolation: a linear, non-recursive scan of JSON text for
// nesting deeper than a limit, run before a recursive parser (nlohmann's
// dump() and some of its paths recurse once per level) sees text from
// outside. It counts '[' and '{' outside strings (escapes handled) and does
// not validate anything else: text it passes may still be bad JSON, for the
// parser to refuse.
//
// Thread-safety: pure functions.
//
// Example:
//   if (auto at = FindJsonDepthViolation(line, kMaxJsonDepth)) {
//     return InvalidArgumentError("nested deeper than 64 at byte " + std::to_string(*at));
//   }
#ifndef KDM_BASE_JSON_DEPTH_H_
#define KDM_BASE_JSON_DEPTH_H_

#include <cstddef>
#include <optional>
#include <string_view>
#include <vector>

namespace kdm {

// The offset of the first '[' or '{' that opens level max_depth + 1 (the
// outermost value is level 1), or nullopt when none does.
std::optional<size_t> FindJsonDepthViolation(std::string_view text, int max_depth);

// A value of `text` that opens at level `level` and nests past max_depth:
// [begin, end) are the offsets of its opening and one past its closing
// bracket (end is text.size() when it never closes); `at` is the offset of
// the bracket that went too deep.
struct JsonDeepSpan {
  size_t begin = 0;
  size_t end = 0;
  size_t at = 0;
};

// Every value opening at `level` (e.g. 3 for the items of a Kubernetes
// list: the list is 1, "items" 2) that nests deeper than max_depth, in text
// order. REQUIRES: 1 <= level <= max_depth.
std::vector<JsonDeepSpan> FindJsonDeepSpans(std::string_view text, int max_depth, int level);

}  // namespace kdm

#endif  // KDM_BASE_JSON_DEPTH_H_
