/*
 * The soak drill (soak.c): a store cluster under a long mixed load with
 * node and client kills and a hostile client in the background, its
 * servers' memory and descriptors sampled every second and required flat
 * after warm-up. Its length is an option of `kvferry drill` (--duration).
 */
#ifndef KVF_TOOLS_DRILL_SOAK_H
#define KVF_TOOLS_DRILL_SOAK_H
#if !defined(KVF_LAYER_TOOLS) && !defined(KVF_TEST_INTERNALS)
#error "tools/drill/soak.h is private to tools/"
#endif

#include "tools/drill/drill.h"

/* Length of the soak run in ms (--duration; default 60 s). */
extern unsigned kvf_drill_soak_ms;

int kvf_drill_soak(kvf_drill_t *d);

#endif
