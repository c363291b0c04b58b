#include "kdm/base/json_depth.h"

namespace kdm {

std::vector<JsonDeepSpan> FindJsonDeepSpans(std::string_view text, int max_depth, int level) {
  std::vector<JsonDeepSpan> spans;
  int depth = 0;
  bool in_string = false;
  bool escaped = false;
  bool span_deep = false;
  JsonDeepSpan span;
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
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
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
        break;
      case ']':
      case '}':
        if (depth == level && span_deep) {
          span.end = i + 1;
          spans.push_back(span);
          span_deep = false;
        }
        if (depth > 0) --depth;
        break;
      default:
        break;
    }
  }
  if (span_deep) spans.push_back(span);  // never closed: runs to the end
  return spans;
}

std::optional<size_t> FindJsonDepthViolation(std::string_view text, int max_depth) {
  int depth = 0;
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
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

}  // namespace kdm
