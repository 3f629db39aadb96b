// Launching kernels in thread-block clusters: the attributes clusters of up to 16 CTAs
// and large dynamic shared memory need, how many clusters fit at once, and the launch.
#pragma once
#include <c10/cuda/CUDAException.h>
#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "check_messages.h"

namespace specops {

template <typename Kernel>
inline void allow_large_clusters(Kernel kernel, int64_t max_smem) {
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  C10_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(max_smem)));
}

// How many clusters of `cluster` CTAs fit on the GPU at once (cached per configuration):
// the persistent grid of pass 1.
template <typename Kernel>
inline int64_t resident_clusters(Kernel kernel, int threads, int cluster, size_t smem, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int64_t> cache;
  const std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), cluster, smem, device);
  auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(cluster));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  config.attrs = attribute;
  config.numAttrs = 1;
  int count = 0;
  C10_CUDA_CHECK(cudaOccupancyMaxActiveClusters(&count, kernel, &config));
  TORCH_CHECK(count > 0, "no cluster of ", num(cluster), " CTAs with ", num(static_cast<int64_t>(smem)),
              " bytes of shared memory fits on this GPU");
  return cache[key] = count;
}

// `programmatic`: a programmatic dependent launch (sm_90), which may start before the
// kernel ahead of it ends; the kernel waits for it (griddepcontrol.wait) before reading
// what that one writes.
template <typename Kernel, typename... Args>
inline void launch_clusters(Kernel kernel, int64_t clusters, int cluster, int threads, size_t smem, cudaStream_t stream,
                            bool programmatic, Args... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(clusters * cluster));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  attribute[0].id = cudaLaunchAttributeClusterDimension;
  attribute[0].val.clusterDim.x = static_cast<unsigned>(cluster);
  attribute[0].val.clusterDim.y = 1;
  attribute[0].val.clusterDim.z = 1;
  attribute[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[1].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = programmatic ? 2 : 1;
  C10_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
}

}  // namespace specops
