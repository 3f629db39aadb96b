// Pieces of argument-check messages, shared by every op family's checks.
//
// Messages never stream an integer: with torch 2.11's wheel on the lent GPU machine,
// formatting an int64 through c10::str's ostringstream segfaulted inside the extension
// (a libstdc++ num_put mismatch), while strings streamed fine. So numbers go through
// std::to_string, and shapes are "[2, 3]" built by hand.
#pragma once
#include <ATen/ATen.h>

#include <string>

namespace specops {

inline std::string num(int64_t n) { return std::to_string(n); }

inline std::string shape_str(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (d > 0) s += ", ";
    s += num(t.size(d));
  }
  return s + "]";
}

}  // namespace specops
