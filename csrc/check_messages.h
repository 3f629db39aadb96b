// Pieces of argument-check messages, shared by every op family's checks.
//
// Numbers go through std::to_string and shapes are "[2, 3]" built by hand, not streamed:
// an extension built by a g++ that links libstdc++ statically (the lent GPU image's
// /opt/gcc) segfaulted streaming an int64 through c10::str, its own libstdc++ copy meeting
// torch's. setup.py now links the shared runtime there (tests/test_extension_build.py);
// these pieces keep the messages free of locale-dependent formatting all the same.
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
