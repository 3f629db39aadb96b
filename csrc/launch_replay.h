#pragma once
#include <pybind11/pybind11.h>

namespace specops {

// Adds specops._C.LaunchPlan (csrc/launch_replay.cpp; CUDA builds only): a recorded plan of
// Triton launches, replayed from C++.
void define_launch_replay(pybind11::module& m);

}  // namespace specops
