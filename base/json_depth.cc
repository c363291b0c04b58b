#include "kdm/base/json_depth.h"

namespace kdm {
namespace {

// Calls on_bracket(i, opening) for every '[', '{', ']' and '}' of `text`
// outside strings (escapes handled), in order, while it returns true.
template <typename OnBracket>
void ScanJsonBrackets(std::string_view text, OnBracket on_bracket) {
  bool in_string = false;
  bool escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{' || c == ']' || c == '}') {
      if (!on_bracket(i, c == '[' || c == '{')) return;
    }
  }
}

}  // namespace

std::vector<JsonDeepSpan> FindJsonDeepSpans(std::string_view text, int max_depth, int level) {
  std::vector<JsonDeepSpan> spans;
  int depth = 0;
  bool span_deep = false;
  JsonDeepSpan span;
  ScanJsonBrackets(text, [&](size_t i, bool opening) {
    if (opening) {
      ++depth;
      if (depth == level) {
        span = {i, text.size(), i};
        span_deep = false;
      }
      if (depth > max_depth) {
        if (!span_deep) span.at = i;
        span_deep = true;
        // The scan goes on counting, so that the span's end is found.
      }
    } else {
      if (depth == level && span_deep) {
        span.end = i + 1;
        spans.push_back(span);
        span_deep = false;
      }
      if (depth > 0) --depth;
    }
    return true;
  });
  if (span_deep) spans.push_back(span);  // never closed: runs to the end
  return spans;
}

std::optional<size_t> FindJsonDepthViolation(std::string_view text, int max_depth) {
  int depth = 0;
  std::optional<size_t> at;
  ScanJsonBrackets(text, [&](size_t i, bool opening) {
    if (!opening) {
      if (depth > 0) --depth;
      return true;
    }
    if (++depth > max_depth) at = i;
    return !at.has_value();
  });
  return at;
}

}  // namespace kdm
