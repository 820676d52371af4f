/*
 * kvferry: the value types the transfer engine's API shares with the
 * library's layers below it (memory types, operation types). engine.h
 * includes it; the library's memory layer and transports include it
 * instead of engine.h.
 */
#ifndef KVFERRY_TYPES_H
#define KVFERRY_TYPES_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum kvf_mem_type {
    KVF_MEM_HOST = 0,   /* any host memory (pageable) */
    KVF_MEM_PINNED = 1, /* page-locked host memory (cudaHostAlloc etc.) */
    KVF_MEM_CUDA = 2    /* GPU memory of device `device` */
} kvf_mem_type_t;

typedef enum kvf_op_type {
    KVF_OP_READ = 0, /* remote -> local */
    KVF_OP_WRITE = 1 /* local -> remote */
} kvf_op_type_t;

#ifdef __cplusplus
}
#endif

#endif
