/*
 * mem/'s GPU interface for the transports that drive GPUs themselves:
 * the device registry, the copy engines and staged socket I/O of
 * mem/cuda/cuda.h (ucx's staging), and, with KVF_MEM_GPU_KERNELS defined
 * before the include, the kernel launches, completion slots and CUDA
 * status checks of mem/cuda/kern.h (the cuda_ipc transport, built with
 * CUDA only). mem/cuda/ itself stays private: this header is the one door
 * a transport includes, so what the transports depend on is listed here.
 */
#ifndef KVF_MEM_GPU_H
#define KVF_MEM_GPU_H
#if !defined(KVF_LAYER_MEM) && !defined(KVF_LAYER_TRANSPORT) && \
    !defined(KVF_TEST_INTERNALS)
#error "mem/gpu.h is mem/'s GPU interface, for the transports"
#endif

#define KVF_MEM_GPU_IFACE 1
#include "mem/cuda/cuda.h"
#ifdef KVF_MEM_GPU_KERNELS
#include "mem/cuda/kern.h"
#endif
#undef KVF_MEM_GPU_IFACE

#endif
