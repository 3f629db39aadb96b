// Reports what setup.py compiled into specops._C (set through -D flags there).
#include "build_info.h"

#include <torch/version.h>

#ifndef SPECOPS_CUDA_ARCH_LIST
#define SPECOPS_CUDA_ARCH_LIST ""
#endif
#ifndef SPECOPS_CUDA_VERSION
#define SPECOPS_CUDA_VERSION ""
#endif

namespace specops {

pybind11::dict build_info() {
  pybind11::dict info;
  pybind11::list backends;
  backends.append("cpu");
#ifdef SPECOPS_WITH_CUDA
  backends.append("cuda");
  info["with_cuda"] = true;
#else
  info["with_cuda"] = false;
#endif
  info["backends"] = backends;
  info["cuda_arch_list"] = std::string(SPECOPS_CUDA_ARCH_LIST);
  info["cuda_version"] = std::string(SPECOPS_CUDA_VERSION);
  info["torch_version"] = std::string(TORCH_VERSION);
  return info;
}

}  // namespace specops
