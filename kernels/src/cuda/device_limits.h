// The device attributes the persistent kernels' launchers read on every
// launch, through cudaDeviceGetAttribute: cudaGetDeviceProperties fills in
// every property of the device, some of them slowly, each time it is called.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace pipelstm {
namespace kernels {

struct DeviceLimits {
  int major = 0;                 // compute capability
  bool cooperative = false;      // can launch cooperative kernels
  int64_t smem_per_block = 0;    // the most shared memory a block may opt into, bytes
  int64_t multiprocessors = 0;
};

inline cudaError_t device_limits(int device, DeviceLimits* d) {
  int major = 0, cooperative = 0, smem = 0, sms = 0;
  cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&cooperative, cudaDevAttrCooperativeLaunch, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  d->major = major;
  d->cooperative = cooperative != 0;
  d->smem_per_block = smem;
  d->multiprocessors = sms;
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace pipelstm
