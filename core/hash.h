/*
 * The checksum hash and the seeded generator together, for files that
 * still include this name; new code includes core/checksum.h or
 * core/rng.h.
 */
#ifndef KVF_CORE_HASH_H
#define KVF_CORE_HASH_H

#include "core/checksum.h"
#include "core/rng.h"

#endif
