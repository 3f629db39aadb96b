#pragma once
#include <pybind11/pybind11.h>

namespace specops {

// What this build of specops._C contains, as a Python dict.
pybind11::dict build_info();

}  // namespace specops
